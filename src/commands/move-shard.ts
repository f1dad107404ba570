import type { HostConfig, ShardctlConfig } from '../config/types.js';
import { hostForShard } from '../config/types.js';
import { formatShardList, shardsPhrase } from '../config/ranges.js';
import { optionKeys, refuseUnknownOptions } from '../config/validate.js';
import { UsageError } from '../errors.js';
import { inflect } from '../text.js';
import { MOVE_OPTION_FLAGS, type MoveOptions, type MoveResult } from '../moves/context.js';
import { runMoves, type BatchMoveResult } from '../moves/run.js';

/**
 * `shardctl move-shard <shards> --to <host>`: checks the request and calls the move engine
 * (src/moves/run.ts), which does the rest: the runner locks, the preflight, one move per source
 * host, resume and abort.
 */

export { findRunningMoves, type BatchMoveResult } from '../moves/run.js';

/** Moves one shard: a batch of one. */
export async function moveShard(
  config: ShardctlConfig,
  shard: number,
  targetName: string | undefined,
  options: MoveOptions = {},
): Promise<MoveResult> {
  if (!Number.isInteger(shard) || shard < 0 || shard >= config.shards) {
    throw new UsageError(`out of range 0-${config.shards - 1}`, { input: 'shard', value: shard });
  }
  const result = await moveShards(config, [shard], targetName, options);
  return result.moves[0]!;
}

export async function moveShards(
  config: ShardctlConfig,
  shards: readonly number[],
  targetName: string | undefined,
  options: MoveOptions = {},
): Promise<BatchMoveResult> {
  refuseUnknownOptions('move options', options, MOVE_OPTION_KEYS);
  const request = checkMoveShards(config, shards, targetName, options);
  if (request.target === undefined) {
    // --resume or --abort: the unfinished move goes on to (or is undone from) the target it
    // recorded: a target given with it must be that one (the same command again with --resume),
    // never silently dropped.
    return runMoves(config, request.shards, undefined, {
      ...options,
      ...(targetName === undefined ? {} : { stated: { ...options.stated, target: targetName } }),
    });
  }
  return runMoves(config, request.shards, request.target, options);
}

const MOVE_OPTION_KEYS = optionKeys<MoveOptions>(MOVE_OPTION_FLAGS);

/**
 * What moveShards refuses from its arguments and the config alone, before it reaches any host
 * (shards out of range, an unknown or draining target, shards the map already places there, bad
 * numbers): asked first by a caller that must name bad input before anything else, as the CLI does
 * before it asks for confirmation. The shards sorted without repeats, and the target (none for
 * resume or abort, which go to the target the move recorded).
 */
export function checkMoveShards(
  config: ShardctlConfig,
  shards: readonly number[],
  targetName: string | undefined,
  options: Pick<MoveOptions, 'resume' | 'abort' | 'maxRate' | 'maxSlotWal' | 'copyChunkRows' | 'copyParallel'> = {},
): { shards: number[]; target: HostConfig | undefined } {
  const list = [...new Set(shards)].sort((a, b) => a - b);
  const outside = list.filter((s) => !Number.isInteger(s) || s < 0 || s >= config.shards);
  if (list.length === 0 || outside.length > 0) {
    throw new UsageError(list.length === 0 ? 'no shards given' : `out of range 0-${config.shards - 1}`, {
      input: 'shards',
      value: formatShardList(outside),
    });
  }
  for (const input of ['maxRate', 'maxSlotWal', 'copyChunkRows', 'copyParallel'] as const) {
    const value = options[input];
    if (value !== undefined && !(Number.isSafeInteger(value) && value > 0))
      throw new UsageError(
        `expected a positive whole number of ${input === 'copyChunkRows' ? 'rows' : input === 'copyParallel' ? 'connections' : 'bytes'}`,
        {
          input,
          value,
        },
      );
  }
  if (options.resume && options.abort)
    throw new UsageError('resume and abort exclude each other', { input: 'resume+abort' });
  if (options.resume || options.abort) return { shards: list, target: undefined };

  if (!targetName) throw new UsageError('a target host is required to start a move', { input: 'target' });
  const target = config.hosts.find((h) => h.name === targetName);
  if (!target) {
    throw new UsageError(`no such host in the map (hosts: ${config.hosts.map((h) => h.name).join(', ')})`, {
      input: 'target',
      value: targetName,
    });
  }
  if (target.drain) {
    throw new UsageError(`${target.name} is draining (drain: true in the map); move shards to a host that is not`, {
      input: 'target',
      value: targetName,
    });
  }
  const there = list.filter((s) => hostForShard(config, s)?.name === target.name);
  if (there.length > 0) {
    throw new UsageError(
      `${shardsPhrase(there)} ${inflect(there.length, 'is', 'are')} already on ${target.name}; nothing to move`,
      {
        input: 'shards',
        value: formatShardList(list),
      },
    );
  }
  return { shards: list, target };
}
