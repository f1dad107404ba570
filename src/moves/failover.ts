import { shardsPhrase } from '../config/ranges.js';
import { HostError } from '../errors.js';
import { insertMove, newMoveId, recordDetailOnBoth, stepsFor, type MoveStep } from './state.js';
import { announce, beginWave, moveContext, type MoveContext, notice } from './context.js';
import { record } from './progress.js';
import { runSteps, undosAfter } from './move.js';
import { dropTargets } from './copy.js';
import { dropReplication } from './replication.js';
import { undoFence } from './unfence.js';
import { releaseWave } from './fence-limit.js';
import { ACTIVE_SHARDS_SQL } from './sql/control.js';
import { SUBSCRIPTION_EXISTS_SQL } from './sql/replication.js';
import { SLOT_STATE_SQL, subscriptionConnectionSql } from './sql/failover.js';
import { readPrimarySlot, readStandbySlots, readTimelines, slotUnusable, type Timelines } from './failover-state.js';

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
 * the only holder of the shards. After the last switch the slot is not needed any more. A move of
 * several waves that lost it after an earlier wave's switch is split (continueUnswitched): the
 * switched waves are finished, and their shards' move recorded done; the waves not switched yet
 * go on as a move of their own, whose copy starts from a new slot. docs/moves.md, "Failovers during
 * a move", has the whole argument.
 */

function recordedTimelines(detail: Readonly<Record<string, unknown>>): Timelines | null {
  const t = detail['timelines'] as Partial<Timelines> | undefined;
  return t && typeof t.source === 'number' && typeof t.target === 'number' ? (t as Timelines) : null;
}

/**
 * Before a resumed online move goes on from `step`: whether the slot and the target's applied state
 * survived what happened to the hosts since. Returns the step to go on from: `step`, or `prepared`
 * when the copy was restarted (everything after it undone), or `cleaned` when the move was split
 * and both its parts were carried to the end here (continueUnswitched).
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
  const slot = slotRow.rows[0]?.slot;
  const lostSlot = slotUnusable(slot);
  const targetFailedOver = before !== null && now.target !== before.target;
  const sourceFailedOver = before !== null && now.source !== before.source;
  const why = lostSlot
    ? `replication slot ${ctx.name} on host ${ctx.source.host.name} ${lostSlot}`
    : targetFailedOver
      ? `host ${ctx.target.host.name} failed over (timeline ${before.target} → ${now.target}): it may lack changes it had confirmed to replication slot ${ctx.name}, which will not be sent again`
      : sourceFailedOver
        ? await untrustedSyncedSlot(ctx, slot!, detail)
        : null;
  const shards = shardsPhrase(ctx.shards);
  if (why === null) {
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
    // The same source as before: a standby slot the record no longer lists stays out of it
    // (watchStandbySlots), even if the setting lists it again.
    await recordTimelines(ctx, now, !sourceFailedOver);
    return step;
  }
  if (switched > 0) return continueUnswitched(ctx, step, switched, why, now);
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

/**
 * Why a slot that survived a failover of the source cannot be trusted, or null when it can. A slot
 * the promoted standby synchronized (`synced`) never confirms more than that standby had, but the
 * target may have been sent more: only a primary that lists the standby's physical slot in
 * `synchronized_standby_slots` holds its logical walsenders back until the standby has the WAL. Without
 * that, the target may hold changes the new primary never had, and skip the new primary's own
 * changes up to the LSN it reached on the old timeline (the subscription asks for what follows its
 * last applied change). Nothing read after the promotion can tell (the subscription, when its
 * address lists the standby, follows the failover by itself and moves the slot on): the setting
 * recorded at the move's start (and after each failover it came through) decides. A slot that was
 * not synchronized (a storage-level failover kept the primary's own) is trusted as before.
 */
async function untrustedSyncedSlot(
  ctx: MoveContext,
  slot: Readonly<Record<string, unknown>>,
  detail: Readonly<Record<string, unknown>>,
): Promise<string | null> {
  if (slot['synced'] !== true) return null;
  const waitedFor = Array.isArray(detail['standbySlots']) ? (detail['standbySlots'] as unknown[]) : [];
  const streamedFrom = await readPrimarySlot(ctx.source);
  if (streamedFrom !== '' && waitedFor.includes(streamedFrom)) return null;
  return `host ${ctx.source.host.name} failed over and replication slot ${ctx.name} survived on its new primary, but the old primary did not hold the target back for that standby (its physical slot ${streamedFrom === '' ? '(none)' : streamedFrom} was not in synchronized_standby_slots when recorded${waitedFor.length > 0 ? `: ${waitedFor.join(', ')}` : ''}): host ${ctx.target.host.name} may hold changes the new primary never had`;
}

/**
 * The hosts' timelines and the source's standby slots recorded on both hosts: the slots its setting
 * lists now (a new primary's, or a new slot's), or with `narrow`, only those of the record it still
 * lists.
 */
async function recordTimelines(ctx: MoveContext, timelines: Timelines, narrow = false): Promise<void> {
  const listed = await readStandbySlots(ctx.source);
  const standbySlots = narrow ? ctx.standbySlots.filter((slot) => listed.includes(slot)) : listed;
  ctx.standbySlots = standbySlots;
  await recordDetailOnBoth(ctx, { timelines, standbySlots });
}

