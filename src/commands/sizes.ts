import type pg from 'pg';
import type { HostConfig, ShardctlConfig } from '../config/types.js';
import { optionKeys, refuseUnknownOptions } from '../config/validate.js';
import { failureReason, RuntimeFailure } from '../errors.js';
import { readShardSizes } from '../fleet/catalog.js';
import { describePgError } from '../fleet/connect.js';
import { withReadHint } from '../fleet/rights.js';
import { withSession } from '../fleet/session.js';

/**
 * `shardctl status --sizes`: what each shard weighs on the host the map puts it on, bytes on disk
 * (tables, indexes, TOAST) and estimated rows, per shard and per host. The rebalance planner uses
 * the same numbers. Old copies left by moves are not counted: only the shards the map gives a host.
 */

export interface ShardSizeInfo {
  readonly shard: number;
  readonly host: string;
  readonly bytes: bigint;
  /** From the planner's statistics; an estimate. */
  readonly rows: bigint;
}

export interface HostSizes {
  readonly host: string;
  readonly weight: number;
  readonly drain: boolean;
  /** Shards the map gives this host. */
  readonly shards: number;
  readonly bytes: bigint;
  readonly rows: bigint;
  /** Mapped here but without a schema (counted as 0 bytes). */
  readonly missing: readonly number[];
}

export interface SizesResult {
  readonly hosts: readonly HostSizes[];
  /** Every mapped shard, the largest first (then by shard number). */
  readonly shards: readonly ShardSizeInfo[];
  readonly bytes: bigint;
  readonly rows: bigint;
  /** Hosts left out because they could not be read (a partial read; otherwise empty). */
  readonly unreadable: readonly UnreadableHost[];
}

/**
 * Reads every host (in parallel); a host that cannot be read fails the whole call, naming it, or
 * with `partial` is left out (its shards too) and named in `unreadable`.
 */
export async function shardSizes(config: ShardctlConfig, options: ReadEveryHostOptions = {}): Promise<SizesResult> {
  refuseUnknownOptions('shardSizes options', options, READ_EVERY_HOST_KEYS);
  const { read: perHost, unreadable } = await readEveryHost(
    config,
    'sizes',
    [],
    (client, host) => readShardSizes(client, config.schemaPrefix, host.shards),
    options,
  );
  const hosts: HostSizes[] = [];
  const shards: ShardSizeInfo[] = [];
  for (const { host, found } of perHost) {
    const bySchema = new Map(found.map((s) => [s.shard, s]));
    const missing: number[] = [];
    let bytes = 0n;
    let rows = 0n;
    for (const shard of host.shards) {
      const size = bySchema.get(shard);
      if (!size) missing.push(shard);
      const info = { shard, host: host.name, bytes: size?.bytes ?? 0n, rows: size?.rows ?? 0n };
      bytes += info.bytes;
      rows += info.rows;
      shards.push(info);
    }
    hosts.push({
      host: host.name,
      weight: host.weight,
      drain: host.drain,
      shards: host.shards.length,
      bytes,
      rows,
      missing,
    });
  }
  shards.sort(largestFirst);
  return {
    hosts,
    shards,
    bytes: hosts.reduce((n, h) => n + h.bytes, 0n),
    rows: hosts.reduce((n, h) => n + h.rows, 0n),
    unreadable,
  };
}

function largestFirst(a: ShardSizeInfo, b: ShardSizeInfo): number {
  return a.bytes === b.bytes ? a.shard - b.shard : a.bytes > b.bytes ? -1 : 1;
}

/** A host whose figures could not be read (a partial read: `{ partial: true }`), and why. */
export interface UnreadableHost {
  readonly host: string;
  readonly reason: string;
}

/** Whether a host that cannot be read fails the call (the default) or is left out and named. */
export interface ReadEveryHostOptions {
  /**
   * Leave out the hosts that cannot be read and name them in `unreadable` (status --sizes and
   * --load: what can be read is shown). Without it a host that cannot be read fails the whole call
   * (rebalance: it must not plan from part of the fleet).
   */
  readonly partial?: boolean;
}
/** The keys of ReadEveryHostOptions, for the library calls that take them. */
export const READ_EVERY_HOST_KEYS = optionKeys<ReadEveryHostOptions>({ partial: true });

/**
 * What `read` finds on every host of the map, read in parallel on a session of its own
 * (`shardctl <what>`); a host the map gives no shard is not asked (`empty`). A host that cannot be
 * read fails the whole call, naming it: "cannot read shard <what>"; with `partial`, it is left out
 * of `read` and named in `unreadable`.
 */
export async function readEveryHost<T>(
  config: ShardctlConfig,
  what: string,
  empty: T,
  read: (client: pg.Client, host: HostConfig) => Promise<T>,
  { partial = false }: ReadEveryHostOptions = {},
): Promise<{
  readonly read: { readonly host: HostConfig; readonly found: T }[];
  readonly unreadable: UnreadableHost[];
}> {
  const unreadable: UnreadableHost[] = [];
  const perHost = await Promise.all(
    config.hosts.map(async (host) => {
      try {
        const found =
          host.shards.length === 0
            ? empty
            : await withSession(host, ({ client }) => read(client, host), { applicationName: `shardctl ${what}` });
        return { host, found };
      } catch (error) {
        unreadable.push({
          host: host.name,
          reason: withReadHint(failureReason(error, describePgError), error, host.url),
        });
        return undefined;
      }
    }),
  );
  unreadable.sort((a, b) => a.host.localeCompare(b.host));
  if (unreadable.length > 0 && !partial) {
    const errors = unreadable.map((u) => `host ${u.host}: ${u.reason}`);
    throw new RuntimeFailure(
      'HOST_UNREACHABLE',
      `cannot read shard ${what}: ${errors.join('; ')}`,
      { hosts: errors },
      errors,
    );
  }
  return { read: perHost.filter((r) => r !== undefined), unreadable };
}
