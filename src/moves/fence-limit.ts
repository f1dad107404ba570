import pg from 'pg';
import { shardsPhrase } from '../config/ranges.js';
import { HostError, resumeOrAbort } from '../errors.js';
import { describePgError } from '../fleet/connect.js';
import { answersWithin, cutOff, waitState } from '../fleet/silence.js';
import { statementTimeoutSql, RESET_STATEMENT_TIMEOUT_SQL } from './sql/session.js';
import { recordStep } from './state.js';
import { rollbackQuietly } from '../pg/quiet.js';
import { type MoveContext, type WaveState, waveShards } from './context.js';
import { progress } from './progress.js';
import { inflect } from '../text.js';
import { dropPreVerification } from './pre-verification.js';
import { unfence } from './unfence.js';

/**
 * The fence limit: no shard refuses writes longer than maxFencedMs. The remaining time, statement
 * bounds under the fence, the watchdog that cuts a wave off at the limit, and stopCutOver (unfence,
 * stop, resumable).
 */

/**
 * What is left of this run's fence limit. A run that finds its wave already fenced (resumed after
 * a kill) starts its own limit when it first asks.
 */
export function fenceRemainingMs(ctx: MoveContext): number {
  ctx.current.fenceDeadline ??= performance.now() + ctx.settings.maxFencedMs;
  return ctx.current.fenceDeadline - performance.now();
}

/**
 * How far past the fence limit a statement of the cut-over may run: the source's and target's
 * statement timeout is set again only once it was set this long ago (each SET is a round trip while
 * writes wait).
 */
const TIMEOUT_SLACK_MS = 250;

/**
 * Runs one wait of the cut-over within what is left of the fence limit: every statement the move's
 * sessions (and `also`) run meanwhile has that as its statement timeout (set again when it was set
 * over TIMEOUT_SLACK_MS ago), so no lock queue on either host can hold the wave fenced past the
 * limit. Past it, the wave is unfenced and the move stops, naming `what` it waited for. The
 * timeouts stay until the wave switches or stops (endFenceTimeouts).
 */
export async function underFence<T>(
  ctx: MoveContext,
  what: string,
  fn: () => Promise<T>,
  also: readonly pg.Client[] = [],
): Promise<T> {
  const remaining = fenceRemainingMs(ctx);
  if (remaining <= 0) return stopCutOver(ctx, what);
  const now = performance.now();
  const stale = [ctx.source.client, ctx.target.client].filter(
    (c) => now - (ctx.timeoutsSetAt.get(c) ?? -Infinity) > TIMEOUT_SLACK_MS,
  );
  try {
    // Noted as they are sent: a SET that fails part way (a target cut off) still leaves the other
    // host's timeout set, which endFenceTimeouts must reset.
    for (const c of stale) ctx.timeoutsSetAt.set(c, now);
    await Promise.all([...stale, ...also].map((c) => c.query(statementTimeoutSql(remaining))));
    return await fn();
  } catch (error) {
    if ((error as { code?: string }).code !== '57014' || fenceRemainingMs(ctx) > 50) {
      // The other host's part of `fn` may still be running (Promise.all rejects at the first
      // failure): a string of statements it fails part way leaves its transaction aborted, in which
      // the unfence would run. Queued behind it, this rollback clears that.
      await rollbackQuietly(ctx.source.client);
      throw error;
    }
    // A statement of a BEGIN … COMMIT string left its transaction aborted.
    // Only leaves the transaction the timeout aborted; stopCutOver reports the stop whatever this does.
    await Promise.all([ctx.source.client, ctx.target.client].map(rollbackQuietly));
    return stopCutOver(ctx, what, error);
  }
}

/** How long past the fence limit a fenced wait may go unanswered before the move cuts off its sessions on the target. */
const FENCE_CUTOFF_SLACK_MS = 1_000;

