import { announce, type MoveContext } from './context.js';
import { faultAfter, recordStep, type MoveRecord, type MoveStep } from './state.js';

/**
 * A move's progress recorded on both hosts: the step, and what the record keeps of the context
 * (read back by moveContext), so a resumed run goes on where this one stopped.
 */

/** What the record keeps of the context, so a resumed run goes on where this one stopped. */
function progress(ctx: MoveContext): Record<string, unknown> {
  return {
    wave: ctx.wave,
    rowsVerified: ctx.rowsVerified.toString(),
    writeBlockedMs: ctx.writeBlockedMs,
    fenceMarker: ctx.fenceMarker,
    fenceStartedAtMs: ctx.fenceStartedAtMs,
  };
}

export async function record(
  ctx: MoveContext,
  step: MoveStep,
  status: MoveRecord['status'],
  options: { quiet?: boolean } = {},
): Promise<void> {
  const detail = progress(ctx);
  await recordStep(ctx.source.client, ctx.moveId, step, status, detail);
  await recordStep(ctx.target.client, ctx.moveId, step, status, detail);
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
