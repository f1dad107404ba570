import { HostError, resumeOrAbort, ShardctlError } from '../errors.js';
import { describePgError } from '../fleet/connect.js';
import { MOVE_ABORTING } from '../fleet/control.js';
import { errorHost } from '../fleet/session.js';
import { HOST_SILENT } from '../fleet/silence.js';
import { ACTIVE_SHARDS_SQL } from './sql/control.js';
import { dropUnusedFenceGuardsSql } from './sql/leftovers.js';
import { faultAfter, recordDetailOnBoth, stepsFor, type MoveMode, type MoveStep } from './state.js';
import { beginWave, type MoveContext, waveShards } from './context.js';
import { watchStandbySlots } from './failover-state.js';
import { record } from './progress.js';
import { createAndCopy, createTargets, copyFromSnapshot, copyShards, dropTargets } from './copy.js';
import { publish, subscribe, waitForSync, dropReplication, deleteMarkers } from './replication.js';
import { fence } from './fence.js';
import { endFenceTimeouts, watchFence } from './fence-limit.js';
import { dropPreVerification } from './pre-verification.js';
import { waitForCatchUp } from './catch-up.js';
import { carrySequences } from './sequences.js';
import { verify, switchMap, requireNotSwitched, type UndoThenReport } from './switch.js';
import { undoFence } from './unfence.js';
import { cleanUp } from './clean-up.js';
import { releaseAfterFailure } from './release-on-failure.js';
import { throwIfInterrupted } from './interrupt.js';

/**
 * The move engine: the steps of moving a batch of logical shards from one host to another, online
 * (logical replication) or offline (COPY with writes fenced), each recorded on both hosts once
 * done, so a move cut off at any point is finished (runSteps from the last recorded step) or undone
 * (abortMove: each step's undo beside its action in STEPS). A single shard is a batch of one.
 * Each step's action and undo live in a file named after it (copy.ts, replication.ts, fence.ts,
 * catch-up.ts, sequences.ts, switch.ts, clean-up.ts, unfence.ts).
 * Online, the cut-over runs in waves (waves.ts) so that no shard refuses writes for long. The entry
 * (run.ts) connects, runs the preflight and decides which of these to call.
 */

/** A step's action (it may ask for the move to be undone before its failure is reported), or an undo. */
type StepAction = (ctx: MoveContext) => Promise<UndoThenReport | void>;

interface Step {
  readonly action: StepAction;
  /**
   * What undoes the step (abortMove, walking the steps backwards); [] where there is nothing to
   * undo. Each undo is idempotent, and one shared by several steps runs once, at the latest of them.
   */
  readonly undo: readonly StepAction[];
}

const STEPS: Record<MoveStep, Step> = {
  // The move's markers are written from `synced` on, keyed by the move: they go last, with the move.
  prepared: { action: async () => undefined, undo: [deleteMarkers] },
  // Online, the publication and the copy run with the creation (createAndCopy): a run cut off in it
  // may have left a slot and a publication too.
  'target-created': {
    action: (ctx) => (ctx.mode === 'online' ? createAndCopy(ctx) : createTargets(ctx)),
    undo: [dropReplication, dropTargets],
  },
  // The publication, slot and subscription are named after the move and removed together.
  published: { action: publish, undo: [dropReplication] },
  copied: {
    action: async (ctx) => {
      if (ctx.mode === 'offline') await copyShards(ctx, ctx.shards);
      else if (!ctx.copied) await copyFromSnapshot(ctx);
    },
    // Online, the slot (created by the copy); the rows go with the target's copies.
    undo: [dropReplication],
  },
  subscribed: { action: subscribe, undo: [dropReplication] },
  synced: { action: waitForSync, undo: [] },
  // The replication goes before the unfence, although earlier steps created it: once the source is
  // writable again its writes would stream to copies about to be dropped, whose drop would then
  // wait for the apply worker's locks.
  fenced: { action: fence, undo: [dropReplication, undoFence] },
  'caught-up': { action: waitForCatchUp, undo: [] },
  // The target's sequences go with its copies.
  'sequences-carried': { action: carrySequences, undo: [] },
  // Its tracking and change logs are removed by the verification itself, or with the fence's undo.
  verified: { action: verify, undo: [] },
  // Never undone: abortMove refuses a move that switched any shard.
  switched: { action: switchMap, undo: [] },
  cleaned: { action: cleanUp, undo: [] },
};

