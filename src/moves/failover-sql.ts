import { quoteIdent, quoteLiteral } from '../pg/quote.js';
import type { HostSession } from '../fleet/session.js';
import type { MoveContext } from './context.js';
import { createSlotCommand } from './sql.js';

/**
 * The SQL of a move's failover handling (failover.ts), one pure function or constant per statement:
 * the failover slot, the subscription's failover option, and what a resumed move reads to know
 * whether the slot and the target survived.
 */

/** A failover slot (created with FAILOVER, synchronized to standbys) exists from PostgreSQL 17. */
export const FAILOVER_SLOTS_FROM = 170000;

/** The replication connection's command for the move's slot: a failover slot where the source has them. */
export function createMoveSlotCommand(name: string, sourceVersionNum: number): string {
  if (sourceVersionNum < FAILOVER_SLOTS_FROM) return createSlotCommand(name);
  return `CREATE_REPLICATION_SLOT ${quoteIdent(name)} LOGICAL pgoutput (SNAPSHOT 'export', FAILOVER true)`;
}

/** The subscription's `failover` option: both ends must know it (the target runs it, the source alters the slot). */
export function subscriptionFailover(ctx: MoveContext): boolean {
  return Math.min(ctx.source.serverVersionNum, ctx.target.serverVersionNum) >= FAILOVER_SLOTS_FROM;
}

/** The slot's row as JSON (its columns differ between majors: wal_status from 13, conflicting 16, invalidation_reason 17). */
export const SLOT_STATE_SQL = `SELECT to_jsonb(s) AS slot FROM pg_replication_slots s WHERE slot_name = $1`;

/** The server's current timeline: a promoted standby starts a new one. */
export const TIMELINE_SQL = `SELECT ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int AS timeline`;

/** Points the subscription at the source's address as the config now gives it (restarts its worker, connects to nothing). */
export function subscriptionConnectionSql(name: string, sourceReplicationUrl: string): string {
  return `ALTER SUBSCRIPTION ${quoteIdent(name)} CONNECTION ${quoteLiteral(sourceReplicationUrl)}`;
}

/** Why a slot cannot serve the move any more; null when it can. */
export function slotUnusable(slot: Readonly<Record<string, unknown>> | undefined): string | null {
  if (!slot) return 'does not exist (a failover to a standby that did not have it)';
  if (slot['wal_status'] === 'lost') return 'is invalidated (the WAL it needs is gone)';
  if (typeof slot['invalidation_reason'] === 'string') return `is invalidated (${slot['invalidation_reason']})`;
  if (slot['conflicting'] === true) return 'is invalidated (a conflict with recovery)';
  return null;
}

/** Recorded at a move's start and after each failover check: a later timeline on a host means it failed over. */
export interface Timelines {
  readonly source: number;
  readonly target: number;
}

export async function readTimelines(ctx: {
  readonly source: HostSession;
  readonly target: HostSession;
}): Promise<Timelines> {
  const [source, target] = await Promise.all(
    [ctx.source, ctx.target].map(
      async (side) => (await side.client.query<{ timeline: number }>(TIMELINE_SQL)).rows[0]!.timeline,
    ),
  );
  return { source: source!, target: target! };
}
