import type { IdLayout } from '../id/layout.js';
import type { ConfigFields, HostFields } from './schema.js';

/** One physical PostgreSQL host of the map. The fields read from the file take their types from schema.ts. */
export interface HostConfig {
  /** Unique name, e.g. `pg1`; used in every message about this host. */
  readonly name: HostFields['name'];
  /** Connection string after ${VAR} expansion. A secret: print it only through redact(). */
  readonly url: string;
  /**
   * Where shardctl opens connections that need one server session for their whole life (a move's
   * replication connection and sessions) when url goes through a transaction pooler; defaults to
   * url. A secret like url.
   */
  readonly directUrl: string;
  /** The address other hosts use to reach this one (logical replication); defaults to directUrl, else url. */
  readonly replicationUrl: string;
  /** The shard list as written in the file, e.g. "0-99,200". */
  readonly shardsSpec: string;
  /** The shards mapped to this host, ascending, no duplicates. */
  readonly shards: readonly number[];
  /** The host's relative share of the shards when rebalancing (default 1). */
  readonly weight: HostFields['weight'];
  /** Being decommissioned: rebalance empties it and moves nothing onto it (default false). */
  readonly drain: HostFields['drain'];
  /**
   * The config's hostTimeout in ms: the bound on connecting, and on a statement left unanswered
   * before a fresh connection checks the host is alive (src/fleet/silence.ts).
   */
  readonly timeoutMs: number;
}

/**
 * A validated config map. Produced only by loadConfig()/parseConfig() in src/config/load.ts. The
 * fields read from the file as they are take their types from schema.ts.
 */
export interface ShardctlConfig {
  /** Absolute path of the config file ('<inline>' when parsed from a string without a path). */
  readonly file: string;
  /** Shard schemas are `${schemaPrefix}${n}`. */
  readonly schemaPrefix: ConfigFields['schemaPrefix'];
  /** Logical shard count: shards are 0 .. shards-1. */
  readonly shards: ConfigFields['shards'];
  readonly idLayout: IdLayout;
  /** The epoch as written (ISO 8601), for messages and for the control schema. */
  readonly epochIso: string;
  /** Absolute path of the migrations folder. */
  readonly migrationsDir: string;
  readonly hosts: readonly HostConfig[];
  /** Connections per host used by init/migrate (default 2). */
  readonly concurrency: ConfigFields['concurrency'];
  /** lock_timeout applied to migrations on shard schemas, e.g. '5s' (default '5s'). */
  readonly lockTimeout: ConfigFields['lockTimeout'];
  /** How long a host may stay silent before it is checked and, if dead, reported, e.g. '10s' (default '10s'). */
  readonly hostTimeout: ConfigFields['hostTimeout'];
  /** Non-fatal findings, e.g. the id layout running out within 10 years. */
  readonly warnings: readonly string[];
}

/** The host a shard is mapped to: a binary search in each host's sorted shard list. */
export function hostForShard(config: ShardctlConfig, shard: number): HostConfig | undefined {
  for (const host of config.hosts) {
    if (binarySearch(host.shards, shard)) return host;
  }
  return undefined;
}

export function shardSchemaName(config: Pick<ShardctlConfig, 'schemaPrefix'>, shard: number): string {
  return `${config.schemaPrefix}${shard}`;
}

function binarySearch(sorted: readonly number[], value: number): boolean {
  let lo = 0;
  let hi = sorted.length - 1;
  while (lo <= hi) {
    const mid = (lo + hi) >> 1;
    const v = sorted[mid]!;
    if (v === value) return true;
    if (v < value) lo = mid + 1;
    else hi = mid - 1;
  }
  return false;
}

/**
 * The config with every host's url replaced by its directUrl: for runs whose connections need a
 * server session of their own for their whole life (moves), which a transaction pooler cannot give.
 */
export function withDirectUrls<C extends { readonly hosts: readonly HostConfig[] }>(config: C): C {
  if (config.hosts.every((h) => h.directUrl === h.url)) return config;
  return { ...config, hosts: config.hosts.map((h) => ({ ...h, url: h.directUrl })) };
}
