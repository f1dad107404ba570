import type pg from 'pg';
import { CONTROL, CONTROL_SCHEMA } from '../fleet/control.js';
import { TRACKING_LOCK_SQL } from '../fleet/locks.js';
import { quoteIdent, quoteLiteral } from '../pg/quote.js';
import { runTransaction } from '../pg/quiet.js';
import { loadSqlTemplate, renderSql } from '../pg/template.js';
import { DELTA_TRIGGERS, qualified } from './sql.js';
import type { KeyedTable, ShardTable } from './catalog.js';

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

/** More changed keys than this in one table: checksummed whole instead (the lookups would cost more). */
export const TAIL_MAX_KEYS = 100_000;

const TRACK_TRIGGER = 'shardctl_track';
const TRACK_TRUNCATE_TRIGGER = 'shardctl_track_truncate';

/** The tracking table and function, and triggers on `tables` recording this move's changes (one transaction). */
export function startTrackingSql(moveId: string, tables: readonly KeyedTable[]): string {
  const fn = `${CONTROL}.move_track`;
  return [
    'BEGIN;',
    "SET LOCAL lock_timeout = '5s';",
    // Moves into the same target (from several sources at once) would race on CREATE OR REPLACE.
    TRACKING_LOCK_SQL,
    renderSql(loadSqlTemplate('move_tracking.sql'), { control: { ident: CONTROL_SCHEMA } }).trim(),
    `DELETE FROM ${CONTROL}.move_changes WHERE move_id = ${quoteLiteral(moveId)};`,
    ...tables.flatMap(({ table, columns }) => {
      const name = qualified(table.schema, table.table);
      const args = [moveId, ...columns].map(quoteLiteral).join(', ');
      return [
        `CREATE OR REPLACE TRIGGER ${TRACK_TRIGGER} AFTER INSERT OR UPDATE OR DELETE ON ${name} FOR EACH ROW EXECUTE FUNCTION ${fn}(${args});`,
        `CREATE OR REPLACE TRIGGER ${TRACK_TRUNCATE_TRIGGER} AFTER TRUNCATE ON ${name} FOR EACH STATEMENT EXECUTE FUNCTION ${fn}(${quoteLiteral(moveId)});`,
        `ALTER TABLE ${name} ENABLE ALWAYS TRIGGER ${TRACK_TRIGGER}, ENABLE ALWAYS TRIGGER ${TRACK_TRUNCATE_TRIGGER};`,
      ];
    }),
    'COMMIT;',
  ].join('\n');
}

/**
 * Removes the tracking of `schemas` on the target: its triggers (whatever run created them) and this
 * move's recorded keys. Runs before a wave switches, and again at clean-up: a trigger left on a
 * live table would record every application write.
 */
export async function stopTracking(client: pg.Client, moveId: string, schemas: readonly string[]): Promise<void> {
  const triggers = await client.query<{ nspname: string; relname: string; tgname: string }>(
    `SELECT n.nspname, c.relname, t.tgname FROM pg_trigger t
       JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace
      WHERE t.tgname IN ($2, $3) AND n.nspname = ANY($1::text[])`,
    [schemas, TRACK_TRIGGER, TRACK_TRUNCATE_TRIGGER],
  );
  const exists = (await client.query<{ e: boolean }>(`SELECT to_regclass($1) IS NOT NULL AS e`, [`${CONTROL}.move_changes`])).rows[0]!.e;
  if (triggers.rows.length === 0 && !exists) return;
  await runTransaction(
    client,
    [
      'BEGIN;',
      "SET LOCAL lock_timeout = '5s';",
      ...triggers.rows.map((r) => `DROP TRIGGER IF EXISTS ${quoteIdent(r.tgname)} ON ${qualified(r.nspname, r.relname)};`),
      ...(exists ? [`DELETE FROM ${CONTROL}.move_changes WHERE move_id = ${quoteLiteral(moveId)};`] : []),
      'COMMIT;',
    ].join('\n'),
  );
}

const [DELTA_TRIGGER, DELTA_TRUNCATE_TRIGGER] = DELTA_TRIGGERS;

/**
 * The change log and its triggers on `tables`, with each table's checksum method (one
 * transaction). On the source the CREATE TRIGGERs wait for the tables' writers: `lockWaitMs`
 * bounds that wait like the fence's (see fenceSql), and the caller retries.
 */
export function startDeltasSql(moveId: string, tables: readonly { readonly table: ShardTable; readonly method: 'record' | 'text' }[], lockWaitMs: number): string {
  const fn = `${CONTROL}.move_delta`;
  return [
    'BEGIN;',
    `SET LOCAL lock_timeout = '${Math.max(1, Math.round(lockWaitMs))}ms';`,
    TRACKING_LOCK_SQL,
    renderSql(loadSqlTemplate('move_deltas.sql'), { control: { ident: CONTROL_SCHEMA } }).trim(),
    `DELETE FROM ${CONTROL}.move_deltas WHERE move_id = ${quoteLiteral(moveId)};`,
    ...tables.flatMap(({ table, method }) => {
      const name = qualified(table.schema, table.table);
      const args = [moveId, method].map(quoteLiteral).join(', ');
      return [
        `CREATE OR REPLACE TRIGGER ${DELTA_TRIGGER} AFTER INSERT OR UPDATE OR DELETE ON ${name} FOR EACH ROW EXECUTE FUNCTION ${fn}(${args});`,
        `CREATE OR REPLACE TRIGGER ${DELTA_TRUNCATE_TRIGGER} AFTER TRUNCATE ON ${name} FOR EACH STATEMENT EXECUTE FUNCTION ${fn}(${args});`,
        `ALTER TABLE ${name} ENABLE ALWAYS TRIGGER ${DELTA_TRIGGER}, ENABLE ALWAYS TRIGGER ${DELTA_TRUNCATE_TRIGGER};`,
      ];
    }),
    'COMMIT;',
  ].join('\n');
}

