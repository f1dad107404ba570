import { shardsPhrase } from '../config/ranges.js';
import { describePgError } from '../fleet/connect.js';
import { type MoveContext, notice, waveShards } from './context.js';
import { releaseWave } from './fence-limit.js';
import { stepsFor, type MoveStep } from './state.js';

/**
 * A step of an online cut-over failed while its wave was fenced, before the switch: the wave is
 * released (writable again on the source, the move recorded back at `synced`) so that no failure
 * keeps it fenced until someone resumes or aborts the move, and that is said. A wave the failing
 * step released already (the fence limit) is not fenced any more; the switch is left as it is (it
 * may have made the target's copies writable). If the source cannot be reached, the wave stays
 * fenced, and that is said too.
 */
export async function releaseAfterFailure(
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
