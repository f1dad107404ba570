import type { ShardctlConfig } from '../config/types.js';
import type pg from 'pg';
import { loadConfig } from '../config/load.js';
import { HostError } from '../errors.js';
import { CONTROL } from '../fleet/control.js';
import {
  discoverFleet,
  discoverFromConfig,
  fleetConfig,
  type HostPlacementView,
  type UnreachableHost,
} from '../fleet/placement.js';
import type { RouterSettings } from './options.js';

/** What one reading of the fleet gives a router. */
export interface RouterMap {
  /** The placement: the fleet's, corrected where the file disagrees. */
  readonly config: ShardctlConfig;
  /** Hosts that could not be read, and why. */
  readonly unreachable: readonly UnreachableHost[];
  /** The trusted registries' address of each host, with the discovery's credentials (pools.ts). */
  readonly registryUrls: ReadonlyMap<string, string>;
  /**
   * What a background refresh compares (mapUnchanged): per host, by the name its control schema
   * records, its placement version and registry; null when a host was not read or has no fleet row
   * (the refresh then reads the whole map again). With the file's hosts as read, for a file router.
   */
  readonly stamps: { readonly hosts: ReadonlyMap<string, string>; readonly file: string | null } | null;
}

/**
 * Reads the fleet for a router: from its config file (read again first unless `rereadFile` is
 * false) and the hosts it lists, or from the hosts of its current map and its seed URLs; the fleet
 * wins where the file disagrees. A router of seeds that reaches none of them fails naming them. A
 * host whose registry roles other than its owner can write is warned about once per router
 * (`warned`): the addresses it lists are not used.
 */
export async function readRouterMap(
  source: { file: ShardctlConfig | null; current: ShardctlConfig; seeds: readonly string[] },
  settings: RouterSettings,
  warned: Set<string>,
  rereadFile: boolean,
  signal?: AbortSignal,
): Promise<RouterMap> {
  let file = source.file;
  if (file && file.file !== '<inline>' && rereadFile) {
    // The file is being replaced or is invalid for a moment: the fleet decides anyway.
    file = (await rereadConfig(file, settings)) ?? file;
  }
  const reading = {
    applicationName: settings.applicationName,
    connectTimeoutMs: settings.connectTimeoutMs,
    ...(signal ? { signal } : {}),
  };
  const found = file
    ? await discoverFromConfig(file, reading)
    : await discoverFleet(
        [
          ...source.current.hosts.map((h) => ({ name: h.name, url: h.url })),
          ...source.seeds.map((url, i) => ({ name: `seed ${i + 1}`, url })),
        ],
        { ...reading, ...(source.seeds[0] ? { credentials: source.seeds[0] } : {}) },
      );
  if (!file && found.placement.answered.length === 0) {
    throw new HostError(
      found.unreachable.map((u) => u.name).join(', ') || 'seeds',
      `no seed could be read: ${found.unreachable.map((u) => `${u.name}: ${u.reason}`).join('; ')}`,
      {
        code: 'HOST_UNREACHABLE',
      },
    );
  }
  const next = fleetConfig(file, found);
  for (const { name, writers } of 'distrusted' in found ? found.distrusted : []) {
    if (warned.has(name)) continue;
    warned.add(name);
    process.emitWarning(
      `shardctl: host ${name}'s registry of host addresses is writable by ${writers.join(', ')} (not only its owner): the addresses it lists are not used, and no password goes there; run shardctl status`,
      { code: 'SHARDCTL_REGISTRY_WRITABLE' },
    );
  }
  const views = found.placement.views;
  // A seed that does not answer (an old address, a host gone) does not make the map unknown when
  // every host of the map was read: the background refresh compares stamps, not re-reads it all.
  const read = new Set(views.map((v) => v.fleet?.hostName));
  const stamps =
    views.length === 0 || views.some((v) => v.fleet === null) || next.hosts.some((h) => !read.has(h.name))
      ? null
      : {
          hosts: new Map(views.map((v) => [v.fleet!.hostName, viewStamp(v)])),
          file: file && file.file !== '<inline>' ? fileStamp(file) : null,
        };
  return { config: next, unreachable: found.unreachable, registryUrls: found.registryUrls ?? new Map(), stamps };
}

