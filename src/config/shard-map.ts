import { loadConfig } from './load.js';
import type { HostConfig, ShardctlConfig } from './types.js';
import { hostForShard } from './types.js';
import { shardForKey } from '../id/routing.js';

/**
 * The map for an application: route a key or a shard to its host, and reload the file when a
 * write hits a moved shard's fence, so the application follows a move without a restart.
 */
export class ShardMap {
  private constructor(
    private readonly file: string,
    private current: ShardctlConfig,
  ) {}

  static async load(file?: string): Promise<ShardMap> {
    const config = await loadConfig(file, { checkMigrationsDir: false });
    return new ShardMap(config.file, config);
  }

  get config(): ShardctlConfig {
    return this.current;
  }

  hostForShard(shard: number): HostConfig {
    const host = hostForShard(this.current, shard);
    if (!host) throw new RangeError(`shard ${shard} is not in the map (0-${this.current.shards - 1})`);
    return host;
  }

  hostForKey(key: bigint | number): { shard: number; host: HostConfig } {
    const shard = shardForKey(key, this.current.shards);
    return { shard, host: this.hostForShard(shard) };
  }

  /** Re-reads the config file; the old map stays in use if the new file is invalid. */
  async reload(): Promise<void> {
    this.current = await loadConfig(this.file, { checkMigrationsDir: false });
  }
}

/** SQLSTATE of a write refused by a moved shard's fence. */
export const SHARD_MOVED_SQLSTATE = 'SC100';

/**
 * If `error` is the fence of a moved shard (SQLSTATE SC100), the shard and the host it moved to;
 * otherwise null. Catch it, reload the map, retry on the new host.
 */
export function shardMovedTo(error: unknown): { shard: number; host: string } | null {
  const e = error as { code?: unknown; detail?: unknown } | null;
  if (!e || e.code !== SHARD_MOVED_SQLSTATE || typeof e.detail !== 'string') return null;
  const match = /shardctl-moved shard=(\d+) host=(\S+)/.exec(e.detail);
  return match ? { shard: Number(match[1]), host: match[2]! } : null;
}
