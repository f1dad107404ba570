import { ident, lit, sql, type Sql } from '../../pg/sql-template.js';
import { createSlotCommand } from './replication.js';

/**
 * The SQL of a move's failover handling (failover.ts): the failover slot, and what a resumed move
 * reads to know whether the slot and the target survived.
 */

/** A failover slot (created with FAILOVER, synchronized to standbys) exists from PostgreSQL 17. */
export const FAILOVER_SLOTS_FROM = 170000;

/** The replication connection's command for the move's slot: a failover slot where the source has them. */
export function createMoveSlotCommand(name: string, sourceVersionNum: number): Sql {
  if (sourceVersionNum < FAILOVER_SLOTS_FROM) return createSlotCommand(name);
  return sql`CREATE_REPLICATION_SLOT ${ident(name)} LOGICAL pgoutput (SNAPSHOT 'export', FAILOVER true)`;
}

/** The slot's row as JSON (its columns differ between majors: wal_status from 13, conflicting 16, invalidation_reason 17). */
export const SLOT_STATE_SQL = sql`SELECT to_jsonb(s) AS slot FROM pg_replication_slots s WHERE slot_name = $1`;

/** The server's current timeline: a promoted standby starts a new one. */
export const TIMELINE_SQL = sql`SELECT ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int AS timeline`;

/** Points the subscription at the source's address as the config now gives it (restarts its worker, connects to nothing). */
export function subscriptionConnectionSql(name: string, sourceReplicationUrl: string): Sql {
  return sql`ALTER SUBSCRIPTION ${ident(name)} CONNECTION ${lit(sourceReplicationUrl)}`;
}

/** The physical slots a 17+ primary's logical walsenders wait for (empty: none, or before 17). */
export const STANDBY_SLOTS_SQL = sql`SELECT coalesce(current_setting('synchronized_standby_slots', true), '') AS slots`;

/** The physical slot this server streamed from as a standby (kept in its settings after a promotion). */
export const PRIMARY_SLOT_SQL = sql`SELECT coalesce(current_setting('primary_slot_name', true), '') AS slot`;
