import { ShardctlError } from '../errors.js';
import { cancelRequest } from '../pg/cancel.js';
import type { MoveContext } from './context.js';

/** The code of the error a move stopped by its options' signal (MoveOptions.signal) fails with. */
export const INTERRUPTED = 'INTERRUPTED';

/**
 * The run was asked to stop (its signal aborted; the CLI on SIGINT or SIGTERM during a cut-over):
 * while a wave is fenced and its switch not sent, the statements the move's sessions run now are
 * cancelled, so that the step fails at once and the wave is released (writable again, the move
 * back at `synced`: release-on-failure.ts). Once the switch is sent the move can only go forward,
 * and it does. A wave not fenced is stopped at the next step (throwIfInterrupted).
 */
function interruptCutOver(ctx: MoveContext): void {
  if (!inCutOver(ctx)) return;
  const sessions = [ctx.source.client, ctx.target.client, ctx.current.pre?.source, ctx.current.pre?.target];
  for (const client of sessions) if (client) void cancelRequest(client);
}

/** A wave of the move refuses writes now, and its switch is not sent: stopping it at once would leave it so. */
function inCutOver(ctx: MoveContext): boolean {
  return ctx.mode === 'online' && ctx.current.fenceStartedAtMs !== null && !ctx.current.switchSent;
}

/** The moves run with each signal (a batch runs several), for cutOverUnderway. */
const runs = new WeakMap<AbortSignal, Set<MoveContext>>();

/** Makes `ctx` answer its options' signal (interruptCutOver), and be seen by cutOverUnderway. */
export function watchInterrupt(ctx: MoveContext): void {
  const signal = ctx.options.signal;
  if (!signal) return;
  let contexts = runs.get(signal);
  if (!contexts) runs.set(signal, (contexts = new Set()));
  contexts.add(ctx);
  signal.addEventListener('abort', () => interruptCutOver(ctx), { once: true });
}

/**
 * Whether a move run with `signal` has a wave in its cut-over now (fenced, its switch not sent):
 * then a stop must go through the signal, which releases the wave first, rather than end the
 * process at once (the CLI on SIGINT or SIGTERM).
 */
export function cutOverUnderway(signal: AbortSignal): boolean {
  return [...(runs.get(signal) ?? [])].some(inCutOver);
}

/** Fails the step about to start when the run was asked to stop (see interruptCutOver). */
export function throwIfInterrupted(ctx: MoveContext): void {
  if (ctx.options.signal?.aborted !== true) return;
  throw new ShardctlError(
    INTERRUPTED,
    'the move was stopped before its switch (a signal): run it again with --resume, or --abort',
    { exitCode: 1, data: { moveId: ctx.moveId, shards: ctx.shards } },
  );
}
