/**
 * Whether a router over a config object reads its file again (src/router/discover.ts, followsFile):
 * only while the object has the file's settings, shard lists and hosts the file added aside.
 */
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { loadConfig } from '../../src/config/load.js';
import type { ShardctlConfig } from '../../src/config/types.js';
import { followsFile } from '../../src/router/discover.js';
import { routerSettings } from '../../src/router/options.js';

const dir = mkdtempSync(path.join(tmpdir(), 'shardctl-router-file-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const HOSTS = [
  '  - name: pg1',
  '    url: postgres://app:${SECRET}@db1/app',
  '    shards: "0-3"',
  '  - name: pg2',
  '    url: postgres://app:${SECRET}@db2/app',
  '    shards: "4-7"',
];

function write(file: string, lines: readonly string[]): void {
  writeFileSync(file, ['shards: 8', 'hosts:', ...lines, ''].join('\n'));
}

describe('followsFile', () => {
  it('follows the file for the config as loaded, and after moves or a host added there; not for one changed in code', async () => {
    const file = path.join(dir, 'shardctl.yaml');
    write(file, HOSTS);
    const env = { SECRET: 'pw' };
    const settings = routerSettings({ env });
    const config = await loadConfig(file, { env, checkMigrationsDir: false });
    const changedHost = (change: Partial<ShardctlConfig['hosts'][number]>): ShardctlConfig => ({
      ...config,
      hosts: config.hosts.map((h, i) => (i === 1 ? { ...h, ...change } : h)),
    });
    const cases: [string, ShardctlConfig, boolean][] = [
      ['as loaded', config, true],
      [
        'a copy, its hosts and their keys in another order',
        {
          ...config,
          hosts: config.hosts
            .map((h) => Object.fromEntries(Object.entries(h).reverse()) as ShardctlConfig['hosts'][number])
            .reverse(),
        },
        true,
      ],
      ['a url changed in code', changedHost({ url: 'postgres://app:other@db2/app' }), false],
      ['a directUrl changed in code', changedHost({ directUrl: 'postgres://app:pw@db2:5433/app' }), false],
      ['a host timeout changed in code', changedHost({ timeoutMs: 1 }), false],
      ['hostTimeout changed in code', { ...config, hostTimeout: '1s' }, false],
      ['an inline config', { ...config, file: '<inline>' }, false],
    ];
    const seen = await Promise.all(cases.map(async ([what, given]) => [what, await followsFile(given, settings)]));
    expect(seen).toEqual(cases.map(([what, , follows]) => [what, follows]));
    // Another environment than the one it was loaded with gives other urls: not followed.
    expect(await followsFile(config, routerSettings({ env: { SECRET: 'else' } }))).toBe(false);

    // The file's shard lists rewritten by a move, and a host added to it: still the same settings.
    write(file, [
      ...HOSTS.map((l) => l.replace('"0-3"', '"0-2"').replace('"4-7"', '"3-7"')),
      '  - name: pg3',
      '    url: postgres://app:${SECRET}@db3/app',
      '    shards: ""',
    ]);
    expect(await followsFile(config, settings)).toBe(true);
    // A file that cannot be read now is not decided (the router asks again at its next reading),
    // nor one whose ${VAR} the router's env lacks.
    expect(await followsFile(config, routerSettings({ env: {} }))).toBeNull();
    rmSync(file);
    expect(await followsFile(config, settings)).toBeNull();
  });
});