/**
 * Whether a router over `given` (a config object that names a file) goes on reading that file: only
 * when the file, read now, has the settings `given` has (each of its hosts' addresses and timeouts,
 * the layout, `hostTimeout`, …), the shard lists aside (moves rewrite them), and hosts the file lists
 * beside them (added since) aside. A config changed in code before the router got it (a secret
 * store's password in the url, a pooler's address, another environment's `${VAR}`) is kept as given:
 * reading the file again would replace what was changed with the file's, silently, at the next
 * refresh or move. Null when the file cannot be read now (the router asks again at its next reading).
 */
export async function followsFile(given: ShardctlConfig, settings: RouterSettings): Promise<boolean | null> {
  if (given.file === '<inline>') return false;
  const onDisk = await rereadConfig(given, settings);
  if (onDisk === null) return null;
  const byName = new Map(onDisk.hosts.map((h) => [h.name, h]));
  return (
    settingsText(given) === settingsText(onDisk) &&
    given.hosts.every((h) => {
      const there = byName.get(h.name);
      return there !== undefined && hostSettingsText(there) === hostSettingsText(h);
    })
  );
}

/** A config's settings but its hosts and warnings, as comparable text. */
function settingsText({ hosts: _hosts, warnings: _warnings, ...rest }: ShardctlConfig): string {
  return comparableText(rest);
}

/** A host's settings but its shard list, as comparable text. */
function hostSettingsText({ shards: _shards, shardsSpec: _spec, ...rest }: ShardctlConfig['hosts'][number]): string {
  return comparableText(rest);
}

/** JSON with every object's keys in order and bigints as decimal strings: equal values, equal text. */
function comparableText(value: object): string {
  return JSON.stringify(value, (_key, v: unknown) => {
    if (typeof v === 'bigint') return v.toString();
    if (v !== null && typeof v === 'object' && !Array.isArray(v))
      return Object.fromEntries(Object.entries(v).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)));
    return v;
  });
}

async function rereadConfig(file: ShardctlConfig, settings: RouterSettings): Promise<ShardctlConfig | null> {
  try {
    return await loadConfig(file.file, {
      checkMigrationsDir: false,
      ...(settings.env ? { env: settings.env } : {}),
      ...(settings.cwd ? { cwd: settings.cwd } : {}),
    });
  } catch {
    return null;
  }
}

/** One host's placement version and registry: every change of a shard's holder moves the version. */
const STAMP_SQL = `SELECT f.host_name, f.placement_version::text AS version,
       ARRAY(SELECT h.name || '=' || coalesce(h.address, '') FROM ${CONTROL}.hosts h) AS registry
  FROM ${CONTROL}.fleet f`;

function stampOf(version: string, registry: readonly string[]): string {
  return `${version} ${[...registry].sort().join(' ')}`;
}

function viewStamp(view: HostPlacementView): string {
  return stampOf(
    view.fleet!.version.toString(),
    [...view.registry].map(([name, address]) => `${name}=${address ?? ''}`),
  );
}

function fileStamp(file: ShardctlConfig): string {
  return JSON.stringify(file.hosts);
}

/**
 * A background refresh's first look: whether every host of the map still has the placement version
 * and registry it had at the last full read, asked on a connection of the router's own pool (one
 * short query per host, no new connection), and, for a file router, whether the file's hosts are
 * still what they were. False (read the whole map again) when anything differs, a host has no pool
 * yet, or any of it could not be asked.
 */
export async function mapUnchanged(
  stamps: NonNullable<RouterMap['stamps']>,
  pools: readonly (pg.Pool | undefined)[],
  file: ShardctlConfig | null,
  settings: RouterSettings,
  /** A statement of the router's own on a pool's connection (HostPools.ownQuery: given up at close). */
  query: <R extends pg.QueryResultRow>(pool: pg.Pool, text: string) => Promise<pg.QueryResult<R>>,
): Promise<boolean> {
  if (pools.length !== stamps.hosts.size || pools.some((p) => p === undefined)) return false;
  if (file && file.file !== '<inline>') {
    const again = await rereadConfig(file, settings);
    if (again === null || fileStamp(again) !== stamps.file) return false;
  }
  const seen = await Promise.all(
    pools.map((pool) =>
      query<{ host_name: string; version: string; registry: string[] }>(pool!, STAMP_SQL).then(
        (r) => (r.rows.length === 1 ? r.rows[0]! : null),
        () => null,
      ),
    ),
  );
  return seen.every((row) => row !== null && stamps.hosts.get(row.host_name) === stampOf(row.version, row.registry));
}
