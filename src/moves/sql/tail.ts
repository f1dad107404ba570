import { CONTROL, CONTROL_SCHEMA } from '../../fleet/control.js';
import { TRACKING_LOCK_SQL } from '../../fleet/locks.js';
import { quoteIdent, quoteLiteral } from '../../pg/quote.js';
import { loadSqlTemplate, renderSql } from '../../pg/template.js';
import { lockTimeoutSql } from './locks.js';
import {
  /**
   * The verification's tail (tail.ts): tracking on the target, change logs on both hosts.
   */
  DELTA_TRIGGERS,
  type KeyedTableName,
  TRACK_TRIGGERS,
  type TableName,
  type TriggerName,
  deltaFunctionName,
  qualified,
} from './names.js';
import { STABLE_TEXT_PARAMS } from './verify.js';

const [TRACK_TRIGGER, TRACK_TRUNCATE_TRIGGER] = TRACK_TRIGGERS;

/** The tracking table and function, and triggers on `tables` recording this move's changes (one transaction). */
export function startTrackingSql(moveId: string, tables: readonly KeyedTableName[]): string {
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

/** The tracking triggers `triggers` dropped and this move's recorded keys gone (when their table exists), in one transaction. */
export function stopTrackingSql(moveId: string, triggers: readonly TriggerName[], changesExist: boolean): string {
  return [
    'BEGIN;',
    "SET LOCAL lock_timeout = '5s';",
    ...triggers.map((r) => `DROP TRIGGER IF EXISTS ${quoteIdent(r.trigger)} ON ${qualified(r.schema, r.table)};`),
    ...(changesExist ? [`DELETE FROM ${CONTROL}.move_changes WHERE move_id = ${quoteLiteral(moveId)};`] : []),
    'COMMIT;',
  ].join('\n');
}

const [DELTA_TRIGGER, DELTA_TRUNCATE_TRIGGER] = DELTA_TRIGGERS;

/** A table to log and its checksum method. */
export interface LoggedTable {
  readonly table: TableName;
  readonly method: 'record' | 'text';
}

/** The names of move $2's change-log functions (deltaFunctionPrefix $2) in schema $1. */
export const DELTA_FUNCTIONS_SQL = `SELECT p.proname FROM pg_catalog.pg_proc p
      WHERE p.pronamespace = pg_catalog.to_regnamespace($1) AND left(p.proname, length($2)) = $2`;

/**
 * Change-log trigger functions (schema, name) replaced by one that does nothing, and move `moveId`'s
 * log entries deleted when `logExists`, in one transaction: the logs of every table whose triggers
 * call them are off, with no lock on any of those tables, for every writer from its next
 * transaction or its next new lock of the table (when a session reads a function's catalog row
 * again); one already in a transaction that holds the table may log a little longer.
 */
export function logsOffSql(
  functions: readonly (readonly [string, string])[],
  moveId: string,
  logExists: boolean,
): string {
  return [
    'BEGIN;',
    ...functions.map(
      ([schema, name]) =>
        `CREATE OR REPLACE FUNCTION ${qualified(schema, name)}() RETURNS trigger LANGUAGE plpgsql AS $off$ BEGIN RETURN NULL; END $off$;`,
    ),
    ...(logExists ? [`DELETE FROM ${CONTROL}.move_deltas WHERE move_id = ${quoteLiteral(moveId)};`] : []),
    'COMMIT;',
  ].join('\n');
}

/** The change log's table and the wave's function, and this move's earlier entries gone (within a transaction). */
function deltaLogSql(moveId: string, wave: number): string[] {
  return [
    TRACKING_LOCK_SQL,
    renderSql(loadSqlTemplate('move_deltas.sql'), {
      control: { ident: CONTROL_SCHEMA },
      function: { ident: deltaFunctionName(moveId, wave) },
      ...STABLE_TEXT_PARAMS,
    }).trim(),
    `DELETE FROM ${CONTROL}.move_deltas WHERE move_id = ${quoteLiteral(moveId)};`,
  ];
}

/** One table's change-log triggers, enabled ALWAYS (within a transaction). */
function deltaTriggersSql(moveId: string, wave: number, { table, method }: LoggedTable): string[] {
  const fn = qualified(CONTROL_SCHEMA, deltaFunctionName(moveId, wave));
  const name = qualified(table.schema, table.table);
  const args = [moveId, method].map(quoteLiteral).join(', ');
  return [
    `CREATE OR REPLACE TRIGGER ${DELTA_TRIGGER} AFTER INSERT OR UPDATE OR DELETE ON ${name} FOR EACH ROW EXECUTE FUNCTION ${fn}(${args});`,
    `CREATE OR REPLACE TRIGGER ${DELTA_TRUNCATE_TRIGGER} AFTER TRUNCATE ON ${name} FOR EACH STATEMENT EXECUTE FUNCTION ${fn}(${args});`,
    `ALTER TABLE ${name} ENABLE ALWAYS TRIGGER ${DELTA_TRIGGER}, ENABLE ALWAYS TRIGGER ${DELTA_TRUNCATE_TRIGGER};`,
  ];
}

/**
 * The change log and its triggers on `tables`, with each table's checksum method, in one
 * transaction: on the target, whose only writer is the apply worker. `lockWaitMs` bounds each
 * lock wait (see fenceSql).
 */
export function startDeltasSql(moveId: string, tables: readonly LoggedTable[], lockWaitMs: number, wave = 0): string {
  return [
    'BEGIN;',
    lockTimeoutSql(lockWaitMs),
    ...deltaLogSql(moveId, wave),
    ...tables.flatMap((t) => deltaTriggersSql(moveId, wave, t)),
    'COMMIT;',
  ].join('\n');
}

/**
 * The same on the source, whose application writes: the log in a first transaction, then each
 * table's triggers in a transaction of its own, all in one round trip. CREATE TRIGGER waits for
 * the table's writers; holding one table's lock at a time, it cannot close a cycle with an
 * application transaction that writes several tables (a transaction that locked them all would,
 * and lose at its lock_timeout again and again under such a writer). `lockWaitMs` bounds each
 * wait; after one ran out, the tables done are committed and the caller sends the rest
 * (DELTAS_DONE_SQL). Committed without waiting for the WAL flush: a server that loses them in a
 * crash has lost the move's snapshot too, and the cut-over begins again.
 */
export function startSourceDeltasSql(
  moveId: string,
  tables: readonly LoggedTable[],
  lockWaitMs: number,
  wave = 0,
): string {
  const transaction = (body: readonly string[]): string[] => [
    'BEGIN;',
    lockTimeoutSql(lockWaitMs),
    "SET LOCAL synchronous_commit = 'off';",
    ...body,
    'COMMIT;',
  ];
  return [
    ...transaction(deltaLogSql(moveId, wave)),
    ...tables.flatMap((t) => transaction(deltaTriggersSql(moveId, wave, t))),
  ].join('\n');
}

/** The tables of schemas $1 whose two change-log triggers are on (ALWAYS) for move $2: those startSourceDeltasSql did. */
export const DELTAS_DONE_SQL = `SELECT n.nspname AS schema, c.relname AS table
       FROM pg_trigger t
       JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace
      WHERE n.nspname = ANY($1::text[]) AND t.tgname = ANY($3::text[]) AND t.tgenabled = 'A'
        AND substring(t.tgargs FROM 1 FOR octet_length(convert_to($2, 'UTF8')) + 1) = convert_to($2, 'UTF8') || '\\x00'::bytea
      GROUP BY 1, 2 HAVING count(*) = 2`;

/** More changed keys than this in one table: checksummed whole instead (the lookups would cost more). */
export const TAIL_MAX_KEYS = 100_000;

/** The sums of move $1's change log on one host, by table: every entry, and those after its last TRUNCATE. */
export const READ_LOG_SUMS_SQL = `SELECT schema_name, table_name, max(truncated_at)::text AS truncated_at, count(*)::text AS entries,
            coalesce(sum(sign), 0)::text AS rows, coalesce(sum(sign * hash::numeric), 0)::text AS checksum,
            coalesce(sum(sign) FILTER (WHERE seq > truncated_at), 0)::text AS rows_after,
            coalesce(sum(sign * hash::numeric) FILTER (WHERE seq > truncated_at), 0)::text AS checksum_after
       FROM (SELECT *, max(seq) FILTER (WHERE sign = 0) OVER (PARTITION BY schema_name, table_name) AS truncated_at
               FROM ${CONTROL}.move_deltas WHERE move_id = $1) d
      GROUP BY 1, 2`;

/** The keys recorded for move `moveId` by table (as JSON while at most `maxKeys` of them), and whether it was truncated. */
export function readChangesSql(moveId: string, maxKeys: string): string {
  return `SELECT schema_name, table_name, bool_or(key IS NULL) AS truncated, count(DISTINCT key)::text AS keys,
            CASE WHEN count(DISTINCT key) <= ${maxKeys} THEN jsonb_agg(DISTINCT key) FILTER (WHERE key IS NOT NULL)::text END AS keys_json
       FROM ${CONTROL}.move_changes WHERE move_id = ${moveId} GROUP BY 1, 2`;
}

/** The keys recorded for move $1 by table (as JSON while at most $2 of them), and whether it was truncated. */
export const READ_CHANGES_SQL = readChangesSql('$1', '$2');
