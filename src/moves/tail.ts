import type pg from 'pg';
import { CONTROL, CONTROL_SCHEMA } from '../fleet/control.js';
import { retryLockWaits, runTransaction } from '../pg/quiet.js';
import { dropUnusedFenceGuardsSql } from './sql/leftovers.js';
import { disableTriggerIfFreeSql, dropTriggerIfFreeSql } from './sql/locks.js';
import { deltaFunctionPrefix, DELTA_TRIGGERS, TRACK_TRIGGERS } from './sql/names.js';
import {
  DELTA_FUNCTIONS_SQL,
  DELTAS_DONE_SQL,
  logsOffSql,
  startSourceDeltasSql,
  type LoggedTable,
  READ_CHANGES_SQL,
  READ_LOG_SUMS_SQL,
  stopTrackingSql,
  TAIL_MAX_KEYS,
} from './sql/tail.js';
import { relationExists, shardTriggers } from './catalog.js';

/**
 * Verification of a wave in two parts, so that what runs while writes are blocked grows with the
 * rows written during the cut-over, not with the size of the shards.
 *
 * Before the fence: triggers on the target record the key of every row any write touches from now
 * on (sql/move_tracking.sql), change logs (below) start on the source's copies of every table;
 * then a REPEATABLE READ transaction on each host takes a snapshot (P) and the count and checksum
 * of every table as of P are computed.
 *
 * While fenced and caught up, each host's figure of a table comes from what that host saw itself.
 * The target's, for a keyed table: K, the keys recorded on the target, holds every key that
 * changed there since P (every write since the triggers exist is recorded, the apply worker's and
 * any other's), so its count and checksum now are
 *   at P  -  (rows with a key in K, at P)  +  (rows with a key in K, now)
 * and only rows with a key in K are read: by key lookups in P's transaction and in a fresh one.
 * The identity holds for any K that contains every changed key, so a recorded key too many (a write
 * before P, a rolled-back one) costs a lookup and nothing else. The source's, from its change log:
 * every change it committed after P, whether or not replication delivered it. A change the source
 * committed after P that replication lost leaves no key in K, but is in the source's figure: the
 * two differ. (Without the source's logs, the source's figure is computed by key from K as well,
 * which cannot see that loss.)
 *
 * Change logs (sql/move_deltas.sql): triggers, created before P, log for every row a write touches
 * the checksum's hash of the row as it was (-1) and as it is (+1), and a TRUNCATE. A log entry
 * commits with its change, so the entries visible now and not in P are exactly the changes
 * committed after P, and per host
 *   count and checksum now = at P + (sums of the log now - sums of the log at P)
 * or, when a TRUNCATE was logged after P, the sums of the entries after the last TRUNCATE in seq
 * order (a TRUNCATE holds ACCESS EXCLUSIVE until it commits, so its table's entries after it in seq
 * order were written after it). Tables without such a key (no primary key or replica-identity
 * index, or a key of a type whose JSON form might not read back exactly) are logged on both hosts,
 * keyed tables on the source only. On the source the triggers run in application transactions,
 * during the cut-over only (the first wave's large tables: from the copy's slot on, copy-logs.ts):
 * every unfence switches them off (with no table lock, logsOffSql); after
 * a switch the old copy refuses every write, and the clean-up switches its logs off.
 *
 * Partitions are verified one by one (each is an ordinary table, by key or from its log); a
 * partitioned parent holds no rows of its own. Checksummed whole while fenced: a keyed table
 * truncated during the cut-over on the target (it holds only rows written since the truncate,
 * which followed the catch-up before the fence), one with more than TAIL_MAX_KEYS recorded keys
 * (on both hosts when the source has no log), and every table without a key when the logs could
 * not be set up (the source's tables kept busy).
 */

/**
 * Removes the tracking of `schemas` on the target: its triggers (whatever run created them) and this
 * move's recorded keys. Runs before a wave switches, and again at clean-up: a trigger left on a
 * live table would record every application write.
 */
export async function stopTracking(client: pg.Client, moveId: string, schemas: readonly string[]): Promise<void> {
  const triggers = await shardTriggers(client, schemas, TRACK_TRIGGERS);
  const exists = await relationExists(client, `${CONTROL}.move_changes`);
  if (triggers.length === 0 && !exists) return;
  await runTransaction(client, stopTrackingSql(moveId, triggers, exists));
}