/**
 * Watches a fenced wave from its fence until its switch is sent: a target that stops answering
 * (frozen, black-holed) cannot deliver the statement timeouts that bound the cut-over's waits, and
 * would keep the wave fenced until its silence is noticed (up to twice hostTimeout). Once
 * FENCE_CUTOFF_SLACK_MS past the fence limit, if one of the move's sessions on the target (its own,
 * the verification's) has been waiting that long with nothing read, and a new connection cannot run
 * SELECT 1 there within the slack either, all of them are cut off (cutOff): the wait fails, and the
 * source, which holds the fence, releases the wave, its statements on the target failing at once. A
 * target that answers is never cut off. Not once the switch is sent (ctx.current.switchSent): the target
 * may have taken the shards, and the move can only go forward. Returns the function that stops the
 * watch.
 */
export function watchFence(ctx: MoveContext): () => void {
  const quiet = new Map<pg.Client, { bytes: number; since: number }>();
  let probing = false;
  let stopped = false;
  const timer = setInterval(() => {
    const now = performance.now();
    const deadline = ctx.current.fenceDeadline;
    const pre = ctx.current.pre?.target ?? null;
    // Every target session seen during the watch stays watched: the release ends the verification's
    // (a COMMIT) after it was dropped from the wave's state.
    if (pre && !quiet.has(pre)) quiet.set(pre, { bytes: -1, since: now });
    if (!quiet.has(ctx.target.client)) quiet.set(ctx.target.client, { bytes: -1, since: now });
    const silent = [...quiet].some(([client, seen]) => {
      const state = waitState(client);
      if (!state) return false;
      if (!state.waiting || seen.bytes !== state.bytesRead) {
        quiet.set(client, { bytes: state.bytesRead, since: now });
        return false;
      }
      return now - seen.since >= FENCE_CUTOFF_SLACK_MS;
    });
    if (!silent || probing || deadline === null || ctx.current.switchSent || now < deadline + FENCE_CUTOFF_SLACK_MS)
      return;
    // Silence alone proves nothing (a long statement of an undo, a lock queue): a new connection
    // must not be able to run SELECT 1 within the slack either.
    probing = true;
    void answersWithin(ctx.target.host, FENCE_CUTOFF_SLACK_MS).then((failure) => {
      probing = false;
      if (failure === null) {
        // It answers: busy, not gone. Looked at again after another slack of silence.
        for (const client of quiet.keys()) quiet.set(client, { bytes: -1, since: performance.now() });
        return;
      }
      if (stopped || ctx.current.switchSent || ctx.current.fenceDeadline === null) return;
      // Every session of the move there is cut off, so that the release's statements on the target
      // fail at once instead of waiting in turn.
      const reason = `did not answer within the fence limit (${(ctx.settings.maxFencedMs / 1000).toFixed(1)} s) while ${shardsPhrase(waveShards(ctx))} refused writes, nor a new connection within ${FENCE_CUTOFF_SLACK_MS / 1000} s (${failure}); the move cut off its sessions there`;
      for (const client of quiet.keys()) cutOff(client, ctx.target.host, reason);
    });
  }, FENCE_WATCH_INTERVAL_MS);
  timer.unref();
  return () => {
    stopped = true;
    clearInterval(timer);
  };
}

/** How often watchFence looks. */
const FENCE_WATCH_INTERVAL_MS = 100;

/**
 * The source's and target's statement timeouts of the cut-over (underFence) back to the server's
 * default (the move sets no other): once the wave switched, and before anything else runs after a
 * stop. The RESET runs under the timeout it replaces: one that timeout cancels is sent again (a
 * few times). A connection that cannot reset is broken: the move's next statement on it fails and
 * says so.
 */
export async function endFenceTimeouts(ctx: MoveContext): Promise<void> {
  const clients = [...ctx.timeoutsSetAt.keys()];
  ctx.timeoutsSetAt.clear();
  const reset = async (c: pg.Client): Promise<void> => {
    for (let attempt = 0; attempt < 3; attempt++) {
      try {
        await c.query(RESET_STATEMENT_TIMEOUT_SQL);
        return;
      } catch (error) {
        // Only a RESET its own timeout cancelled is worth sending again.
        if ((error as { code?: string }).code !== '57014') return;
      }
    }
  };
  await Promise.all(clients.map(reset));
}