/** The steps of an online wave from its fence to its switch, which watchFence watches. */
const FENCE_WATCHED: readonly MoveStep[] = ['fenced', 'caught-up', 'sequences-carried', 'verified', 'switched'];

/** Runs the steps after `after`; online, the cut-over steps once per wave. */
export async function runSteps(ctx: MoveContext, after: MoveStep): Promise<void> {
  const steps = stepsFor(ctx.mode);
  if (after === 'switched' && ctx.wave < ctx.waves.length - 1) {
    // Killed between a wave's switch and the next wave's start.
    await nextWave(ctx);
    after = 'synced';
  }
  const at = steps.indexOf(after);
  if (at >= steps.indexOf('fenced') - 1 && at < steps.indexOf('verified')) {
    // The steps from the fence to the verification are not written (progress.ts): a run killed
    // inside the switch, after the target's copies became active, is recorded before the fence.
    // Active copies were verified by that run, and may take writes already: only the switch is left.
    const active = await ctx.target.client.query(ACTIVE_SHARDS_SQL, [waveShards(ctx)]);
    if ((active.rowCount ?? 0) > 0) after = 'verified';
  }
  let next = steps.indexOf(after) + 1;
  const switchAt = steps.indexOf('switched');
  while (next < steps.length) {
    const step = steps[next]!;
    // From the fence to the switch a target that stops answering is not waited for past the fence
    // limit (watchFence), in the step and in its undo alike.
    const fencedStep = FENCE_WATCHED.includes(step);
    const unwatch = ctx.mode === 'online' && fencedStep ? watchFence(ctx) : undefined;
    try {
      // Not while fenced: a round trip there is one more while writes wait.
      if (!fencedStep || step === 'fenced') await watchStandbySlots(ctx);
      let outcome: UndoThenReport | void;
      try {
        // Asked to stop: no step is started before the switch (a fenced wave is then released below).
        if (switchAt < 0 || next <= switchAt) throwIfInterrupted(ctx);
        outcome = await STEPS[step].action(ctx);
      } catch (error) {
        await releaseAfterFailure(ctx, step, error);
        throw error;
      }
      if (outcome) await undoThenReport(ctx, step, outcome);
    } catch (error) {
      await endFenceTimeouts(ctx);
      await dropPreVerification(ctx);
      // A host that stopped answering is a failure of the step like any lost connection, and so is
      // a step's own failure that says nothing of what to do (a copy whose connection was lost):
      // say how to go on. Errors that carry their advice (or refuse) keep it.
      const plainFailure =
        error instanceof HostError && error.code === 'MOVE_FAILED' && error.next.length === 0 && !error.details.length;
      if (error instanceof ShardctlError && error.code !== HOST_SILENT && !plainFailure) throw error;
      const reason = error instanceof HostError ? error.reason : describePgError(error);
      throw new HostError(
        errorHost(error) ?? ctx.source.host.name,
        `move ${ctx.moveId} failed at step ${step}: ${reason}; resume the move to retry, or abort it to undo`,
        {
          shard: error instanceof HostError ? (error.shard ?? ctx.shards[0]!) : ctx.shards[0]!,
          code: 'MOVE_FAILED',
          cause: error,
          data: { moveId: ctx.moveId, step, shards: ctx.shards },
          next: resumeOrAbort(ctx.shards),
        },
      );
    } finally {
      unwatch?.();
    }
    if (step === 'switched' && ctx.wave < ctx.waves.length - 1) {
      await record(ctx, step, 'running');
      await nextWave(ctx);
      next = steps.indexOf('synced') + 1;
      continue;
    }
    await record(ctx, step, step === 'cleaned' ? 'done' : 'running');
    next += 1;
  }
}

