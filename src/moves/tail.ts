import type pg from 'pg';
import { CONTROL } from '../fleet/control.js';
import { retryLockWaits, runTransaction } from '../pg/quiet.js';
import {
  DELTA_TRIGGERS,
  disableDeltasSql,
  dropTriggerIfFreeSql,
  READ_CHANGES_SQL,
  READ_LOG_SUMS_SQL,
  stopTrackingSql,
  TAIL_MAX_KEYS,
  TRACK_TRIGGERS,
} from './sql.js';
import { relationExists, shardTriggers } from './catalog.js';

/**
 * Verification of a wave in two parts, so that what runs while writes are blocked grows with the
 * rows written during the cut-over, not with the size of the shards.
 *
 * Before the fence: triggers on the target record the key of every row any write touches from now
 * on (sql/move_tracking.sql); then a REPEATABLE READ transaction on each host takes a snapshot (P)
 * and computes the count and checksum of every tracked table. Those transactions stay open.
 *
 * While fenced and caught up: K, the keys recorded on the target. A row whose key is not in K was
 * not written on either host since its snapshot: on the target, every write since the triggers
 * exist is recorded; on the source, a change not visible in P committed after P was taken, hence
 * after the triggers existed, and logical replication applied it on the target (recording its key)
 * before the fence marker arrived. So, per table and per host, the count and checksum now are
 *   at P  -  (rows with a key in K, at P)  +  (rows with a key in K, now)
 * and only rows with a key in K are read: by key lookups in P's transaction and in a fresh one.
 * The identity holds for any K that contains every changed key, so a recorded key too many (a write
 * before P, a rolled-back one) costs a lookup and nothing else.
 *
 * Tables without such a key (no primary key or replica-identity index, or a key of a type whose
 * JSON form might not read back exactly) are verified from change logs instead
 * (sql/move_deltas.sql): triggers on both hosts, created before P, log for every row a write touches
 * the checksum's hash of the row as it was (-1) and as it is (+1), and a TRUNCATE. A log entry
 * commits with its change, so the entries visible now and not in P are exactly the changes
 * committed after P, and per host
 *   count and checksum now = at P + (sums of the log now - sums of the log at P)
 * or, when a TRUNCATE was logged after P, the sums of the entries after the last TRUNCATE in seq
 * order (a TRUNCATE holds ACCESS EXCLUSIVE until it commits, so its table's entries after it in seq
 * order were written after it). Each host is read on its own: a change lost or altered on the way
 * leaves the two sums apart. On the source the triggers run in application transactions, during
 * the cut-over only: the unfence and the end of the wave's verification disable them.
 *
 * Partitions are verified one by one (each is an ordinary table, by key or from its log); a
 * partitioned parent holds no rows of its own. Checksummed whole while fenced: a keyed table
 * truncated during the cut-over (it holds only rows written since the truncate, which followed the
 * catch-up before the fence), one with more than TAIL_MAX_KEYS recorded keys, and every table when
 * the logs could not be set up (the source older than PostgreSQL 14, or its tables kept busy).
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
 * The change-log triggers of `schemas` disabled (whatever run created them) and this move's log
 * entries gone; then each dropped if its table is free at once. Disabling takes the lock CREATE
 * TRIGGER takes, which readers do not block, and is retried for up to `limitMs` with bounded
 * waits; dropping takes ACCESS EXCLUSIVE, so a table a reader holds keeps a disabled trigger, which
 * costs nothing and the next setup replaces.
 */
export async function stopDeltas(
  client: pg.Client,
  moveId: string,
  schemas: readonly string[],
  lockWaitMs = 200,
  limitMs = 5_000,
): Promise<void> {
  const triggers = await shardTriggers(client, schemas, DELTA_TRIGGERS);
  const exists = await relationExists(client, `${CONTROL}.move_deltas`);
  if (triggers.length === 0 && !exists) return;
  const sql = disableDeltasSql(
    moveId,
    triggers.filter((r) => r.enabled),
    exists,
    lockWaitMs,
  );
  await retryLockWaits(() => runTransaction(client, sql), performance.now() + limitMs);
  // A table in use keeps its disabled trigger, which costs nothing (see above).
  for (const r of triggers)
    await runTransaction(client, dropTriggerIfFreeSql(r.schema, r.table, r.trigger)).catch(() => undefined);
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

/** The changes recorded for this move, by `schema.table`. */
export async function readChanges(client: pg.Client, moveId: string): Promise<Map<string, TableChanges>> {
  const result = await client.query<{
    schema_name: string;
    table_name: string;
    truncated: boolean;
    keys: string;
    keys_json: string | null;
  }>(READ_CHANGES_SQL, [moveId, TAIL_MAX_KEYS]);
  return new Map(
    result.rows.map((r) => [
      `${r.schema_name}.${r.table_name}`,
      { truncated: r.truncated, keys: Number(r.keys), keysJson: r.keys_json ?? '[]' },
    ]),
  );
}
