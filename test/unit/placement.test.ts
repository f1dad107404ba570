import { describe, expect, it } from 'vitest';
import { parseConfig } from '../../src/config/load.js';
import { rewriteOwnersYaml } from '../../src/config/rewrite.js';
import { HostError, StaleMapError } from '../../src/errors.js';
import {
  describeDisagreements,
  fleetConfig,
  hostAddress,
  mapDisagreements,
  mergePlacement,
  requireCurrentMapLocked,
  withFleetShardLists,
  type HostPlacementView,
  type ShardState,
} from '../../src/fleet/placement.js';
import { withCredentials } from '../../src/pg/multihost.js';

const FLEET = '6f1c1f0e-1111-4222-8333-944455556666';

function view(
  name: string,
  options: {
    claims?: Record<number, ShardState>;
    copy?: Record<number, [string, bigint]>;
    version?: bigint;
    fleetId?: string | null;
    registry?: Record<string, string>;
  } = {},
): HostPlacementView {
  return {
    reachedAs: name,
    fleet:
      options.fleetId === null
        ? null
        : { fleetId: options.fleetId ?? FLEET, hostName: name, version: options.version ?? 1n },
    layout: { schemaPrefix: 'insta', shardCount: 8, epochMs: 0n, shardBits: 13, sequenceBits: 10 },
    registry: new Map(Object.entries(options.registry ?? {})),
    copy: new Map(
      Object.entries(options.copy ?? {}).map(([shard, [host, version]]) => [Number(shard), { host, version }]),
    ),
    claims: new Map(Object.entries(options.claims ?? {}).map(([shard, state]) => [Number(shard), state])),
    moving: new Set(),
    registryWriters: [],
  };
}

describe('mergePlacement', () => {
  it('places a shard where a host holds it active, whatever the copies say', () => {
    const merged = mergePlacement([
      view('pg1', { claims: { 3: 'fenced' }, copy: { 3: ['pg1', 1n] } }),
      view('pg2', { claims: { 3: 'active' }, copy: { 3: ['pg2', 2n] } }),
    ]);
    expect(merged.owners.get(3)).toBe('pg2');
    expect(merged.problems).toEqual([]);
  });

  it('places a shard fenced on two hosts (a move between fence and switch, and an old copy an earlier move left) on the one the newest copy names, in any order of the hosts', () => {
    // Shard 9 moved pg2 → pg1 earlier (pg2 keeps its fenced old copy until gc); a move of it from
    // pg1 to pg3 is now between its fence and its switch: fenced on pg1 too, incoming on pg3.
    const hosts = [
      view('pg1', { claims: { 9: 'fenced' }, copy: { 9: ['pg1', 4n] } }),
      view('pg2', { claims: { 9: 'fenced' }, copy: { 9: ['pg1', 4n] } }),
      view('pg3', { claims: { 9: 'incoming' }, copy: { 9: ['pg1', 4n] } }),
    ];
    for (const order of [hosts, [...hosts].reverse(), [hosts[1]!, hosts[0]!, hosts[2]!]]) {
      const merged = mergePlacement(order);
      expect(merged.owners.get(9)).toBe('pg1');
      expect(merged.problems).toEqual([]);
    }
  });

  it('keeps a fenced shard on its host until the switch, while the target answers without holding it', () => {
    // The source's copy already names the target (written first at the switch); the target has not activated.
    const merged = mergePlacement([
      view('pg1', { claims: { 3: 'fenced' }, copy: { 3: ['pg2', 5n] } }),
      view('pg2', { claims: { 3: 'incoming' } }),
    ]);
    expect(merged.owners.get(3)).toBe('pg1');
  });

  it('follows a fenced shard to the host a newer copy names when that host did not answer', () => {
    const merged = mergePlacement([view('pg1', { claims: { 3: 'fenced' }, copy: { 3: ['pg3', 5n] } })]);
    expect(merged.owners.get(3)).toBe('pg3');
  });

  it('places the shards of a host that did not answer by the newest copy', () => {
    const merged = mergePlacement([
      view('pg1', { claims: { 0: 'active' }, copy: { 0: ['pg1', 1n], 5: ['pg2', 1n] }, version: 1n }),
      view('pg3', { copy: { 5: ['pg4', 7n] }, version: 7n }),
    ]);
    expect(merged.owners.get(5)).toBe('pg4');
    expect(merged.version).toBe(7n);
  });

  it('does not place a shard on a host that answered without holding it (dropped)', () => {
    const merged = mergePlacement([view('pg1', { copy: { 6: ['pg1', 1n] } })]);
    expect(merged.owners.has(6)).toBe(false);
  });

  it('reports a shard active on two hosts, and hosts of two fleets', () => {
    const merged = mergePlacement([
      view('pg1', { claims: { 1: 'active' }, copy: { 1: ['pg2', 3n] } }),
      view('pg2', { claims: { 1: 'active' }, fleetId: '00000000-0000-4000-8000-000000000000' }),
    ]);
    expect(merged.owners.get(1)).toBe('pg2');
    expect(merged.problems).toEqual([
      `hosts of different fleets: ${FLEET} (pg1) and 00000000-0000-4000-8000-000000000000 (pg2)`,
      'shard 1 is active on more than one host',
    ]);
  });

  it("takes each host's address from the registry of the newest host", () => {
    const merged = mergePlacement([
      view('pg1', { version: 2n, registry: { pg1: 'postgres://a/app', pg2: 'postgres://b2/app' } }),
      view('pg2', { version: 1n, registry: { pg2: 'postgres://b1/app', pg3: 'postgres://c/app' } }),
    ]);
    expect(Object.fromEntries(merged.hosts)).toEqual({
      pg1: 'postgres://a/app',
      pg2: 'postgres://b2/app',
      pg3: 'postgres://c/app',
    });
  });
});