/** A step asked for the move to be undone before its failure is reported: undo, then throw it. */
async function undoThenReport(ctx: MoveContext, step: MoveStep, outcome: UndoThenReport): Promise<never> {
  await endFenceTimeouts(ctx);
  try {
    await abortMove(ctx, outcome.undoFrom);
  } catch (undo) {
    // Refused before anything was undone (the move switched): that refusal is the advice.
    const switched = undo instanceof ShardctlError && undo.code === 'MOVE_SWITCHED';
    // An undo that failed part way (a lost target) must not leave the sources fenced, and can
    // only be finished by aborting again (resume.ts refuses to resume it).
    await releaseAfterFailure(ctx, step, undo, { abortOnly: !switched });
    if (switched) throw undo;
    const failure = outcome.failure;
    throw new HostError(
      errorHost(undo) ?? ctx.source.host.name,
      `move ${ctx.moveId} failed at step ${step} (${failure.message}), and undoing it failed: ${describePgError(undo)}; abort it to finish the undo`,
      {
        shard: ctx.shards[0]!,
        code: 'MOVE_FAILED',
        cause: undo,
        details: failure.details,
        data: { moveId: ctx.moveId, step, shards: ctx.shards },
        next: [{ action: 'abort', shards: ctx.shards }],
      },
    );
  }
  throw outcome.failure;
}

/** The next wave starts from the fence: recorded back at `synced`, with its number. */
async function nextWave(ctx: MoveContext): Promise<void> {
  // The switched wave's verification was ended by its verify; a session of it left would not be ended by the next wave's.
  await dropPreVerification(ctx);
  beginWave(ctx, ctx.wave + 1);
  await record(ctx, 'synced', 'running', { quiet: true });
}

/**
 * Undoes a move that has not switched any shard: the recorded steps, and the one that may have
 * been cut off after `step` (half done, so undone too), walked backwards, each undone by its own
 * undo (STEPS); then the move recorded as aborted. Nothing is left behind: no subscription,
 * publication or slot, the sources writable again, the target's copies dropped.
 */
export async function abortMove(ctx: MoveContext, step: MoveStep): Promise<void> {
  await requireNotSwitched(ctx, step);
  await recordAborting(ctx);
  // This process's snapshots of a verification begun before the fence (the logs go with the fence's undo).
  await dropPreVerification(ctx);
  const undos = undosAfter(ctx.mode, step);
  for (const [i, undo] of undos.entries()) {
    await undo(ctx);
    if (i === 0) faultAfter('first-undo');
  }
  await record(ctx, step, 'aborted');
  // The guard of its fence triggers and its log functions, once no trigger calls them (one a busy
  // table kept stays with it); on the target, the log functions its dropped copies called.
  await Promise.all(
    [ctx.source.client, ctx.target.client].map((client) =>
      client.query(dropUnusedFenceGuardsSql({ moveId: ctx.moveId })),
    ),
  );
}

/**
 * Said in the move's record on both hosts before anything is undone: an abort cut off part way (its
 * replication dropped, its shards unfenced, part of its copies dropped) can no longer be resumed,
 * only aborted again (resume.ts refuses --resume). On both, or nothing is undone: a record that lacked
 * it could outlive the other (the abort recorded on one host only) and be resumed.
 */
async function recordAborting(ctx: MoveContext): Promise<void> {
  await recordDetailOnBoth(ctx, { [MOVE_ABORTING]: true });
}

/**
 * The undos abortMove runs for a move recorded at `step`, in order: those of the steps up to it and
 * of the next (which a crash may have cut off half done), the latest step first, each undo once.
 */
export function undosAfter(mode: MoveMode, step: MoveStep): StepAction[] {
  const steps = stepsFor(mode);
  const undos = steps
    .slice(0, steps.indexOf(step) + 2)
    .reverse()
    .flatMap((s) => STEPS[s].undo);
  return undos.filter((undo, i) => undos.indexOf(undo) === i);
}
