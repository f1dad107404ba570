import { ident, int, sql, type Sql } from '../../pg/sql-template.js';
import { CONTROL } from '../../fleet/control.js';

/**
 * The names a move gives what it creates (replication objects, triggers, guard and log functions,
 * the old copy), and the shapes of the tables its builders take.
 */

export function qualified(schema: string, table: string): Sql {
  return ident(schema, table);
}

/** A table by schema and name (a ShardTable of catalog.ts, or anything with these two). */
export interface TableName {
  readonly schema: string;
  readonly table: string;
}

/** A table with its replica-identity key columns and their types (catalog.ts, KeyedTable). */
export interface KeyedTableName {
  readonly table: TableName;
  readonly columns: readonly string[];
  /** format_type() of each key column (built-in types only, see EXACT_KEY_TYPES in catalog.ts). */
  readonly types: readonly string[];
}

/** A trigger on a table, as catalog.ts reads it. */
export interface TriggerName {
  readonly schema: string;
  readonly table: string;
  readonly trigger: string;
}

/** Names of the replication objects of a move: publication, subscription and slot share it. */
export function replicationName(moveId: string): string {
  return `shardctl_move_${moveId}`;
}

/** The name the old copy gets after a move (PostgreSQL truncates identifiers at 63 bytes). */
export function oldCopyName(schema: string, moveId: string): string {
  return `${schema}_moved_${moveId}`.slice(0, 63);
}

/**
 * The guard function of a move's prepared fence triggers (fenceGuardSql), in the control schema,
 * named like its replication objects (dropUnusedFenceGuardsSql removes it once unused).
 */
export function fenceGuardName(moveId: string): Sql {
  return sql`${CONTROL}.${ident(replicationName(moveId))}`;
}

/** The trigger of the fence (fenceSql) on every table of a fenced shard. */
export const FENCE_TRIGGER = 'shardctl_fence';

/** The triggers of a move's change logs (src/moves/tail.ts), on a table without a usable key. */
export const DELTA_TRIGGERS = ['shardctl_delta', 'shardctl_delta_truncate'] as const;

/** The triggers recording the keys a write touches on the target during a cut-over (tail.ts). */
export const TRACK_TRIGGERS = ['shardctl_track', 'shardctl_track_truncate'] as const;

/**
 * The name of a move's change-log trigger function for one wave, in the control schema
 * (sql/move_deltas.sql): one per wave, so that switching a wave's logs off (logsOffSql) stays so
 * when the next wave's set-up creates its own.
 */
export function deltaFunctionName(moveId: string, wave: number): string {
  return `${deltaFunctionPrefix(moveId)}${int(wave, 'a wave')}`;
}

/** What the names of a move's change-log functions begin with (deltaFunctionName). */
export function deltaFunctionPrefix(moveId: string): string {
  return `${replicationName(moveId)}_log`;
}

/**
 * The trigger that refuses writes to a move's incoming copy on the target (sql/incoming.ts), on
 * every table of it, until the shard is active there.
 */
export const INCOMING_TRIGGER = 'shardctl_incoming';

/** The function of a move's incoming guards (incomingGuardFunctionSql), in the control schema. */
export function incomingGuardName(moveId: string): string {
  return `${replicationName(moveId)}_incoming`;
}