/**
 * The change logs of `schemas` off (whatever run created them) and this move's log entries gone:
 * every log function their triggers call is replaced by one that does nothing (logsOffSql), which
 * takes no lock on any table, so that neither a reader nor a TRUNCATE queued behind one holds it
 * up. Then, unless `drop` is false, the triggers go where their tables let them (dropLogTriggers,
 * a round trip or two per trigger); one left calls the function that does nothing, and the next
 * set-up replaces it. Returns the triggers found.
 */
export async function stopDeltas(
  client: pg.Client,
  moveId: string,
  schemas: readonly string[],
  { drop = true }: { readonly drop?: boolean } = {},
): Promise<LogTrigger[]> {
  const triggers = await shardTriggers(client, schemas, DELTA_TRIGGERS);
  const exists = await relationExists(client, `${CONTROL}.move_deltas`);
  if (triggers.length === 0 && !exists) return triggers;
  await runTransaction(client, logsOffSql(logFunctions(triggers), moveId, exists));
  if (drop) await dropLogTriggers(client, triggers);
  return triggers;
}

/** A change-log trigger as shardTriggers reads it. */
type LogTrigger = Awaited<ReturnType<typeof shardTriggers>>[number];

/**
 * Change-log triggers whose logs are off (stopDeltas) dropped, each if its table is free at once,
 * else disabled if no writer holds it at once; one left calls the function that does nothing.
 */
export async function dropLogTriggers(client: pg.Client, triggers: readonly LogTrigger[]): Promise<void> {
  for (const r of triggers) {
    const dropped = await runTransaction(client, dropTriggerIfFreeSql(r.schema, r.table, r.trigger)).then(
      () => true,
      () => false,
    );
    if (!dropped && r.enabled)
      await runTransaction(client, disableTriggerIfFreeSql(r.schema, r.table, r.trigger)).catch(() => undefined);
  }
}

/** The change-log functions (in the control schema) that enabled triggers among `triggers` call, each once. */
function logFunctions(
  triggers: readonly { readonly enabled: boolean; readonly calls: readonly [string, string] }[],
): [string, string][] {
  const names = new Set(triggers.filter((t) => t.enabled && t.calls[0] === CONTROL_SCHEMA).map((t) => t.calls[1]));
  return [...names].map((name) => [CONTROL_SCHEMA, name]);
}

/**
 * The change logs of `tables` on the source, table by table (startSourceDeltasSql): each lock wait
 * bounded by `lockWaitMs`; after one ran out, the tables not done yet are tried again, until
 * `limitMs` has passed (checked between attempts: one attempt may wait up to `lockWaitMs` per
 * table). Throws the last lock wait's error past that; the tables done keep their triggers (the
 * caller removes them, stopDeltas). A table that had this move's triggers before (a killed run's)
 * is never taken as done by this set-up: its CREATE TRIGGER must run, and wait out the writers
 * that may still call the function as it was. `keepEntries`: the move's log entries are kept (the
 * logs have run since the copy: copy-logs.ts).
 */
export async function startSourceDeltas(
  client: pg.Client,
  moveId: string,
  tables: readonly LoggedTable[],
  lockWaitMs: number,
  limitMs: number,
  wave = 0,
  keepEntries = false,
): Promise<void> {
  const schemas = [...new Set(tables.map((t) => t.table.schema))];
  const done = async (): Promise<Set<string>> =>
    new Set(
      (
        await client.query<{ schema: string; table: string }>(DELTAS_DONE_SQL, [schemas, moveId, DELTA_TRIGGERS])
      ).rows.map((r) => `${r.schema}.${r.table}`),
    );
  const before = await done();
  let left = tables;
  let keep = keepEntries;
  await retryLockWaits(async () => {
    try {
      await runTransaction(client, startSourceDeltasSql(moveId, left, lockWaitMs, wave, keep));
    } catch (error) {
      const now = await done();
      left = left.filter((t) => {
        const name = `${t.table.schema}.${t.table.table}`;
        return !now.has(name) || before.has(name);
      });
      // The tables done keep their entries, start markers among them: the log's first transaction
      // (first in the string) is not sent again to delete them. Had it failed itself, the entries
      // it did not delete change no sum (the figures take differences between snapshots).
      keep = true;
      throw error;
    }
  }, performance.now() + limitMs);
}