/** A config of 8 shards over `hosts` (YAML lines), its `${SECRET}` given as "given". */
function eightShards(hosts: readonly string[], file = '<inline>') {
  return parseConfig(['shards: 8', 'hosts:', ...hosts, ''].join('\n'), {
    file,
    env: { SECRET: 'given' },
    checkMigrationsDir: false,
  });
}

describe('withFleetShardLists', () => {
  it('takes each host shard list from the fleet, keeps every other setting, and leaves a shard of an unknown host where it was', () => {
    const config = eightShards([
      '  - name: pg1',
      '    url: postgres://app:${SECRET}@db1/app',
      '    shards: "0-5"',
      '  - name: pg2',
      '    url: postgres://db2/app',
      '    directUrl: postgres://db2:5433/app',
      '    shards: "6-7"',
      '  - name: pg3',
      '    url: postgres://db3/app',
      '    shards: ""',
    ]);
    // pg1 gave 4-5 to pg3 and 0 to pg2; pg9 (not in the config) claims 2.
    const placement = mergePlacement([
      view('pg1', { claims: { 1: 'active', 3: 'active' } }),
      view('pg2', { claims: { 0: 'active', 6: 'active', 7: 'active' } }),
      view('pg3', { claims: { 4: 'active', 5: 'active' } }),
      view('pg9', { claims: { 2: 'active' } }),
    ]);
    const current = withFleetShardLists(config, placement);
    expect(current.hosts.map((h) => [h.name, h.shardsSpec, h.shards])).toEqual([
      ['pg1', '1-3', [1, 2, 3]],
      ['pg2', '0,6-7', [0, 6, 7]],
      ['pg3', '4-5', [4, 5]],
    ]);
    expect(current.hosts.map((h) => [h.url, h.directUrl])).toEqual(config.hosts.map((h) => [h.url, h.directUrl]));
    expect(current.hosts[0]!.url).toBe('postgres://app:given@db1/app');
    expect({ ...current, hosts: [] }).toEqual({ ...config, hosts: [] });
  });
});

