import type pg from 'pg';
import { shardSchemaName } from '../config/types.js';
import { HostError, resumeOrAbort, ShardctlError } from '../errors.js';
import { describePgError } from '../fleet/connect.js';
import { ASYNC_COMMIT_SQL, DURABLE_FLUSH_SQL, MOVE_ABORTING } from '../fleet/control.js';
import { errorHost } from '../fleet/session.js';
import { HOST_SILENT } from '../fleet/silence.js';
import { dropShardSql } from '../fleet/sql.js';
import { shardsPhrase } from '../config/ranges.js';
import { awaitedLater } from '../promises.js';
import { endQuietly, rollbackQuietly } from '../pg/quiet.js';
import { refreshMaterializedViewSql, renameWithStubSql, type Grant } from './sql/cleanup.js';
import { SHARD_SCHEMA_NAMES_SQL, ACTIVE_SHARDS_SQL } from './sql/control.js';
import { dropUnusedFenceGuardsSql } from './sql/leftovers.js';
import { oldCopyName } from './sql/names.js';
import { RESET_SYNCHRONOUS_COMMIT_SQL } from './sql/session.js';
import { faultAfter, recordDetail, stepsFor, type MoveMode, type MoveStep } from './state.js';
import { CLEANUP_CHUNK, CLEANUP_WORKER, moveWorker } from './workers.js';
import { groupBySchema, shardTables, MATERIALIZED_VIEWS_SQL, SCHEMA_GRANTS_SQL, TABLE_GRANTS_SQL } from './catalog.js';
import { beginWave, type MoveContext, notice, schemasOf, waveShards } from './context.js';
import { record } from './progress.js';
import { endLogs } from './tail.js';
import { createAndCopy, createTargets, copyFromSnapshot, copyShards, dropTargets } from './copy.js';
import {
  publish,
  subscribe,
  waitForSync,
  dropReplication,
  dropPublicationAndSlot,
  deleteMarkers,
} from './replication.js';
import { dropSubscription } from './leftovers.js';
import { DELETE_CHUNKS_SQL } from './chunks.js';
import { fence } from './fence.js';
import { endFenceTimeouts, releaseWave, watchFence } from './fence-limit.js';
import { dropPreVerification } from './pre-verification.js';
import { waitForCatchUp } from './catch-up.js';
import { carrySequences } from './sequences.js';
import { verify, switchMap, requireNotSwitched, type UndoThenReport } from './switch.js';
import { undoFence } from './unfence.js';

