import { loadConfig, type LoadConfigOptions } from './load.js';
import type { HostConfig, ShardctlConfig } from './types.js';
import { optionKeys, refuseUnknownOptions } from './validate.js';
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
    private readonly options: ShardMapOptions,
  ) {}

  /**
   * Reads the file (default: $SHARDCTL_CONFIG, else ./shardctl.yaml). `env` is where its `${VAR}`s
   * come from (default: the process's environment), `cwd` what a relative path is relative to;
   * reload() reads the file again with the same ones.
   */
  static async load(file?: string, options: ShardMapOptions = {}): Promise<ShardMap> {
    refuseUnknownOptions('ShardMap.load options', options, SHARD_MAP_OPTION_KEYS);
    const config = await loadConfig(file, { ...options, checkMigrationsDir: false });
    return new ShardMap(config.file, config, options);
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
    this.current = await loadConfig(this.file, { ...this.options, checkMigrationsDir: false });
  }
}

/** ShardMap.load's options: where the file's `${VAR}`s come from, and the directory a relative path is in. */
export type ShardMapOptions = Pick<LoadConfigOptions, 'env' | 'cwd'>;

const SHARD_MAP_OPTION_KEYS = optionKeys<ShardMapOptions>({ env: true, cwd: true });

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
