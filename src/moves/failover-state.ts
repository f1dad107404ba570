import type { HostSession } from '../fleet/session.js';
import type { MoveContext } from './context.js';
import { FAILOVER_SLOTS_FROM, TIMELINE_SQL } from './sql/failover.js';

/**
 * What a move's failover handling (failover.ts) decides from what it reads: whether the
 * subscription is a failover one, whether a slot can still serve the move, and the hosts'
 * timelines (a later one means the host failed over). Its statements are in sql/failover.ts.
 */

/** The subscription's `failover` option: both ends must know it (the target runs it, the source alters the slot). */
export function subscriptionFailover(ctx: MoveContext): boolean {
  return Math.min(ctx.source.serverVersionNum, ctx.target.serverVersionNum) >= FAILOVER_SLOTS_FROM;
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
