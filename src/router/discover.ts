import type { ShardctlConfig } from '../config/types.js';
import { loadConfig } from '../config/load.js';
import { HostError } from '../errors.js';
import { discoverFleet, discoverFromConfig, fleetConfig, type UnreachableHost } from '../fleet/placement.js';
import type { RouterSettings } from './options.js';

/** What one reading of the fleet gives a router. */
export interface RouterMap {
  /** The placement: the fleet's, corrected where the file disagrees. */
  readonly config: ShardctlConfig;
  /** Hosts that could not be read, and why. */
  readonly unreachable: readonly UnreachableHost[];
  /** The trusted registries' address of each host, with the discovery's credentials (pools.ts). */
  readonly registryUrls: ReadonlyMap<string, string>;
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
): Promise<RouterMap> {
  let file = source.file;
  if (file && file.file !== '<inline>' && rereadFile) {
    try {
      file = await loadConfig(file.file, {
        checkMigrationsDir: false,
        ...(settings.env ? { env: settings.env } : {}),
        ...(settings.cwd ? { cwd: settings.cwd } : {}),
      });
    } catch {
      // The file is being replaced or is invalid for a moment: the fleet decides anyway.
    }
  }
  const reading = { applicationName: settings.applicationName, connectTimeoutMs: settings.connectTimeoutMs };
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
  return { config: next, unreachable: found.unreachable, registryUrls: found.registryUrls ?? new Map() };
}
