import type pg from 'pg';
import { CONTROL, CONTROL_SCHEMA } from '../fleet/control.js';
import { TRACKING_LOCK_SQL } from '../fleet/locks.js';
import { quoteIdent, quoteLiteral } from '../pg/quote.js';
import { loadSqlTemplate, renderSql } from '../pg/template.js';
import { qualified } from './sql.js';
import type { ShardTable } from './verify.js';

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
 * Tables it does not cover are checksummed whole while fenced, as before: those without a primary
 * key or replica-identity index, keys of a type whose JSON form might not read back exactly,
 * partitioned tables, a table truncated during the cut-over, or one with more than
 * TAIL_MAX_KEYS recorded keys.
 */

/** A table whose tail can be verified by key: its replica-identity key columns and their types. */
export interface KeyedTable {
  readonly table: ShardTable;
  readonly columns: readonly string[];
  /** format_type() of each key column (built-in types only, see EXACT_KEY_TYPES). */
  readonly types: readonly string[];
}

/** More changed keys than this in one table: checksummed whole instead (the lookups would cost more). */
export const TAIL_MAX_KEYS = 100_000;

/**
 * Key types whose JSON form (to_jsonb) reads back to the same value (jsonb_to_recordset): the
 * lookup must find exactly the row that was recorded.
 */
const EXACT_KEY_TYPES = ['int2', 'int4', 'int8', 'numeric', 'text', 'varchar', 'uuid', 'bool', 'date', 'timestamp', 'timestamptz', 'bytea'];

/** Plain tables (not partitioned, not partitions) of `schemas` with an exact-typed replica-identity key. */
export async function keyedTables(client: pg.Client, schemas: readonly string[]): Promise<KeyedTable[]> {
  const result = await client.query<{ nspname: string; relname: string; columns: string[]; types: string[]; exact: boolean }>(
    `SELECT n.nspname, c.relname, array_agg(a.attname::text ORDER BY k.ord) AS columns,
            array_agg(format_type(a.atttypid, a.atttypmod) ORDER BY k.ord) AS types,
            bool_and(t.oid < 16384 AND t.typname = ANY($2::text[])) AS exact
       FROM pg_class c
       JOIN pg_namespace n ON n.oid = c.relnamespace
       JOIN pg_index i ON i.indrelid = c.oid AND ((c.relreplident = 'd' AND i.indisprimary) OR (c.relreplident = 'i' AND i.indisreplident))
       CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, ord)
       JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = k.attnum
       JOIN pg_type t ON t.oid = a.atttypid
      WHERE n.nspname = ANY($1::text[]) AND c.relkind = 'r' AND NOT c.relispartition
      GROUP BY n.nspname, c.relname
      ORDER BY n.nspname, c.relname`,
    [schemas, EXACT_KEY_TYPES],
  );
  return result.rows
    .filter((r) => r.exact)
    .map((r) => ({ table: { schema: r.nspname, table: r.relname, portable: true }, columns: r.columns, types: r.types }));
}

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

/** Runs a BEGIN … COMMIT string; on failure rolls back, so the session stays usable, and rethrows. */
export async function runTransaction(client: pg.Client, sql: string): Promise<void> {
  try {
    await client.query(sql);
  } catch (error) {
    // The failure being handled is what is reported; a ROLLBACK that fails means the connection is gone,
    // which ends the transaction too.
    await client.query('ROLLBACK').catch(() => undefined);
    throw error;
  }
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
