import type { ShardctlConfig } from '../config/types.js';
import { readShardActivity } from '../fleet/load.js';
import { readEveryHost, READ_EVERY_HOST_KEYS, type ReadEveryHostOptions, type UnreadableHost } from './sizes.js';
import { refuseUnknownOptions } from '../config/validate.js';

/**
 * `shardctl status --load`: the rows each shard's tables were written and read since the host's
 * statistics were last reset (pg_stat_user_tables, summed per shard schema), per shard and per
 * host, the busiest first: where a hot shard is. `rebalance --by load` weighs shards the same way.
 */

export interface ShardLoadInfo {
  readonly shard: number;
  readonly host: string;
  readonly writes: bigint;
  readonly reads: bigint;
}

export interface HostLoad {
  readonly host: string;
  readonly shards: number;
  readonly writes: bigint;
  readonly reads: bigint;
  /** When the host's statistics were last reset (null: never); the counts run from then. */
  readonly statsReset: string | null;
}

export interface LoadResult {
  /** The busiest first (writes + reads, then by name). */
  readonly hosts: readonly HostLoad[];
  /** Every mapped shard, the busiest first (writes + reads, then writes, then shard number). */
  readonly shards: readonly ShardLoadInfo[];
  readonly writes: bigint;
  readonly reads: bigint;
  /** Hosts left out because they could not be read (a partial read; otherwise empty). */
  readonly unreadable: readonly UnreadableHost[];
}

/**
 * Reads every host (in parallel); a host that cannot be read fails the whole call, naming it, or
 * with `partial` is left out (its shards too) and named in `unreadable`.
 */
export async function shardLoad(config: ShardctlConfig, options: ReadEveryHostOptions = {}): Promise<LoadResult> {
  refuseUnknownOptions('shardLoad options', options, READ_EVERY_HOST_KEYS);
  const { read: perHost, unreadable } = await readEveryHost(
    config,
    'load',
    { shards: [], statsReset: null },
    (client, host) => readShardActivity(client, config.schemaPrefix, host.shards),
    options,
  );
  const hosts: HostLoad[] = [];
  const shards: ShardLoadInfo[] = [];
  for (const { host, found } of perHost) {
    const bySchema = new Map(found.shards.map((s) => [s.shard, s]));
    let writes = 0n;
    let reads = 0n;
    for (const shard of host.shards) {
      const activity = bySchema.get(shard);
      const info = { shard, host: host.name, writes: activity?.writes ?? 0n, reads: activity?.reads ?? 0n };
      writes += info.writes;
      reads += info.reads;
      shards.push(info);
    }
    hosts.push({
      host: host.name,
      shards: host.shards.length,
      writes,
      reads,
      statsReset: found.statsReset ? found.statsReset.toISOString() : null,
    });
  }
  shards.sort((a, b) => busiestFirst(a, b) || a.shard - b.shard);
  hosts.sort((a, b) => busiestFirst(a, b) || a.host.localeCompare(b.host));
  return {
    hosts,
    shards,
    writes: hosts.reduce((n, h) => n + h.writes, 0n),
    reads: hosts.reduce((n, h) => n + h.reads, 0n),
    unreadable,
  };
}

function busiestFirst(a: { writes: bigint; reads: bigint }, b: { writes: bigint; reads: bigint }): number {
  const total = b.writes + b.reads - (a.writes + a.reads);
  if (total !== 0n) return total > 0n ? 1 : -1;
  return a.writes === b.writes ? 0 : a.writes < b.writes ? 1 : -1;
}
