import { shardsPhrase } from '../config/ranges.js';
import { RuntimeFailure, ShardctlError } from '../errors.js';
import { describePgError } from '../fleet/connect.js';
import type { PlannedMove } from './rebalance.js';
import type { BatchMoveResult } from './run.js';

/**
 * The rebalance scheduler: runs a plan's moves (src/moves/rebalance.ts makes the plan) as host
 * pairs free up. A host is never source and target at once; a source gives to one target at a
 * time, a target may take from several sources (a new host fills from every old one at once).
 */

export interface RebalanceMoveResult extends PlannedMove {
  readonly result: BatchMoveResult;
}

/**
 * Runs the moves, each as soon as neither of its hosts is busy and fewer than maxParallel run, in
 * plan order. A target takes from at most `intoLimit(target)` sources at once (default: no bound but
 * maxParallel): an online move into it needs one of its logical replication workers, and a move
 * without one would wait for it. After a failure no further move starts; the ones running finish,
 * then the error names what failed and what was done.
 */
export async function runPlan(
  moves: readonly PlannedMove[],
  maxParallel: number,
  run: (move: PlannedMove) => Promise<BatchMoveResult>,
  intoLimit: (target: string) => number = () => maxParallel,
): Promise<RebalanceMoveResult[]> {
  const pending = [...moves];
  const busy = new Set<string>();
  // Moves running into each target host.
  const targets = new Map<string, number>();
  const running = new Set<Promise<void>>();
  const done: RebalanceMoveResult[] = [];
  const failed: { move: PlannedMove; error: unknown }[] = [];
  for (;;) {
    if (failed.length === 0) {
      for (let i = 0; i < pending.length && running.size < maxParallel;) {
        const move = pending[i]!;
        // A source gives to one target at a time; a target may take from several sources at once.
        const sourceFree = !busy.has(move.source) && (targets.get(move.source) ?? 0) === 0;
        const targetFree =
          !busy.has(move.target) && (targets.get(move.target) ?? 0) < Math.max(1, intoLimit(move.target));
        if (!sourceFree || !targetFree) {
          i += 1;
          continue;
        }
        pending.splice(i, 1);
        busy.add(move.source);
        targets.set(move.target, (targets.get(move.target) ?? 0) + 1);
        const task: Promise<void> = run(move)
          .then(
            (result) => void done.push({ ...move, result }),
            (error: unknown) => void failed.push({ move, error }),
          )
          .finally(() => {
            busy.delete(move.source);
            targets.set(move.target, targets.get(move.target)! - 1);
            running.delete(task);
          });
        running.add(task);
      }
    }
    if (running.size === 0) break;
    await Promise.race(running);
  }
  if (failed.length === 0) return done;
  const lines = [
    ...failed.map(
      ({ move, error }) =>
        `${describeMove(move)} failed: ${error instanceof ShardctlError ? error.message : describePgError(error)}`,
    ),
    ...done.map((m) => `${describeMove(m)} done`),
    ...pending.map((m) => `${describeMove(m)} not started`),
  ];
  throw new RuntimeFailure(
    'REBALANCE_FAILED',
    `rebalance stopped: ${failed.length} of ${moves.length} moves failed; rebalancing again finishes the interrupted moves and plans the rest:\n` +
      lines.map((l) => `  - ${l}`).join('\n'),
    {
      done: done.map(({ source, target, shards }) => ({ source, target, shards })),
      failed: failed.map(({ move: { source, target, shards } }) => ({ source, target, shards })),
    },
    lines,
    // Rebalancing again resumes the failed moves itself: their own resume or abort advice is not the next step.
    [{ action: 'rebalance' }],
  );
}

export function describeMove(move: Pick<PlannedMove, 'source' | 'target' | 'shards'>): string {
  return `${move.source} → ${move.target} (${shardsPhrase([...move.shards])})`;
}