/**
 * The move engine: the steps of moving a batch of logical shards from one host to another, online
 * (logical replication) or offline (COPY with writes fenced), each recorded on both hosts once
 * done, so a move cut off at any point is finished (runSteps from the last recorded step) or undone
 * (abortMove: each step's undo beside its action in STEPS). A single shard is a batch of one.
 * Online, the cut-over runs in waves (waves.ts) so that no shard refuses writes for long. The entry
 * (run.ts) connects, runs the preflight and decides which of these to call.
 */

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
  while (next < steps.length) {
    const step = steps[next]!;
    // From the fence to the switch a target that stops answering is not waited for past the fence
    // limit (watchFence), in the step and in its undo alike.
    const unwatch = ctx.mode === 'online' && FENCE_WATCHED.includes(step) ? watchFence(ctx) : undefined;
    try {
      let outcome: UndoThenReport | void;
      try {
        outcome = await STEPS[step].action(ctx);
      } catch (error) {
        await releaseAfterFailure(ctx, step, error);
        throw error;
      }
      if (outcome) await undoThenReport(ctx, step, outcome);
    } catch (error) {
      await endFenceTimeouts(ctx);
      await dropPreVerification(ctx);
      // A host that stopped answering is a failure of the step like any lost connection: say how to go on.
      if (error instanceof ShardctlError && error.code !== HOST_SILENT) throw error;
      throw new HostError(
        errorHost(error) ?? ctx.source.host.name,
        `move ${ctx.moveId} failed at step ${step}: ${describePgError(error)}; resume the move to retry, or abort it to undo`,
        {
          shard: ctx.shards[0]!,
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
    // only be finished by aborting again (run.ts refuses to resume it).
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

/**
 * A step of an online cut-over failed while its wave was fenced, before the switch: the wave is
 * released (writable again on the source, the move recorded back at `synced`) so that no failure
 * keeps it fenced until someone resumes or aborts the move, and that is said. A wave the failing
 * step released already (the fence limit) is not fenced any more; the switch is left as it is (it
 * may have made the target's copies writable). If the source cannot be reached, the wave stays
 * fenced, and that is said too.
 */
async function releaseAfterFailure(
  ctx: MoveContext,
  step: MoveStep,
  failure: unknown,
  options: { abortOnly?: boolean } = {},
): Promise<void> {
  const then = options.abortOnly
    ? 'abort the move to finish undoing it'
    : 'resume the move to retry the cut-over, or abort it';
  const until = options.abortOnly ? 'the move is aborted' : 'the move is resumed or aborted';
  const steps = stepsFor(ctx.mode);
  const at = steps.indexOf(step);
  if (ctx.mode !== 'online' || ctx.current.fenceStartedAtMs === null) return;
  if (at < steps.indexOf('fenced') || at >= steps.indexOf('switched')) return;
  const which = shardsPhrase(waveShards(ctx));
  const why = describePgError(failure);
  try {
    await releaseWave(ctx);
    notice(
      ctx,
      `host ${ctx.source.host.name}: ${which} unfenced after step ${step} failed (${why}), writable again; ${then}`,
    );
  } catch (error) {
    notice(
      ctx,
      `host ${ctx.source.host.name}: ${which} could not be unfenced after step ${step} failed (${why}): ${describePgError(error)}; they refuse writes until ${until}`,
    );
  }
}

/** The next wave starts from the fence: recorded back at `synced`, with its number. */
async function nextWave(ctx: MoveContext): Promise<void> {
  // The switched wave's verification was ended by its verify; a session of it left would not be ended by the next wave's.
  await dropPreVerification(ctx);
  beginWave(ctx, ctx.wave + 1);
  await record(ctx, 'synced', 'running', { quiet: true });
}

/** The steps of an online wave from its fence to its switch, which watchFence watches. */
const FENCE_WATCHED: readonly MoveStep[] = ['fenced', 'caught-up', 'sequences-carried', 'verified', 'switched'];

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
 * only aborted again (run.ts refuses --resume). On both, or nothing is undone: a record that lacked
 * it could outlive the other (the abort recorded on one host only) and be resumed.
 */
async function recordAborting(ctx: MoveContext): Promise<void> {
  await Promise.all(
    [ctx.source.client, ctx.target.client].map((client) => recordDetail(client, ctx.moveId, { [MOVE_ABORTING]: true })),
  );
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

/**
 * Replication objects removed; each old copy kept fenced under a new name until gc, or dropped;
 * materialized views refreshed on the target. What is left to do is decided by the source's control
 * rows, not by what schemas exist: after the rename a schema of views keeps the old name, so
 * existence cannot tell a finished clean-up from an interrupted one.
 */
async function cleanUp(ctx: MoveContext): Promise<void> {
  const { source } = ctx;
  // The target drops the subscription (which stops its apply worker and drops the slot over a
  // connection of its own) while the source renames or drops the old copies: they are fenced, so
  // nothing streams from them any more, and neither waits for the other. The publication and the
  // slot, on the source's session, go after the renames.
  const unsubscribed = awaitedLater(dropSubscription(ctx.target.client, ctx.name));
  // Read meanwhile, queued behind the drop; awaited after the renames.
  const views = awaitedLater(
    ctx.target.client.query<{ schemaname: string; matviewname: string }>(MATERIALIZED_VIEWS_SQL, [
      schemasOf(ctx, ctx.shards),
    ]),
  );
  try {
    const work = await cleanUpWork(ctx);
    // One transaction per shard (its rename or drop with its control row), CLEANUP_CHUNK of them per
    // round trip, none waiting for the WAL flush; the flush after the last covers all of them. A crash
    // before it can undo some, which the control rows show and a resumed clean-up redoes. A second
    // session takes its share of the round trips once it has connected (none if it cannot).
    const chunks: string[] = [];
    for (let i = 0; i < work.length; i += CLEANUP_CHUNK) chunks.push(work.slice(i, i + CLEANUP_CHUNK).join('\n'));
    const helping = chunks.length > 1 ? openHelper(ctx) : null;
    const settled = await Promise.allSettled([
      renameOn(source.client, chunks),
      helping?.then(async (helper) => {
        if (!helper) return;
        try {
          await renameOn(helper, chunks);
        } finally {
          await endQuietly(helper);
        }
      }),
    ]);
    for (const s of settled) if (s.status === 'rejected') throw s.reason;
    await source.client.query(DURABLE_FLUSH_SQL);
  } finally {
    // A failed rename leaves the target's session to the caller's undo only once the drop has ended.
    await unsubscribed.catch(() => undefined);
  }
  await unsubscribed;
  await dropPublicationAndSlot(ctx);
  // With the old copies dropped, the guard their fence triggers called.
  if (ctx.options.dropSource) await source.client.query(dropUnusedFenceGuardsSql({ moveId: ctx.moveId }));
  for (const v of (await views).rows) {
    await ctx.target.client.query(refreshMaterializedViewSql(v.schemaname, v.matviewname));
    ctx.refreshed.push(`${v.schemaname}.${v.matviewname}`);
  }
  // The change logs the old copies keep (they refuse every write) off, and every entry gone.
  await Promise.all([
    deleteMarkers(ctx),
    ctx.target.client.query(DELETE_CHUNKS_SQL, [ctx.moveId]),
    endLogs(ctx.source.client, ctx.moveId),
    endLogs(ctx.target.client, ctx.moveId),
  ]);
}

/**
 * The clean-up's SQL: each old copy's rename (or drop), for the shards whose source schema still
 * has the shard's name in the source's control rows.
 */
async function cleanUpWork(ctx: MoveContext): Promise<string[]> {
  const rows = await ctx.source.client.query<{ shard: number; schema_name: string }>(SHARD_SCHEMA_NAMES_SQL, [
    ctx.shards,
  ]);
  const current = new Map(rows.rows.map((r) => [r.shard, r.schema_name]));
  if (ctx.options.dropSource) {
    return ctx.shards.flatMap((shard) => {
      const now = current.get(shard);
      return now === undefined ? [] : [dropShardSql(shard, [now, shardSchemaName(ctx.config, shard)])];
    });
  }
  const renaming = ctx.shards.filter((shard) => current.get(shard) === shardSchemaName(ctx.config, shard));
  return renamesWithStubs(ctx, renaming);
}

/**
 * The clean-up's round trips taken one by one from `chunks` (shared with the other session) on
 * `client`, committing without waiting for the WAL flush; on a failure its aborted transaction is
 * rolled back (the shards before it are done) and the failure thrown.
 */
async function renameOn(client: pg.Client, chunks: string[]): Promise<void> {
  await client.query(ASYNC_COMMIT_SQL);
  try {
    for (let sql = chunks.shift(); sql !== undefined; sql = chunks.shift()) await client.query(sql);
  } catch (error) {
    // The other session stops after its current round trip.
    chunks.length = 0;
    // A failed statement leaves its shard's transaction open, aborted: the shards before it are done.
    await rollbackQuietly(client);
    throw error;
  } finally {
    // Only the session's commit mode: on a broken connection the flush after fails and says so.
    await client.query(RESET_SYNCHRONOUS_COMMIT_SQL).catch(() => undefined);
  }
}

/**
 * A second session on the source for the clean-up's renames: the spare the last wave's fence opened
 * (fence.ts), else a new one; null when none can be had (the move's session then does them
 * all).
 */
async function openHelper(ctx: MoveContext): Promise<pg.Client | null> {
  return moveWorker(ctx, ctx.source.host, CLEANUP_WORKER).catch(() => null);
}

/**
 * The SQL of each shard's rename (see renameWithStubSql), with the tables and grants read from the
 * source's catalog in one query each for all of them.
 */
async function renamesWithStubs(ctx: MoveContext, shards: readonly number[]): Promise<string[]> {
  if (shards.length === 0) return [];
  const { source } = ctx;
  const schemas = schemasOf(ctx, shards);
  const [tables, schemaGrants, tableGrants] = await Promise.all([
    shardTables(source.client, schemas, 'all'),
    source.client.query<Grant & { nspname: string }>(SCHEMA_GRANTS_SQL, [schemas]),
    source.client.query<Grant & { nspname: string }>(TABLE_GRANTS_SQL, [schemas]),
  ]);
  const tablesOf = groupBySchema(tables, (t) => t.schema);
  const schemaGrantsOf = groupBySchema(schemaGrants.rows, (g) => g.nspname);
  const tableGrantsOf = groupBySchema(tableGrants.rows, (g) => g.nspname);
  return shards.map((shard) => {
    const schema = shardSchemaName(ctx.config, shard);
    return renameWithStubSql({
      shard,
      schema,
      renamed: oldCopyName(schema, ctx.moveId),
      targetHost: ctx.target.host.name,
      tables: (tablesOf.get(schema) ?? []).map((t) => t.table),
      schemaGrants: schemaGrantsOf.get(schema) ?? [],
      tableGrants: tableGrantsOf.get(schema) ?? [],
    });
  });
}