describe('requireCurrentMapLocked: a run that waited for the runner locks', () => {
  const config = eightShards(
    [
      '  - name: pg1',
      '    url: postgres://app:${SECRET}@db1/app',
      '    shards: "0-3"',
      '  - name: pg2',
      '    url: postgres://db2/app',
      '    shards: "4-7"',
    ],
    '/nowhere/shardctl.yaml',
  );
  const asFile = mergePlacement([
    view('pg1', { claims: { 0: 'active', 1: 'active', 2: 'active', 3: 'active' }, version: 3n }),
    view('pg2', { claims: { 4: 'active', 5: 'active', 6: 'active', 7: 'active' }, version: 3n }),
  ]);
  // Shard 1 moved to pg2 (version 4).
  const moved = mergePlacement([
    view('pg1', { claims: { 0: 'active', 2: 'active', 3: 'active' }, version: 4n }),
    view('pg2', { claims: { 1: 'active', 4: 'active', 5: 'active', 6: 'active', 7: 'active' }, version: 4n }),
  ]);
  const unreadable = () => Promise.reject(new Error('environment variable SECRET is not set'));

  it('takes the shard lists from the fleet when the config agreed with it before the wait and it moved on, reading no file', async () => {
    let read = 0;
    const current = await requireCurrentMapLocked(
      config,
      moved,
      () => {
        read++;
        return unreadable();
      },
      asFile,
    );
    expect(read).toBe(0);
    expect(current.hosts.map((h) => [h.name, h.url, h.shardsSpec])).toEqual([
      ['pg1', 'postgres://app:given@db1/app', '0,2-3'],
      ['pg2', 'postgres://db2/app', '1,4-7'],
    ]);
  });

  it('refuses a config that was stale before the wait too, or when the fleet did not move on, unless the file now agrees', async () => {
    // An older file (shard 2 on pg2, which it left before this run started): stale before the wait too.
    const stale = {
      ...config,
      hosts: config.hosts.map((h, i) => ({ ...h, shards: i === 0 ? [0, 1, 3] : [2, 4, 5, 6, 7] })),
    };
    await expect(requireCurrentMapLocked(stale, moved, unreadable, asFile)).rejects.toBeInstanceOf(StaleMapError);
    // No move finished meanwhile (the same version).
    await expect(requireCurrentMapLocked(config, moved, unreadable, moved)).rejects.toBeInstanceOf(StaleMapError);
    // No placement from before (a dry run): the file decides, as it reads now.
    await expect(requireCurrentMapLocked(config, moved, unreadable)).rejects.toBeInstanceOf(StaleMapError);
    const rewritten = await requireCurrentMapLocked(config, moved, () =>
      Promise.resolve({
        ...config,
        hosts: config.hosts.map((h, i) => ({
          ...h,
          shards: i === 0 ? [0, 2, 3] : [1, 4, 5, 6, 7],
          shardsSpec: i === 0 ? '0,2-3' : '1,4-7',
        })),
      }),
    );
    expect(rewritten.hosts.map((h) => h.shardsSpec)).toEqual(['0,2-3', '1,4-7']);
  });

  it('reads the file when the fleet placed a shard on a host the config does not name', async () => {
    const ontoNew = mergePlacement([
      view('pg1', { claims: { 0: 'active', 1: 'active', 2: 'active', 3: 'active' }, version: 4n }),
      view('pg2', { claims: { 4: 'active', 5: 'active', 6: 'active' }, version: 4n }),
      view('pg3', { claims: { 7: 'active' }, version: 4n }),
    ]);
    let read = 0;
    await expect(
      requireCurrentMapLocked(
        config,
        ontoNew,
        () => {
          read++;
          return unreadable();
        },
        asFile,
      ),
    ).rejects.toBeInstanceOf(StaleMapError);
    expect(read).toBe(1);
  });
});

