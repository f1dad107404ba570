import { shardsPhrase } from '../config/ranges.js';
import { HostError } from '../errors.js';
import { recordDetail, stepsFor, type MoveStep } from './state.js';
import { beginWave, type MoveContext, notice } from './context.js';
import { record } from './progress.js';
import { undosAfter } from './move.js';
import { releaseWave } from './fence-limit.js';
import { ACTIVE_SHARDS_SQL } from './sql/control.js';
import { SUBSCRIPTION_EXISTS_SQL } from './sql/replication.js';
import { SLOT_STATE_SQL, subscriptionConnectionSql } from './sql/failover.js';
import { readTimelines, slotUnusable, type Timelines } from './failover-state.js';

/**
 * A move carried on after its source or its target failed over (a standby promoted).
 *
 * The copy and the streaming hang on two things a failover can take away: the source's logical slot
 * (the changes after the copy's snapshot) and the target's applied state (what the subscription
 * confirmed to that slot). On PostgreSQL 17 and later the slot is a failover slot, which standbys
 * with `sync_replication_slots = on` keep in step: after a promotion the new primary has it, and the
 * move goes on from it (the subscription pointed at the host's url as the config now gives it).
 * Where the slot is gone or invalidated (PostgreSQL 15 and 16; no slot sync; the standby too far
 * behind), or where the target is a promoted standby (with asynchronous replication it may lack
 * changes it confirmed to the slot, and the slot will not send them again), the changes since the
 * copy cannot be had: the copy of the move's shards restarts from a new slot, once whatever the
 * failed run left (fence, replication, the target's copies with their chunk records) is undone.
 * That is safe until the switch: before it, the target's copies take no writes and the source is
 * the only holder of the shards. After the switch the slot is not needed any more. docs/moves.md,
 * "Failovers during a move", has the whole argument.
 */

function recordedTimelines(detail: Readonly<Record<string, unknown>>): Timelines | null {
  const t = detail['timelines'] as Partial<Timelines> | undefined;
  return t && typeof t.source === 'number' && typeof t.target === 'number' ? (t as Timelines) : null;
}

/**
 * Before a resumed online move goes on from `step`: whether the slot and the target's applied state
 * survived what happened to the hosts since. Returns the step to go on from: `step`, or `prepared`
 * when the copy was restarted (everything after it undone). Throws SLOT_LOST where the copy cannot
 * be restarted (a wave was switched already).
 */
export async function checkAfterFailover(
  ctx: MoveContext,
  step: MoveStep,
  detail: Readonly<Record<string, unknown>>,
): Promise<MoveStep> {
  if (ctx.mode !== 'online') return step;
  const steps = stepsFor('online');
  const at = steps.indexOf(step);
  const lastWave = ctx.wave >= ctx.waves.length - 1;
  // Before `copied` the copy runs again from a new slot anyway (chunks.ts reconciles what it finds);
  // after the last switch only the clean-up is left, which needs no slot.
  if (at < steps.indexOf('copied') || (step === 'switched' && lastWave) || step === 'cleaned') return step;
  const now = await readTimelines(ctx);
  const before = recordedTimelines(detail);
  // Recorded at `switched` with waves left: the waves up to this one are switched, the next ones need the slot.
  const switched = step === 'switched' ? ctx.wave + 1 : ctx.wave;
  const [slotRow, active] = await Promise.all([
    ctx.source.client.query<{ slot: Record<string, unknown> }>(SLOT_STATE_SQL, [ctx.name]),
    step === 'switched' ? null : ctx.target.client.query(ACTIVE_SHARDS_SQL, [ctx.waves[ctx.wave] ?? ctx.shards]),
  ]);
  // Killed inside the switch, the target's copies active: only the switch is left (runSteps), no slot needed.
  if ((active?.rowCount ?? 0) > 0) return step;
  const lostSlot = slotUnusable(slotRow.rows[0]?.slot);
  const targetFailedOver = before !== null && now.target !== before.target;
  const why = lostSlot
    ? `replication slot ${ctx.name} on host ${ctx.source.host.name} ${lostSlot}`
    : targetFailedOver
      ? `host ${ctx.target.host.name} failed over (timeline ${before.target} → ${now.target}): it may lack changes it had confirmed to replication slot ${ctx.name}, which will not be sent again`
      : null;
  const shards = shardsPhrase(ctx.shards);
  if (why === null) {
    const sourceFailedOver = before !== null && now.source !== before.source;
    // The slot survived a failover (a failover slot): the subscription goes to the source's address
    // as now configured, which may name the new primary only now.
    if (sourceFailedOver) {
      const subscribed = await ctx.target.client.query(SUBSCRIPTION_EXISTS_SQL, [ctx.name]);
      if (subscribed.rowCount)
        await ctx.target.client.query(subscriptionConnectionSql(ctx.name, ctx.source.host.replicationUrl));
      notice(
        ctx,
        `host ${ctx.source.host.name} failed over (timeline ${before!.source} → ${now.source}); replication slot ${ctx.name} survived on the new primary: the move goes on`,
      );
    }
    await recordTimelines(ctx, now);
    return step;
  }
  if (switched > 0) {
    // A wave fenced by the killed run takes writes on the source again (its shards stay there).
    if (step !== 'switched' && ctx.current.fenceStartedAtMs !== null) await releaseWave(ctx);
    throw new HostError(
      lostSlot ? ctx.source.host.name : ctx.target.host.name,
      `${why}; ${switched} of the move's ${ctx.waves.length} waves are switched already, so its copy cannot be restarted and the move cannot be undone; ${shardsPhrase(ctx.waves.slice(switched).flat())} stay on host ${ctx.source.host.name} (docs/moves.md, "Failovers during a move")`,
      { shard: ctx.shards[0]!, code: 'SLOT_LOST', data: { moveId: ctx.moveId, slot: ctx.name, step } },
    );
  }
  notice(
    ctx,
    `${why}; the changes since the copy cannot be streamed: restarting the copy of ${shards} from a new slot (the fence, the replication and the target's copies undone first)`,
  );
  // The undos of an abort (move.ts), without recording one: the fence first lifted, the target's
  // copies and chunk records dropped, then the move recorded back at `prepared`.
  for (const undo of undosAfter('online', step)) await undo(ctx);
  // No wave switched: the cut-over starts again from the first wave, with nothing of the old one.
  beginWave(ctx, 0);
  ctx.copied = false;
  await record(ctx, 'prepared', 'running', { quiet: true });
  await recordTimelines(ctx, now);
  return 'prepared';
}

async function recordTimelines(ctx: MoveContext, timelines: Timelines): Promise<void> {
  await Promise.all(
    [ctx.source.client, ctx.target.client].map((client) => recordDetail(client, ctx.moveId, { timelines })),
  );
}
