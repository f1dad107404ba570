import { formatShardList } from '../config/ranges.js';
import { rewriteOwners } from '../config/rewrite.js';
import type { HostConfig, ShardctlConfig } from '../config/types.js';
import { optionKeys, refuseUnknownOptions } from '../config/validate.js';
import { failureReason, RuntimeFailure, UsageError } from '../errors.js';
import { controlRightsError, requireRights } from '../fleet/rights.js';
import { describePgError, withHost } from '../fleet/connect.js';
import { CONTROL } from '../fleet/control.js';
import {
  describeDisagreements,
  discoverFromConfig,
  hostAddress,
  mapDisagreements,
  type FleetPlacement,
} from '../fleet/placement.js';
import { addressKey, otherServersWritableAs, otherWritablePrimaries, probeAddresses } from '../fleet/primaries.js';
import { readFleetRow, readTopology, type HostTopology } from '../fleet/topology.js';
import { formatPostgresUrl, parsePostgresUrl } from '../pg/multihost.js';
import { quoteLiteral } from '../pg/quote.js';
import { redactUrl } from '../pg/redact.js';
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
  readonly hosts: readonly {
    name: string;
    address: string | null;
    shards: string;
    count: number;
    answered: boolean;
    /** The file's hosts: the address reached (its primary) and the standbys streaming from it. */
    topology: HostTopology | null;
    /** The registry's address differs from the file's url (user and password aside); null when it agrees or one is missing. */
    fileAddress: string | null;
  }[];
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
  const topologies = new Map(
    await Promise.all(
      config.hosts
        .filter((h) => placement.answered.includes(h.name))
        .map(
          async (h) =>
            [h.name, await withHost(h, readTopology, { applicationName: 'shardctl map' }).catch(() => null)] as const,
        ),
    ),
  );
  return {
    fleetId: placement.fleetId,
    placementVersion: placement.version.toString(),
    hosts: names.map((name) => ({
      name,
      address: placement.hosts.get(name) ?? null,
      shards: formatShardList(byHost.get(name) ?? []),
      count: byHost.get(name)?.length ?? 0,
      answered: placement.answered.includes(name),
      topology: topologies.get(name) ?? null,
      fileAddress: fileAddressIfDifferent(config, name, placement.hosts.get(name)),
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

export interface MapPullOptions {
  /** Say what would change; write nothing. */
  readonly dryRun?: boolean;
}
const MAP_PULL_KEYS = optionKeys<MapPullOptions>({ dryRun: true });

/**
 * Rewrites the file's shard lists to what the fleet says, keeping comments, ${VAR} and layout; hosts
 * the fleet places shards on and the file lacks are added with their registry address. Refuses
 * while any host of the file cannot be read (its shards would be unknown), or the hosts disagree
 * among themselves.
 */
export async function mapPull(config: ShardctlConfig, options: MapPullOptions = {}): Promise<MapPullResult> {
  refuseUnknownOptions('map pull options', options, MAP_PULL_KEYS);
  if (config.file === '<inline>')
    throw new UsageError('map pull rewrites the config file: load the config from a file', { input: 'config' });
  const { placement, unreachable } = await readFleet(config);
  const fileHostsDown = unreachable.filter((u) => config.hosts.some((h) => h.name === u.name));
  if (fileHostsDown.length > 0) {
    // A host that does not answer (or refuses the role) is a run-time failure, not a bad file: exit 1.
    throw new RuntimeFailure(
      'HOST_UNREACHABLE',
      `cannot read ${fileHostsDown.map((u) => `${u.name} (${u.reason})`).join(', ')}: the placement of ${inflect(fileHostsDown.length, 'its', 'their')} shards is not certain; nothing was changed`,
      { unreachable: fileHostsDown },
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

function fileAddressIfDifferent(config: ShardctlConfig, name: string, registry: string | undefined): string | null {
  const listed = config.hosts.find((h) => h.name === name);
  const file = listed ? hostAddress(listed.url) : null;
  return registry !== undefined && file !== null && file !== registry ? file : null;
}

export interface MapSetAddressResult {
  readonly host: string;
  /** The address recorded (no credentials). */
  readonly address: string;
  /** The address the registry had before (from the hosts that answered), if any. */
  readonly previous: string | null;
  /** The address connected to and checked: the host's primary. */
  readonly primary: string | null;
  /** Hosts whose registry now says `address`. */
  readonly updated: readonly string[];
  /** Hosts that could not be read (their registry still says the old address: run again later). */
  readonly unreachable: readonly { name: string; reason: string }[];
  /**
   * Earlier addresses of the host (the registry's before, the file's) that still answer as a
   * writable primary of this host in this fleet: two primaries, and whatever reaches the old one
   * (a router or a file that names it) writes apart from the new one (no credentials).
   */
  readonly stillWritable: readonly string[];
  readonly dryRun: boolean;
}

/** The probes of a host's addresses (src/fleet/primaries.ts), each waited for ADDRESS_PROBE_WAIT_MS at most. */
const MAP_PROBES = { applicationName: 'shardctl map' };

export interface MapSetAddressOptions {
  /** The host's new address (default: the file's url for it). */
  readonly url?: string;
  /** Say what would change; write nothing. */
  readonly dryRun?: boolean;
}
const MAP_SET_ADDRESS_KEYS = optionKeys<MapSetAddressOptions>({ url: true, dryRun: true });

/**
 * After a failover: records `url` (default: the host's url in the file, which may list several
 * addresses) as the address of `hostName` in the registry of every host that answers, so routers
 * opened from seeds, or from a file written before the failover, find the new primary. Refused
 * (exit 2, nothing written) when the server reached is not a primary (in recovery), or its control
 * schema says it is another host or belongs to another fleet than the file's hosts. Runs during an
 * unfinished move: only the registry changes, not the placement.
 */
export async function mapSetAddress(
  config: ShardctlConfig,
  hostName: string,
  options: MapSetAddressOptions = {},
): Promise<MapSetAddressResult> {
  refuseUnknownOptions('map set-address options', options, MAP_SET_ADDRESS_KEYS);
  const listed = config.hosts.find((h) => h.name === hostName);
  const { placement, unreachable, registryUrls } = await readFleet(config);
  const known = listed ?? (placement.hosts.has(hostName) ? undefined : null);
  if (known === null)
    throw new UsageError(`is not a host of the file or of the fleet's registry`, { input: 'host', value: hostName });
  const url = options.url ?? listed?.url ?? registryUrls?.get(hostName);
  if (url === undefined) throw new UsageError(`the file does not list ${hostName}: give its address`, { input: 'url' });
  const asked = parsePostgresUrl(url, options.url !== undefined ? 'url' : `hosts ${hostName} url`).targetSessionAttrs;
  // The address is recorded as given, and a router opened from seeds connects as it asks: only the
  // primary may be asked for (what is checked below is the read-write address).
  if (asked !== undefined && asked !== 'read-write' && asked !== 'primary')
    throw new UsageError(
      `asks for target_session_attrs=${asked}: a registry address is where the host's writes go; give read-write or primary, or leave it out`,
      { input: 'url', value: redactUrl(url) },
    );
  const address = hostAddress(url);
  if (address === null) throw new UsageError('is not a postgres:// URL', { input: 'url', value: redactUrl(url) });
  const target: HostConfig = {
    ...(listed ?? { ...config.hosts[0]!, shards: [], shardsSpec: '', weight: 1, drain: false }),
    name: hostName,
    // Held to read-write, whatever the URL asks: a registry address is where the writes go.
    url: withReadWrite(url),
  };
  const checked = await withHost(
    target,
    async (client) => ({ fleet: await readFleetRow(client), topology: await readTopology(client) }),
    { applicationName: 'shardctl map' },
  ).catch((error: unknown) => {
    throw new UsageError(
      `cannot reach a primary there: ${failureReason(error, describePgError)}; nothing was changed`,
      {
        input: 'url',
        value: redactUrl(url),
      },
    );
  });
  const fleetId = placement.fleetId;
  const refuse = (why: string): never => {
    throw new UsageError(`${why}; nothing was changed`, {
      input: 'url',
      value: redactUrl(url),
      data: { host: hostName, fleetId },
    });
  };
  if (checked.topology.inRecovery)
    refuse(
      `the server at ${checked.topology.primary ?? 'that address'} is a standby (in recovery), not the primary of ${hostName}`,
    );
  if (!checked.fleet) refuse(`the server there has no shardctl fleet record (not initialised): it is not ${hostName}`);
  if (fleetId !== null && checked.fleet!.fleetId !== fleetId)
    refuse(`the server there belongs to fleet ${checked.fleet!.fleetId}, not ${fleetId} (this file's hosts')`);
  if (checked.fleet!.hostName !== hostName)
    refuse(`the server there records itself as host ${checked.fleet!.hostName}, not ${hostName}`);
  // Every other address the URL lists that answers must be this host too (its standby, which
  // replays the same record): the registry's URL is tried address by address when one is down.
  if (parsePostgresUrl(url).addresses.length > 1)
    for (const { address, seen, refused } of await probeAddresses(target, [url], new Set(), MAP_PROBES)) {
      // A standby of this host takes its credentials and has its databases: a server that refuses them is another's.
      if (refused !== undefined) refuse(`its address ${address} answers, but not as ${hostName}'s server (${refused})`);
      if (seen && (seen.fleet?.fleetId !== checked.fleet!.fleetId || seen.fleet.hostName !== hostName))
        refuse(
          `its address ${address} answers as ${seen.fleet ? `host ${seen.fleet.hostName} of fleet ${seen.fleet.fleetId}` : 'a server with no shardctl fleet record'}, not ${hostName}: a router that found it first would run ${hostName}'s calls there`,
        );
    }
  const previous = placement.hosts.get(hostName) ?? null;
  const stillWritable = [
    ...(await writableOldAddresses(target, [previous, listed?.url], url, checked.fleet!.fleetId)),
    // Another address of the URL itself that answers as a primary of this host: split brain.
    ...(await otherWritablePrimaries(target, checked.topology.primary, checked.fleet!, MAP_PROBES)),
  ];
  const writeTo = [target, ...config.hosts.filter((h) => h.name !== hostName && placement.answered.includes(h.name))];
  await requireRegistryRights(writeTo);
  const updated: string[] = [];
  if (!options.dryRun) {
    const results = await Promise.allSettled(
      writeTo.map((h) =>
        withHost(
          h,
          (client) =>
            client.query(
              `INSERT INTO ${CONTROL}.hosts (name, address) VALUES ($1, $2) ON CONFLICT (name) DO UPDATE SET address = EXCLUDED.address`,
              [hostName, address],
            ),
          { applicationName: 'shardctl map' },
        ),
      ),
    );
    results.forEach((r, i) => {
      if (r.status === 'fulfilled') updated.push(writeTo[i]!.name);
      else unreachable.push({ name: writeTo[i]!.name, reason: failureReason(r.reason, describePgError) });
    });
  }
  return {
    host: hostName,
    address,
    previous,
    primary: checked.topology.primary,
    updated,
    unreachable: unreachable.filter((u) => !updated.includes(u.name)),
    stillWritable,
    dryRun: options.dryRun ?? false,
  };
}

/**
 * Every host whose registry set-address writes lets this role write it, checked before any is
 * written: a role that may not (the application's, a read-only one) is refused on every host with
 * the owner and what to grant, as the other commands that write the control schema are, not
 * reported as a host to try again. A host that cannot be reached is left to the writes (reported
 * unreachable there).
 */
async function requireRegistryRights(hosts: readonly HostConfig[]): Promise<void> {
  await requireRights(
    hosts,
    (h) =>
      withHost(
        h,
        async (client) => {
          const { rows } = await client.query<{ ok: boolean }>(
            `SELECT pg_catalog.has_table_privilege(${quoteLiteral(`${CONTROL}.hosts`)}, 'INSERT, UPDATE') AS ok`,
          );
          if (rows[0]!.ok) return null;
          return controlRightsError(client, h, new Error(`permission denied for table ${CONTROL}.hosts`));
        },
        { applicationName: 'shardctl map' },
      ),
    () => 'map set-address: this role may not write the host registry; nothing was changed',
  );
}

/**
 * Of the host's earlier addresses (each address of `earlier`'s URLs but those of `current`), those
 * where a server still answers as a primary (not in recovery) that records itself as this host of
 * this fleet: an old primary left running after the failover. One that does not answer, or
 * answers otherwise, is not listed.
 */
async function writableOldAddresses(
  host: HostConfig,
  earlier: readonly (string | null | undefined)[],
  current: string,
  fleetId: string,
): Promise<string[]> {
  const now = new Set(parsePostgresUrl(current).addresses.map(addressKey));
  return otherServersWritableAs(
    host,
    await probeAddresses(host, earlier, now, MAP_PROBES),
    { fleetId, hostName: host.name },
    MAP_PROBES,
  );
}

/** The URL with target_session_attrs=read-write unless it asks for primary (same thing here) already. */
function withReadWrite(url: string): string {
  const parsed = parsePostgresUrl(url);
  if (parsed.targetSessionAttrs === 'read-write' || parsed.targetSessionAttrs === 'primary') return url;
  return formatPostgresUrl({ ...parsed, targetSessionAttrs: 'read-write' });
}

async function readFleet(config: ShardctlConfig): Promise<{
  placement: FleetPlacement;
  unreachable: { name: string; reason: string }[];
  registryUrls: ReadonlyMap<string, string> | undefined;
}> {
  const found = await discoverFromConfig(config, { applicationName: 'shardctl map' });
  // The JSON keeps its shape: a name and a reason per host.
  const unreachable = found.unreachable.map(({ name, reason }) => ({ name, reason }));
  return { placement: found.placement, unreachable, registryUrls: found.registryUrls };
}