/**
 * Every change log of the move off on one host and its entries gone, its triggers left as they
 * are: at the clean-up, for the logs the source's old copies keep (they refuse every write), and
 * any trigger a busy table kept on the target. No table lock (logsOffSql).
 */
export async function endLogs(client: pg.Client, moveId: string): Promise<void> {
  const [functions, exists] = await Promise.all([
    client.query<{ proname: string }>(DELTA_FUNCTIONS_SQL, [CONTROL_SCHEMA, deltaFunctionPrefix(moveId)]),
    relationExists(client, `${CONTROL}.move_deltas`),
  ]);
  if (functions.rows.length === 0 && !exists) return;
  await runTransaction(
    client,
    logsOffSql(
      functions.rows.map((r) => [CONTROL_SCHEMA, r.proname] as const),
      moveId,
      exists,
    ),
  );
  // Those no trigger calls any more (on the target, all of them, usually).
  if (functions.rows.length > 0) await client.query(dropUnusedFenceGuardsSql({ moveId }));
}

/** One table's log sums on one host: every entry, and the entries after its last TRUNCATE. */
export interface LogSums {
  /** seq of the last TRUNCATE logged, if any. */
  readonly truncatedAt: bigint | null;
  readonly entries: bigint;
  readonly rows: bigint;
  readonly checksum: string;
  readonly rowsAfterTruncate: bigint;
  readonly checksumAfterTruncate: string;
}

/** The sums of this move's log on one host (in the client's snapshot), by `schema.table`. */
export async function readLogSums(client: pg.Client, moveId: string): Promise<Map<string, LogSums>> {
  const result = await client.query<{
    schema_name: string;
    table_name: string;
    truncated_at: string | null;
    entries: string;
    rows: string;
    checksum: string;
    rows_after: string;
    checksum_after: string;
  }>(READ_LOG_SUMS_SQL, [moveId]);
  return new Map(
    result.rows.map((r) => [
      `${r.schema_name}.${r.table_name}`,
      {
        truncatedAt: r.truncated_at === null ? null : BigInt(r.truncated_at),
        entries: BigInt(r.entries),
        rows: BigInt(r.rows),
        checksum: r.checksum,
        rowsAfterTruncate: BigInt(r.rows_after),
        checksumAfterTruncate: r.checksum_after,
      },
    ]),
  );
}

/**
 * A logged table's count and checksum now on one host, from its value at P and its log sums at P
 * and now (see the header). Pure.
 */
export function fromLog(
  atP: { readonly rows: bigint; readonly checksum: string },
  logAtP: LogSums | undefined,
  logNow: LogSums | undefined,
): { rows: bigint; checksum: string; changes: bigint } {
  if (!logNow) return { rows: atP.rows, checksum: atP.checksum, changes: 0n };
  const changes = logNow.entries - (logAtP?.entries ?? 0n);
  if (logNow.truncatedAt !== null && (logAtP?.truncatedAt ?? null) !== logNow.truncatedAt) {
    return { rows: logNow.rowsAfterTruncate, checksum: logNow.checksumAfterTruncate, changes };
  }
  return {
    rows: atP.rows + logNow.rows - (logAtP?.rows ?? 0n),
    checksum: (BigInt(atP.checksum) + BigInt(logNow.checksum) - BigInt(logAtP?.checksum ?? '0')).toString(),
    changes,
  };
}

/** What was recorded for one table. */
export interface TableChanges {
  readonly truncated: boolean;
  readonly keys: number;
  /** JSON array of key objects (distinct). */
  readonly keysJson: string;
}

/** A row of READ_CHANGES_SQL. */
export interface ChangesRow {
  readonly schema_name: string;
  readonly table_name: string;
  readonly truncated: boolean;
  readonly keys: string;
  readonly keys_json: string | null;
}

/** The changes recorded for this move, by `schema.table`. */
export async function readChanges(client: pg.Client, moveId: string): Promise<Map<string, TableChanges>> {
  const result = await client.query<ChangesRow>(READ_CHANGES_SQL, [moveId, TAIL_MAX_KEYS]);
  return changesOf(result.rows);
}

/** The changes of READ_CHANGES_SQL's rows, by `schema.table`. */
export function changesOf(rows: readonly ChangesRow[]): Map<string, TableChanges> {
  return new Map(
    rows.map((r) => [
      `${r.schema_name}.${r.table_name}`,
      { truncated: r.truncated, keys: Number(r.keys), keysJson: r.keys_json ?? '[]' },
    ]),
  );
}
