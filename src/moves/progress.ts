import { announce, type MoveContext } from './context.js';
import { faultAfter, recordStep, type MoveRecord, type MoveStep } from './state.js';

/**
 * A move's progress recorded on both hosts: the step, and what the record keeps of the context
 * (read back by moveContext), so a resumed run goes on where this one stopped.
 */

/** What the record keeps of the context, so a resumed run goes on where this one stopped. */
export function progress(ctx: MoveContext): Record<string, unknown> {
  return {
    wave: ctx.wave,
    rowsVerified: ctx.rowsVerified.toString(),
    writeBlockedMs: ctx.writeBlockedMs,
    fenceMarker: ctx.current.fenceMarker,
    fenceStartedAtMs: ctx.current.fenceStartedAtMs,
    ...(ctx.copyBytesPerSecond === null ? {} : { copyBytesPerSecond: ctx.copyBytesPerSecond }),
  };
}

/**
 * The steps between a wave's fence and its switch are announced (and are fault points) but not
 * written: each write would keep the wave fenced longer, and a run that stops among them is carried
 * on from `fenced`, as after a crash right after the fence: the catch-up waits for a new marker, the
 * sequences only move forward, the verification is done again (whole), and an abort undoes the
 * fence. (A run killed inside the switch, after the target's copies became active, is carried on
 * with the switch: runSteps.)
 */
export const UNWRITTEN: ReadonlySet<MoveStep> = new Set(['caught-up', 'sequences-carried', 'verified']);

/** `fenced` is written by the fence itself, with its marker (fenceMarkerSql) and on the target at once. */
const WRITTEN_BY_STEP: ReadonlySet<MoveStep> = new Set(['fenced']);

export async function record(
  ctx: MoveContext,
  step: MoveStep,
  status: MoveRecord['status'],
  options: { quiet?: boolean } = {},
): Promise<void> {
  const detail = progress(ctx);
  // Both at once: a crash between the two leaves them a step apart in either order, and
  // reconcileRecords carries on from the earlier one.
  if (status !== 'running' || !(UNWRITTEN.has(step) || WRITTEN_BY_STEP.has(step)))
    await Promise.all([
      recordStep(ctx.source.client, ctx.moveId, step, status, detail),
      recordStep(ctx.target.client, ctx.moveId, step, status, detail),
    ]);
  // Going back to `synced` for the next wave is no step completing: no announcement, no fault point.
  if (options.quiet) return;
  const wave =
    ctx.waves.length > 1 && ['fenced', 'caught-up', 'sequences-carried', 'verified', 'switched'].includes(step)
      ? ` (wave ${ctx.wave + 1} of ${ctx.waves.length})`
      : '';
  announce(ctx, step, status === 'aborted' ? 'aborted' : `done: ${step}${wave}`);
  // An abort re-records the step it undid: that is no step completing.
  if (status !== 'aborted') faultAfter(step);
}