/** What the current fence attempt's string read (the wave's fenceReads), or null: an earlier attempt's, or none. */
export function currentFenceReads(ctx: MoveContext): WaveState['fenceReads'] {
  const reads = ctx.current.fenceReads;
  return reads?.marker === ctx.current.fenceMarker ? reads : null;
}

/** Keeps the longest time the shards of this move refused writes, across waves and runs. */
export function noteBlocked(ctx: MoveContext): void {
  if (ctx.current.fenceStartedAtMs !== null)
    ctx.writeBlockedMs = Math.max(ctx.writeBlockedMs ?? 0, Date.now() - ctx.current.fenceStartedAtMs);
}

/**
 * The wave made writable again after its cut-over stopped short of the switch (the fence limit, a
 * later wave's failed verification, any failure while it was fenced): the move's own sessions first
 * let go of everything they hold, the move is recorded back at `synced`, so that --resume fences
 * the wave again, and the shards are unfenced. In that order: a record still at `fenced` would let
 * --resume verify and switch shards that take writes. One host's record is enough (--resume
 * carries on from the earlier of the two, reconcileRecords): a target that stopped answering does
 * not keep the source fenced. Keeps how long the shards refused writes (ctx.writeBlockedMs). Only
 * for a wave this run fenced (ctx.current.fenceStartedAtMs) or found fenced.
 */
export async function releaseWave(ctx: MoveContext): Promise<void> {
  await endFenceTimeouts(ctx);
  await dropPreVerification(ctx);
  noteBlocked(ctx);
  ctx.current.fenceMarker = null;
  ctx.current.fenceStartedAtMs = null;
  ctx.current.fenceDeadline = null;
  const detail = progress(ctx);
  const recorded = await Promise.allSettled(
    [ctx.source, ctx.target].map((side) => recordStep(side.client, ctx.moveId, 'synced', 'running', detail)),
  );
  const refused = recorded.filter((r): r is PromiseRejectedResult => r.status === 'rejected');
  if (refused.length === recorded.length) throw refused[0]!.reason;
  await unfence(ctx, waveShards(ctx));
}

/**
 * The fence limit is reached: the wave is released (releaseWave), and the move stops, resumable,
 * naming what it waited for and how long the shards refused writes.
 */
export async function stopCutOver(ctx: MoveContext, what: string, cause?: unknown): Promise<never> {
  const shards = waveShards(ctx);
  const which = shardsPhrase(shards);
  const limit = `${(ctx.settings.maxFencedMs / 1000).toFixed(1)} s`;
  // Read after the release, which notes how long the shards refused writes.
  const data = () => ({
    moveId: ctx.moveId,
    shards: ctx.shards,
    waitedFor: what,
    writeBlockedMs: ctx.writeBlockedMs ?? 0,
  });
  try {
    await releaseWave(ctx);
  } catch (error) {
    throw new HostError(
      ctx.source.host.name,
      `move ${ctx.moveId}: the fence limit (${limit}) was reached while waiting for ${what}, and ${which} could not be unfenced: ${describePgError(error)}. ` +
        `Resume the move, or abort it`,
      {
        shard: shards[0]!,
        code: 'FENCE_LIMIT',
        cause: cause ?? error,
        data: data(),
        next: resumeOrAbort(ctx.shards),
      },
    );
  }
  throw new HostError(
    ctx.source.host.name,
    `move ${ctx.moveId}: ${which} refused writes for ${((ctx.writeBlockedMs ?? 0) / 1000).toFixed(1)} s, the fence limit is ${limit}; the move waited for ${what}. ` +
      `${inflect(shards.length, 'It was', 'They were')} unfenced and ${inflect(shards.length, 'is', 'are')} writable again on ${ctx.source.host.name}. ` +
      `Resume the move to retry the cut-over, or abort it`,
    { shard: shards[0]!, code: 'FENCE_LIMIT', cause, data: data(), next: resumeOrAbort(ctx.shards) },
  );
}
