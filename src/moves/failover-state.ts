import type { HostSession } from '../fleet/session.js';
import { type MoveContext, notice } from './context.js';
import { recordDetailOnBoth } from './state.js';
import { FAILOVER_SLOTS_FROM, PRIMARY_SLOT_SQL, STANDBY_SLOTS_SQL, TIMELINE_SQL } from './sql/failover.js';

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

/**
 * The standbys' physical slots the source's logical walsenders wait for (`synchronized_standby_slots`):
 * recorded with the timelines, so that after a failover the move knows whether the target could
 * have received changes the promoted standby never had.
 */
export async function readStandbySlots(source: HostSession): Promise<string[]> {
  const text = (await source.client.query<{ slots: string }>(STANDBY_SLOTS_SQL)).rows[0]?.slots ?? '';
  return text
    .split(',')
    .map((name) => name.trim().replace(/^"(.*)"$/, '$1'))
    .filter((name) => name !== '');
}

/** The physical slot a promoted standby streamed from ('' when none is set). */
export async function readPrimarySlot(source: HostSession): Promise<string> {
  return (await source.client.query<{ slot: string }>(PRIMARY_SLOT_SQL)).rows[0]?.slot ?? '';
}

/**
 * Between steps (never while a wave is fenced): a standby slot recorded as waited for that the
 * source's `synchronized_standby_slots` no longer lists is taken out of the record on both hosts,
 * for good (the walsenders may have sent the target WAL that standby lacks since), so that a
 * failover to that standby afterwards restarts the copy instead of trusting the slot it
 * synchronized (untrustedSyncedSlot). One added since is not added: what was sent before cannot be
 * known. A removal followed by a failover before the next check (a step, or the start of a resumed
 * run) cannot be told apart: docs/moves.md, "Failovers during a move".
 */
export async function watchStandbySlots(ctx: MoveContext): Promise<void> {
  if (ctx.mode !== 'online' || ctx.standbySlots.length === 0) return;
  const listed = new Set(await readStandbySlots(ctx.source));
  const gone = ctx.standbySlots.filter((slot) => !listed.has(slot));
  if (gone.length === 0) return;
  const kept = ctx.standbySlots.filter((slot) => listed.has(slot));
  await recordDetailOnBoth(ctx, { standbySlots: kept });
  ctx.standbySlots = kept;
  notice(
    ctx,
    `host ${ctx.source.host.name}: synchronized_standby_slots no longer lists ${gone.join(', ')}: its walsenders may send host ${ctx.target.host.name} changes that standby lacks, so a failover of ${ctx.source.host.name} to it during this move restarts the copy`,
  );
}