/**
 * The slot is lost (or the target failed over) after `switched` of the move's waves were switched:
 * their shards live on the target and take writes there, so nothing of them can be undone, while
 * the shards of the waves left are still on the source, the only holder of what they hold. The
 * move is split in two there. First the waves left are undone as an abort would undo them (the
 * replication dropped, their fence lifted, the target's copies of their shards and the move's chunk
 * records dropped: none of those copies is active); then the switched waves are finished (the
 * clean-up, which needs no slot) and the move recorded done; then a new move of the shards left,
 * its waves those not switched yet, is recorded at `prepared` on both hosts and carried to the end:
 * a copy from a new slot of the source's current primary, then the cut-over under the fence limit.
 * Killed after the first move is done and before the new one is recorded, the shards left are on
 * the source, writable, with nothing of the move left: a new move-shard moves them. Returns
 * `cleaned`: nothing of the first move is left to run.
 */
async function continueUnswitched(
  ctx: MoveContext,
  step: MoveStep,
  switched: number,
  why: string,
  now: Timelines,
): Promise<MoveStep> {
  const doneWaves = ctx.waves.slice(0, switched);
  const leftWaves = ctx.waves.slice(switched);
  const left = leftWaves.flat();
  // The record says these waves are not switched; were a copy active on the target, it could take
  // writes, and dropping it would lose them: refused, as before there was a way on.
  const active = await ctx.target.client.query<{ shard: number }>(ACTIVE_SHARDS_SQL, [left]);
  if ((active.rowCount ?? 0) > 0)
    throw new HostError(
      ctx.target.host.name,
      `${why}; ${shardsPhrase(active.rows.map((r) => r.shard))} of the waves not switched yet are active on host ${ctx.target.host.name}, so their copies cannot be restarted (docs/moves.md, "Failovers during a move")`,
      { shard: left[0]!, code: 'SLOT_LOST', data: { moveId: ctx.moveId, slot: ctx.name, step } },
    );
  const nextId = newMoveId();
  const standbySlots = await readStandbySlots(ctx.source);
  notice(
    ctx,
    `${why}; ${switched} of the move's ${ctx.waves.length} waves are switched already (${shardsPhrase(doneWaves.flat())}, now on host ${ctx.target.host.name}): move ${ctx.moveId} is finished for them, and the copy of ${shardsPhrase(left)} restarts from a new slot as move ${nextId} (their fence, the replication and the target's copies undone first)`,
  );
  // The waves left as an abort undoes them (move.ts, STEPS: the replication before the unfence),
  // numbered as in this move: its guard stays closed for the switched waves, whose old copies stay fenced.
  const rest: MoveContext = { ...ctx, shards: left };
  beginWave(rest, switched);
  await dropReplication(rest);
  // A wave the killed run fenced takes writes on the source again, how long it refused them kept.
  if (step !== 'switched' && ctx.current.fenceStartedAtMs !== null) await releaseWave(ctx);
  await undoFence(rest);
  await dropTargets(rest);
  await recordDetailOnBoth(ctx, { continuedBy: nextId, restarted: left });
  // The switched waves finished: the clean-up of their old copies, the move recorded done.
  const done: MoveContext = { ...ctx, shards: doneWaves.flat(), waves: doneWaves, refreshed: [] };
  beginWave(done, switched - 1);
  await runSteps(done, 'switched');
  // The shards left, a move of their own from the start of the copy.
  const next = moveContext(
    ctx.config,
    { moveId: nextId, mode: 'online', shards: left, detail: { waves: leftWaves, wave: 0 } },
    { source: ctx.source, target: ctx.target },
    ctx.migrations,
    ctx.options,
  );
  await Promise.all(
    [ctx.source, ctx.target].map((side) =>
      insertMove(side.client, {
        moveId: nextId,
        shards: left,
        source: ctx.source.host.name,
        target: ctx.target.host.name,
        mode: 'online',
        step: 'prepared',
        detail: { waves: leftWaves, wave: 0, timelines: now, standbySlots, continues: ctx.moveId },
      }),
    ),
  );
  announce(
    next,
    'prepared',
    `move ${nextId}: ${shardsPhrase(left)} from ${ctx.source.host.name} to ${ctx.target.host.name} (online${leftWaves.length > 1 ? `, cut over in ${leftWaves.length} waves` : ''}), continuing move ${ctx.moveId}`,
  );
  await runSteps(next, 'prepared');
  // The result is the whole batch's: both parts' rows, the longest write block, this run's verification.
  ctx.rowsVerified += next.rowsVerified;
  const blocked = [ctx.writeBlockedMs, next.writeBlockedMs].filter((ms): ms is number => ms !== null);
  ctx.writeBlockedMs = blocked.length > 0 ? Math.max(...blocked) : null;
  ctx.verification = next.verification;
  ctx.refreshed.push(...done.refreshed, ...next.refreshed);
  ctx.chunksCopied += next.chunksCopied;
  ctx.chunksRecopied += next.chunksRecopied;
  ctx.chunksFromLog += next.chunksFromLog;
  ctx.chunksCompared += next.chunksCompared;
  return 'cleaned';
}