describe('the file against the fleet', () => {
  const config = parseConfig(
    [
      'shards: 8',
      'hosts:',
      '  - name: pg1',
      '    url: postgres://db1/app',
      '    shards: "0-3"',
      '  - name: pg2',
      '    url: postgres://db2/app',
      '    shards: "4-7"',
      '',
    ].join('\n'),
    { file: '<inline>', env: {}, checkMigrationsDir: false },
  );

  it('names the ranges that moved, by file host and fleet host, and hosts the file lacks', () => {
    const placement = mergePlacement([
      view('pg1', { claims: { 0: 'active', 1: 'active' } }),
      view('pg2', { claims: { 2: 'active', 3: 'active', 4: 'active', 5: 'active', 6: 'active' } }),
      view('pg3', { claims: { 7: 'active' } }),
    ]);
    expect(describeDisagreements(mapDisagreements(config, placement))).toEqual([
      'shards 2-3: the file says pg1, the fleet says pg2',
      'shard 7: the file says pg2, the fleet says pg3 (a host the file does not list)',
    ]);
    expect(mapDisagreements(config, placement, new Set([2, 3, 7]))).toEqual([]);
  });

  it('compares nothing shard by shard when the fleet has another layout', () => {
    const other = {
      ...view('pg1', { claims: { 5: 'active' } }),
      layout: { schemaPrefix: 'other', shardCount: 4, epochMs: 0n, shardBits: 13, sequenceBits: 10 },
    };
    expect(mapDisagreements(config, mergePlacement([other]))).toEqual([]);
  });
});

describe('addresses and credentials', () => {
  it('keeps no user or password in a registry address', () => {
    expect(hostAddress('postgres://app:s3cret@db1:5432/app?sslmode=require&password=x')).toBe(
      'postgres://db1:5432/app?sslmode=require',
    );
    expect(hostAddress('not a url')).toBeNull();
  });

  it("reaches an address with the seed's user and password", () => {
    expect(withCredentials('postgres://db3:5433/app', 'postgres://app:p%40ss@db1/app')).toBe(
      'postgres://app:p%40ss@db3:5433/app',
    );
    expect(withCredentials('postgres://db3:5433/app', undefined)).toBe('postgres://db3:5433/app');
  });

  it("checks a registry address as strictly as the seed: the seed's TLS parameters win over the address's", () => {
    expect(
      withCredentials(
        'postgres://db3:5433/app?sslmode=disable&application_name=x',
        'postgres://app:pw@db1/app?sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem&connect_timeout=3',
      ),
    ).toBe('postgres://app:pw@db3:5433/app?sslmode=verify-full&application_name=x&sslrootcert=%2Fetc%2Fca.pem');
  });
});

describe('map pull rewrite', () => {
  it('moves the shards between lists, keeps comments, and adds a host the file lacks', () => {
    const text = [
      '# the map',
      'shards: 8',
      'hosts:',
      '  - name: pg1 # first',
      '    url: ${PG1}',
      '    shards: "0-3"',
      '  - name: pg2',
      '    url: postgres://db2/app',
      '    shards: "4-7"',
      '',
    ].join('\n');
    const owners = new Map([
      [2, 'pg2'],
      [3, 'pg2'],
      [7, 'pg3'],
    ]);
    const out = rewriteOwnersYaml(text, owners, [{ name: 'pg3', url: 'postgres://db3/app' }])!;
    expect(out).toContain('# the map');
    expect(out).toContain('- name: pg1 # first');
    expect(out).toContain('url: ${PG1}');
    expect(out).toContain('shards: "0-1"');
    expect(out).toContain('shards: "2-6"');
    expect(out).toMatch(/- name: pg3\n\s+url: postgres:\/\/db3\/app\n\s+shards: "7"/);
    expect(rewriteOwnersYaml(out, owners, [])).toBeNull();
  });
});

describe('fleetConfig', () => {
  it('refuses seeds without a control schema, saying in words to initialise the fleet, with init as the next step', () => {
    const placement = mergePlacement([{ ...view('pg1', { fleetId: null }), layout: null }]);
    let error: unknown;
    try {
      fleetConfig(null, { placement, unreachable: [], urls: new Map(), distrusted: [] });
    } catch (e) {
      error = e;
    }
    expect(error).toBeInstanceOf(HostError);
    expect((error as HostError).message).toBe(
      'host pg1: no shardctl control schema on the seeds (initialise the fleet first)',
    );
    expect((error as HostError).next).toEqual([{ action: 'init' }]);
  });
});
