import { EMPTY, ident, int, lines, list, lit, sql, type Sql } from '../../pg/sql-template.js';
import { CONTROL, CONTROL_SCHEMA } from '../../fleet/control.js';
import { TRACKING_LOCK_SQL } from '../../fleet/locks.js';
import { renderSqlFile } from '../../pg/template.js';
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
export function startTrackingSql(moveId: string, tables: readonly KeyedTableName[]): Sql {
  const fn = sql`${CONTROL}.move_track`;
  return lines([
    sql`BEGIN;`,
    lockTimeoutSql(5000),
    // Moves into the same target (from several sources at once) would race on CREATE OR REPLACE.
    TRACKING_LOCK_SQL,
    renderSqlFile('move_tracking.sql', { control: { ident: CONTROL_SCHEMA } }),
    sql`DELETE FROM ${CONTROL}.move_changes WHERE move_id = ${lit(moveId)};`,
    ...tables.flatMap(({ table, columns }) => {
      const name = qualified(table.schema, table.table);
      const args = list([moveId, ...columns].map((value) => lit(value)));
      return [
        sql`CREATE OR REPLACE TRIGGER ${ident(TRACK_TRIGGER)} AFTER INSERT OR UPDATE OR DELETE ON ${name} FOR EACH ROW EXECUTE FUNCTION ${fn}(${args});`,
        sql`CREATE OR REPLACE TRIGGER ${ident(TRACK_TRUNCATE_TRIGGER)} AFTER TRUNCATE ON ${name} FOR EACH STATEMENT EXECUTE FUNCTION ${fn}(${lit(moveId)});`,
        sql`ALTER TABLE ${name} ENABLE ALWAYS TRIGGER ${ident(TRACK_TRIGGER)}, ENABLE ALWAYS TRIGGER ${ident(TRACK_TRUNCATE_TRIGGER)};`,
      ];
    }),
    sql`COMMIT;`,
  ]);
}

/** The tracking triggers `triggers` dropped and this move's recorded keys gone (when their table exists), in one transaction. */
export function stopTrackingSql(moveId: string, triggers: readonly TriggerName[], changesExist: boolean): Sql {
  return lines([
    sql`BEGIN;`,
    sql`SET LOCAL lock_timeout = '5s';`,
    ...triggers.map((r) => sql`DROP TRIGGER IF EXISTS ${ident(r.trigger)} ON ${qualified(r.schema, r.table)};`),
    ...(changesExist ? [sql`DELETE FROM ${CONTROL}.move_changes WHERE move_id = ${lit(moveId)};`] : []),
    sql`COMMIT;`,
  ]);
}

const [DELTA_TRIGGER, DELTA_TRUNCATE_TRIGGER] = DELTA_TRIGGERS;

/** A table to log and its checksum method. */
export interface LoggedTable {
  readonly table: TableName;
  readonly method: 'record' | 'text';
  /**
   * A table the copy takes in key chunks, on the source: the chunk key's column (its name), whose
   * text form each entry records, and a start marker written with the triggers (chunks.ts
   * reconcileByLog).
   */
  readonly key?: string;
}

/** The sign of a start marker in the change log (sql/move_deltas.sql): not a change, left out of the sums. */
export const LOG_START = 2;

/** The names of move $2's change-log functions (deltaFunctionPrefix $2) in schema $1. */
export const DELTA_FUNCTIONS_SQL = sql`SELECT p.proname FROM pg_catalog.pg_proc p
      WHERE p.pronamespace = pg_catalog.to_regnamespace($1) AND left(p.proname, length($2)) = $2`;

/**
 * Change-log trigger functions (schema, name) replaced by one that does nothing, and move `moveId`'s
 * log entries deleted when `logExists`, in one transaction: the logs of every table whose triggers
 * call them are off, with no lock on any of those tables, for every writer from its next
 * transaction or its next new lock of the table (when a session reads a function's catalog row
 * again); one already in a transaction that holds the table may log a little longer.
 */
export function logsOffSql(functions: readonly (readonly [string, string])[], moveId: string, logExists: boolean): Sql {
  return lines([
    sql`BEGIN;`,
    ...functions.map(
      ([schema, name]) =>
        sql`CREATE OR REPLACE FUNCTION ${qualified(schema, name)}() RETURNS trigger LANGUAGE plpgsql AS $off$ BEGIN RETURN NULL; END $off$;`,
    ),
    ...(logExists ? [sql`DELETE FROM ${CONTROL}.move_deltas WHERE move_id = ${lit(moveId)};`] : []),
    sql`COMMIT;`,
  ]);
}

