import { formatShardList } from '../config/ranges.js';
import { rewriteOwners } from '../config/rewrite.js';
import type { ShardctlConfig } from '../config/types.js';
import { UsageError } from '../errors.js';
import {
  describeDisagreements,
  discoverFromConfig,
  mapDisagreements,
  type FleetPlacement,
} from '../fleet/placement.js';
import { inflect } from '../text.js';

/**
 * `shardctl map show` and `map pull`: the placement as the fleet's hosts say it (src/fleet/placement.ts),
 * and the file brought in line with it.
 */

export interface MapShowResult {
  /** Null: no host has recorded a fleet (run init). */
  readonly fleetId: string | null;
  /** Decimal string. */
  readonly placementVersion: string;
  readonly hosts: readonly { name: string; address: string | null; shards: string; count: number; answered: boolean }[];
  readonly unreachable: readonly { name: string; reason: string }[];
  /** Where the file disagrees with the fleet, one line each (empty when it agrees). */
  readonly disagreements: readonly string[];
  readonly problems: readonly string[];
}

export async function mapShow(config: ShardctlConfig): Promise<MapShowResult> {
  const { placement, unreachable } = await readFleet(config);
  const byHost = new Map<string, number[]>();
  for (const [shard, host] of [...placement.owners].sort((a, b) => a[0] - b[0])) {
    const list = byHost.get(host);
    if (list) list.push(shard);
    else byHost.set(host, [shard]);
  }
  const names = [...new Set([...placement.hosts.keys(), ...byHost.keys()])].sort();
  return {
    fleetId: placement.fleetId,
    placementVersion: placement.version.toString(),
    hosts: names.map((name) => ({
      name,
      address: placement.hosts.get(name) ?? null,
      shards: formatShardList(byHost.get(name) ?? []),
      count: byHost.get(name)?.length ?? 0,
      answered: placement.answered.includes(name),
    })),
    unreachable,
    disagreements: describeDisagreements(mapDisagreements(config, placement, placement.moving)),
    problems: placement.problems,
  };
}

export interface MapPullResult {
  readonly file: string;
  readonly changed: boolean;
  readonly dryRun: boolean;
  /** What was (or, in a dry run, would be) changed, one line each. */
  readonly changes: readonly string[];
  /** Hosts added to the file (no credentials in their url). */
  readonly addedHosts: readonly string[];
  readonly placementVersion: string;
}

/**
 * Rewrites the file's shard lists to what the fleet says, keeping comments, ${VAR} and layout; hosts
 * the fleet places shards on and the file lacks are added with their registry address. Refuses
 * while any host of the file cannot be read (its shards would be unknown), or the hosts disagree
 * among themselves.
 */
export async function mapPull(config: ShardctlConfig, options: { dryRun?: boolean } = {}): Promise<MapPullResult> {
  if (config.file === '<inline>')
    throw new UsageError('map pull rewrites the config file: load the config from a file', { input: 'config' });
  const { placement, unreachable } = await readFleet(config);
  const fileHostsDown = unreachable.filter((u) => config.hosts.some((h) => h.name === u.name));
  if (fileHostsDown.length > 0) {
    throw new UsageError(
      `cannot read ${fileHostsDown.map((u) => `${u.name} (${u.reason})`).join(', ')}: the placement of ${inflect(fileHostsDown.length, 'its', 'their')} shards is not certain; nothing was changed`,
      { input: 'config', data: { unreachable: fileHostsDown } },
    );
  }
  if (placement.problems.length > 0) {
    throw new UsageError(`the hosts disagree among themselves: ${placement.problems.join('; ')}; nothing was changed`, {
      input: 'config',
    });
  }
  if (
    placement.layout &&
    (placement.layout.schemaPrefix !== config.schemaPrefix || placement.layout.shardCount !== config.shards)
  ) {
    throw new UsageError(
      `the fleet was built with schemaPrefix ${placement.layout.schemaPrefix} and ${placement.layout.shardCount} shards (file: ${config.schemaPrefix}, ${config.shards}); map pull moves shard lists only`,
      { input: 'config' },
    );
  }
  const disagreements = mapDisagreements(config, placement);
  const newHosts = [...new Set(disagreements.filter((d) => d.unknownHost).map((d) => d.fleetHost))].map((name) => ({
    name,
    url: placement.hosts.get(name) ?? `postgres://unknown-address-of-${name}/`,
  }));
  const owners = new Map<number, string>();
  for (const d of disagreements) for (const shard of d.shards) owners.set(shard, d.fleetHost);
  const changed =
    disagreements.length > 0 && !options.dryRun ? await rewriteOwners(config.file, owners, newHosts) : false;
  return {
    file: config.file,
    changed,
    dryRun: options.dryRun ?? false,
    changes: describeDisagreements(disagreements),
    addedHosts: newHosts.map((h) => h.name),
    placementVersion: placement.version.toString(),
  };
}

async function readFleet(
  config: ShardctlConfig,
): Promise<{ placement: FleetPlacement; unreachable: readonly { name: string; reason: string }[] }> {
  return discoverFromConfig(config, { applicationName: 'shardctl map' });
}