/**
 * The change-log triggers of `schemas` disabled (whatever run created them) and this move's log
 * entries gone; then each dropped if its table is free at once. Disabling takes the lock CREATE
 * TRIGGER takes, which readers do not block, and is retried for up to `limitMs` with bounded
 * waits; dropping takes ACCESS EXCLUSIVE, so a table a reader holds keeps a disabled trigger, which
 * costs nothing and the next setup replaces.
 */
export async function stopDeltas(client: pg.Client, moveId: string, schemas: readonly string[], lockWaitMs = 200, limitMs = 5_000): Promise<void> {
  const triggers = await client.query<{ nspname: string; relname: string; tgname: string; enabled: boolean }>(
    `SELECT n.nspname, c.relname, t.tgname, t.tgenabled <> 'D' AS enabled FROM pg_trigger t
       JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace
      WHERE t.tgname = ANY($2::text[]) AND n.nspname = ANY($1::text[])`,
    [schemas, DELTA_TRIGGERS],
  );
  const exists = (await client.query<{ e: boolean }>(`SELECT to_regclass($1) IS NOT NULL AS e`, [`${CONTROL}.move_deltas`])).rows[0]!.e;
  if (triggers.rows.length === 0 && !exists) return;
  const sql = [
    'BEGIN;',
    `SET LOCAL lock_timeout = '${Math.max(1, Math.round(lockWaitMs))}ms';`,
    ...triggers.rows.filter((r) => r.enabled).map((r) => `ALTER TABLE ${qualified(r.nspname, r.relname)} DISABLE TRIGGER ${quoteIdent(r.tgname)};`),
    ...(exists ? [`DELETE FROM ${CONTROL}.move_deltas WHERE move_id = ${quoteLiteral(moveId)};`] : []),
    'COMMIT;',
  ].join('\n');
  const started = performance.now();
  for (;;) {
    try {
      await runTransaction(client, sql);
      break;
    } catch (error) {
      const code = (error as { code?: string }).code;
      if ((code !== '55P03' && code !== '40P01') || performance.now() - started > limitMs) throw error;
      await new Promise((resolve) => setTimeout(resolve, 10 + Math.random() * 40));
    }
  }
  for (const r of triggers.rows) {
    await runTransaction(client, `BEGIN;\nSET LOCAL lock_timeout = '1ms';\nDROP TRIGGER IF EXISTS ${quoteIdent(r.tgname)} ON ${qualified(r.nspname, r.relname)};\nCOMMIT;`).catch(() => undefined);
  }
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
  }>(
    `SELECT schema_name, table_name, max(truncated_at)::text AS truncated_at, count(*)::text AS entries,
            coalesce(sum(sign), 0)::text AS rows, coalesce(sum(sign * hash::numeric), 0)::text AS checksum,
            coalesce(sum(sign) FILTER (WHERE seq > truncated_at), 0)::text AS rows_after,
            coalesce(sum(sign * hash::numeric) FILTER (WHERE seq > truncated_at), 0)::text AS checksum_after
       FROM (SELECT *, max(seq) FILTER (WHERE sign = 0) OVER (PARTITION BY schema_name, table_name) AS truncated_at
               FROM ${CONTROL}.move_deltas WHERE move_id = $1) d
      GROUP BY 1, 2`,
    [moveId],
  );
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
  const result = await client.query<{ schema_name: string; table_name: string; truncated: boolean; keys: string; keys_json: string | null }>(
    `SELECT schema_name, table_name, bool_or(key IS NULL) AS truncated, count(DISTINCT key)::text AS keys,
            CASE WHEN count(DISTINCT key) <= $2 THEN jsonb_agg(DISTINCT key) FILTER (WHERE key IS NOT NULL)::text END AS keys_json
       FROM ${CONTROL}.move_changes WHERE move_id = $1 GROUP BY 1, 2`,
    [moveId, TAIL_MAX_KEYS],
  );
  return new Map(
    result.rows.map((r) => [
      `${r.schema_name}.${r.table_name}`,
      { truncated: r.truncated, keys: Number(r.keys), keysJson: r.keys_json ?? '[]' },
    ]),
  );
}

/**
 * SQL condition: the row `t` of `table` has one of the keys in the JSON array `param` (a
 * placeholder like $1). The keys are read back with their columns' types (built-in types, from the
 * catalog), so the lookup can use the key's index; not through the table's row type, whose other
 * columns would be NULL (a domain NOT NULL refuses that).
 */
export function keyFilterSql(keyed: KeyedTable, param: string): string {
  const columns = keyed.columns.map(quoteIdent);
  const definitions = columns.map((c, i) => `${c} ${keyed.types[i]!}`).join(', ');
  return `(${columns.map((c) => `t.${c}`).join(', ')}) IN (SELECT ${columns.map((c) => `k.${c}`).join(', ')} FROM jsonb_to_recordset(${param}::jsonb) AS k(${definitions}))`;
}