/**
 * The change log's table and the wave's function, and this move's earlier entries gone (within a
 * transaction), unless `keepEntries`: the logs run since the copy (copy-logs.ts), whose entries
 * since its snapshot are part of the figures.
 */
function deltaLogSql(moveId: string, wave: number, keepEntries = false): Sql[] {
  return [
    TRACKING_LOCK_SQL,
    renderSqlFile('move_deltas.sql', {
      control: { ident: CONTROL_SCHEMA },
      function: { ident: deltaFunctionName(moveId, wave) },
      ...STABLE_TEXT_PARAMS,
    }),
    ...(keepEntries ? [] : [sql`DELETE FROM ${CONTROL}.move_deltas WHERE move_id = ${lit(moveId)};`]),
  ];
}

/** The session setting of the copy's own transactions on the target, which its change logs leave out (copy-logs.ts). */
export const COPYING_SETTING = 'shardctl.copying';

/**
 * One table's change-log triggers, enabled ALWAYS (within a transaction). `duringCopy`: a
 * statement-level trigger instead, and none for the copy's own writes (COPYING_SETTING on in its
 * transaction): any other write only marks the log (entries of no hash, copy-logs.ts), at one
 * call per statement, where a row trigger would cost every copied row.
 */
function deltaTriggersSql(
  moveId: string,
  wave: number,
  { table, method, key }: LoggedTable,
  duringCopy = false,
): Sql[] {
  const fn = qualified(CONTROL_SCHEMA, deltaFunctionName(moveId, wave));
  const name = qualified(table.schema, table.table);
  const args = list([moveId, method, ...(key === undefined ? [] : [key])].map((value) => lit(value)));
  const when = duringCopy ? sql` WHEN (current_setting(${lit(COPYING_SETTING)}, true) IS DISTINCT FROM 'on')` : EMPTY;
  const level = duringCopy ? sql`STATEMENT` : sql`ROW`;
  return [
    sql`CREATE OR REPLACE TRIGGER ${ident(DELTA_TRIGGER)} AFTER INSERT OR UPDATE OR DELETE ON ${name} FOR EACH ${level}${when} EXECUTE FUNCTION ${fn}(${args});`,
    sql`CREATE OR REPLACE TRIGGER ${ident(DELTA_TRUNCATE_TRIGGER)} AFTER TRUNCATE ON ${name} FOR EACH STATEMENT${when} EXECUTE FUNCTION ${fn}(${args});`,
    sql`ALTER TABLE ${name} ENABLE ALWAYS TRIGGER ${ident(DELTA_TRIGGER)}, ENABLE ALWAYS TRIGGER ${ident(DELTA_TRUNCATE_TRIGGER)};`,
  ];
}

/**
 * The change log of a table on the target from before its first chunk is copied (within the
 * transaction that plans its chunks, after its TRUNCATE; or, for a table an earlier run planned,
 * before its chunks are reconciled): the wave's function, and statement triggers that mark any
 * write but the copy's (copy-logs.ts). A row trigger an earlier run left (its copy finished, the run
 * cut off before `copied`) is dropped first. No entry is deleted. `planned`: in the plan's
 * transaction, with a start marker (logStartSql), so that a marker proves the log there since the
 * table was emptied for its chunks (chunks.ts reconcileByLog).
 */
export function copyLogOnTargetSql(moveId: string, wave: number, table: LoggedTable, planned = false): Sql {
  const name = qualified(table.table.schema, table.table.table);
  return lines([
    ...deltaLogSql(moveId, wave, true),
    sql`DROP TRIGGER IF EXISTS ${ident(DELTA_TRIGGER)} ON ${name};`,
    ...deltaTriggersSql(moveId, wave, { table: table.table, method: table.method }, true),
    ...(planned ? [logStartSql(moveId, table)] : []),
  ]);
}

/**
 * After the copy, before the subscription starts: the table's log on the target by row from now
 * on, replacing copyLogOnTargetSql's statement triggers (one transaction).
 */
export function copyLogRowsOnTargetSql(moveId: string, wave: number, table: LoggedTable): Sql {
  const name = qualified(table.table.schema, table.table.table);
  return lines([
    sql`BEGIN;`,
    lockTimeoutSql(5000),
    sql`DROP TRIGGER IF EXISTS ${ident(DELTA_TRIGGER)} ON ${name};`,
    ...deltaTriggersSql(moveId, wave, { table: table.table, method: table.method }),
    sql`COMMIT;`,
  ]);
}

/**
 * The change log and its triggers on `tables`, with each table's checksum method, in one
 * transaction: on the target, whose only writer is the apply worker. `lockWaitMs` bounds each
 * lock wait (see fenceSql).
 */
