import type { HostConfig, ShardctlConfig } from '../config/types.js';
import { hostForShard } from '../config/types.js';
import { formatShardList, shardsPhrase } from '../config/ranges.js';
import { RuntimeFailure, ShardctlError, UsageError } from '../errors.js';
import { describePgError } from '../fleet/connect.js';
import { elapsed } from '../clock.js';
import type { MoveResult } from './context.js';
import type { Leftover } from './leftovers.js';

/**
 * A batch of moves, one per source host: the shards grouped by the host they are on, the moves
 * run in parallel (every failure named, with what the others did), and the batch's result.
 */

/** The result of a batch: one move per source host. */
export interface BatchMoveResult {
  readonly outcome: 'moved' | 'aborted' | 'dry-run';
  readonly target: string;
  readonly shards: readonly number[];
  readonly moves: readonly MoveResult[];
  /** Rows verified over every move. Decimal string. */
  readonly rowsMoved: string;
  /** The longest any shard refused writes, over every move; null when nothing was fenced. */
  readonly writeBlockedMs: number | null;
  readonly durationMs: number;
  /** Abort: what killed runs had left (probe subscriptions, replication objects), dropped. */
  readonly leftoversDropped: readonly (Leftover & { host: string })[];
}

/**
 * Runs the moves of a batch in parallel. One failing does not stop the others; when any failed, the
 * error names each failure (and what the others did), after all have finished.
 */
export async function runParts(parts: readonly (() => Promise<MoveResult>)[]): Promise<MoveResult[]> {
  const settled = await Promise.allSettled(parts.map((run) => run()));
  const failures = settled
    .filter((s): s is PromiseRejectedResult => s.status === 'rejected')
    .map((s) => s.reason as unknown);
  if (failures.length === 0) return settled.map((s) => (s as PromiseFulfilledResult<MoveResult>).value);
  if (settled.length === 1) throw failures[0];
  const done = settled
    .filter((s): s is PromiseFulfilledResult<MoveResult> => s.status === 'fulfilled')
    .map((s) => s.value);
  const lines = [
    ...failures.map((f) => (f instanceof ShardctlError ? f.message : describePgError(f))),
    ...done.map((m) => `${shardsPhrase(m.shards)} ${m.outcome} from ${m.source} to ${m.target}`),
  ];
  throw new RuntimeFailure(
    'MOVE_FAILED',
    `${failures.length} of ${settled.length} moves failed:\n${lines.map((l) => `  - ${l}`).join('\n')}`,
    { done: done.map((m) => ({ moveId: m.moveId, shards: m.shards, outcome: m.outcome })) },
    lines,
    failures.flatMap((f) => (f instanceof ShardctlError ? f.next : [])),
  );
}

/** The shards grouped by the host they are on now (a move per group). */
export function groupBySource(
  config: ShardctlConfig,
  shards: readonly number[],
): { source: HostConfig; shards: number[] }[] {
  const groups = new Map<string, { source: HostConfig; shards: number[] }>();
  for (const shard of shards) {
    const source = hostForShard(config, shard);
    if (!source)
      throw new UsageError(`shard ${shard} is not in the map`, { input: 'shards', value: formatShardList(shards) });
    let group = groups.get(source.name);
    if (!group) groups.set(source.name, (group = { source, shards: [] }));
    group.shards.push(shard);
  }
  return [...groups.values()];
}

/** The batch's result from its moves' results. */
export function batchResult(
  outcome: BatchMoveResult['outcome'],
  target: string,
  shards: readonly number[],
  moves: readonly MoveResult[],
  started: number,
): BatchMoveResult {
  const blocked = moves.map((m) => m.writeBlockedMs).filter((ms): ms is number => ms !== null);
  return {
    outcome,
    target,
    shards,
    moves,
    rowsMoved: moves.reduce((n, m) => n + BigInt(m.rowsMoved), 0n).toString(),
    writeBlockedMs: blocked.length > 0 ? Math.max(...blocked) : null,
    durationMs: elapsed(started),
    leftoversDropped: [],
  };
}