export function startDeltasSql(
  moveId: string,
  tables: readonly LoggedTable[],
  lockWaitMs: number,
  wave = 0,
  keepEntries = false,
): Sql {
  return lines([
    sql`BEGIN;`,
    lockTimeoutSql(lockWaitMs),
    ...deltaLogSql(moveId, wave, keepEntries),
    ...tables.flatMap((t) => deltaTriggersSql(moveId, wave, t)),
    sql`COMMIT;`,
  ]);
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
  keepEntries = false,
): Sql {
  const transaction = (body: readonly Sql[]): Sql[] => [
    sql`BEGIN;`,
    lockTimeoutSql(lockWaitMs),
    sql`SET LOCAL synchronous_commit = 'off';`,
    ...body,
    sql`COMMIT;`,
  ];
  return lines([
    ...transaction(deltaLogSql(moveId, wave, keepEntries)),
    ...tables.flatMap((t) =>
      transaction([...deltaTriggersSql(moveId, wave, t), ...(t.key === undefined ? [] : [logStartSql(moveId, t)])]),
    ),
  ]);
}

/**
 * A start marker of a table's log, in the transaction that creates its triggers: committed once
 * they are, and gone with the move's entries (every statement that switches a log off or starts it
 * afresh deletes them), so a marker a snapshot sees proves the log complete from that snapshot on.
 */
function logStartSql(moveId: string, { table }: LoggedTable): Sql {
  return sql`INSERT INTO ${CONTROL}.move_deltas (move_id, schema_name, table_name, sign) VALUES (${lit(moveId)}, ${lit(table.schema)}, ${lit(table.table)}, ${int(LOG_START, 'a sign')});`;
}

/** The tables of schemas $1 whose two change-log triggers are on (ALWAYS) for move $2: those startSourceDeltasSql did. */
export const DELTAS_DONE_SQL = sql`SELECT n.nspname AS schema, c.relname AS table
       FROM pg_trigger t
       JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace
      WHERE n.nspname = ANY($1::text[]) AND t.tgname = ANY($3::text[]) AND t.tgenabled = 'A'
        AND substring(t.tgargs FROM 1 FOR octet_length(convert_to($2, 'UTF8')) + 1) = convert_to($2, 'UTF8') || '\\x00'::bytea
      GROUP BY 1, 2 HAVING count(*) = 2`;

/** Move $1's log entries, those the session sees (verify.ts preVerify: in the transaction of snapshot P). */
export const DELETE_LOG_SQL = sql`DELETE FROM ${CONTROL}.move_deltas WHERE move_id = $1`;

/** More changed keys than this in one table: checksummed whole instead (the lookups would cost more). */
export const TAIL_MAX_KEYS = 100_000;

/** The sums of move $1's change log on one host, by table: every entry, and those after its last TRUNCATE. */
export const READ_LOG_SUMS_SQL = sql`SELECT schema_name, table_name, max(truncated_at)::text AS truncated_at, count(*)::text AS entries,
            coalesce(sum(sign), 0)::text AS rows, coalesce(sum(sign * hash::numeric), 0)::text AS checksum,
            coalesce(sum(sign) FILTER (WHERE seq > truncated_at), 0)::text AS rows_after,
            coalesce(sum(sign * hash::numeric) FILTER (WHERE seq > truncated_at), 0)::text AS checksum_after
       FROM (SELECT *, max(seq) FILTER (WHERE sign = 0) OVER (PARTITION BY schema_name, table_name) AS truncated_at
               FROM ${CONTROL}.move_deltas WHERE move_id = $1 AND sign <> ${int(LOG_START, 'a sign')}) d
      GROUP BY 1, 2`;

/** The keys recorded for move `moveId` by table (as JSON while at most `maxKeys` of them), and whether it was truncated. */
export function readChangesSql(moveId: Sql, maxKeys: Sql): Sql {
  return sql`SELECT schema_name, table_name, bool_or(key IS NULL) AS truncated, count(DISTINCT key)::text AS keys,
            CASE WHEN count(DISTINCT key) <= ${maxKeys} THEN jsonb_agg(DISTINCT key) FILTER (WHERE key IS NOT NULL)::text END AS keys_json
       FROM ${CONTROL}.move_changes WHERE move_id = ${moveId} GROUP BY 1, 2`;
}

/** The keys recorded for move $1 by table (as JSON while at most $2 of them), and whether it was truncated. */
export const READ_CHANGES_SQL = readChangesSql(sql`$1`, sql`$2`);
