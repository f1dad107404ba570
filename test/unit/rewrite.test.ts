import { describe, expect, it } from 'vitest';
import { parseConfig } from '../../src/config/load.js';
import { rewriteYaml } from '../../src/config/rewrite.js';
import { tempDir } from '../helpers/temp.js';

const yaml = `# production map
schemaPrefix: insta
shards: 8
hosts:
  - name: pg1   # old box
    url: postgres://app@db1/app
    shards: "0-3" # first half
  - name: pg2
    url: postgres://app@db2/app
    shards: "4-7"
  - name: pg3   # new box
    url: postgres://app@db3/app
    shards: ""
`;

describe('rewriting the map after a move', () => {
  it('moves one shard between hosts and keeps comments and everything else as written', () => {
    const out = rewriteYaml(yaml, 2, 'pg1', 'pg3')!;
    expect(out).toContain('# production map');
    expect(out).toContain('- name: pg1 # old box');
    expect(out).toContain('shards: "0-1,3" # first half');
    expect(out).toContain('shards: "2"');
    expect(out).toContain('shards: "4-7"');
    const config = parseConfig(out, { file: '/tmp/x.yaml', checkMigrationsDir: false });
    expect(config.hosts.map((h) => h.shards)).toEqual([[0, 1, 3], [4, 5, 6, 7], [2]]);
  });

  it('is idempotent: a shard already on the target changes nothing', () => {
    const once = rewriteYaml(yaml, 2, 'pg1', 'pg3')!;
    expect(rewriteYaml(once, 2, 'pg1', 'pg3')).toBeNull();
  });

  it('leaves an emptied host in the map with an empty list, which the loader accepts', () => {
    let text = yaml;
    for (const shard of [4, 5, 6, 7]) text = rewriteYaml(text, shard, 'pg2', 'pg3')!;
    expect(text).toMatch(/name: pg2\n\s+url: postgres:\/\/app@db2\/app\n\s+shards: ""/);
    expect(parseConfig(text, { file: '/tmp/x.yaml', checkMigrationsDir: false }).hosts[1]!.shards).toEqual([]);
  });
});

describe('rewriting the map file concurrently', () => {
  it('keeps both of two moves made at the same time (no lost update)', async () => {
    const { readFileSync, writeFileSync } = await import('node:fs');
    const { join } = await import('node:path');
    const { rewriteShardOwner } = await import('../../src/config/rewrite.js');
    const file = join(tempDir('shardctl-rewrite-'), 'shardctl.yaml');
    writeFileSync(file, yaml);
    await Promise.all([
      rewriteShardOwner(file, 1, 'pg1', 'pg3'),
      rewriteShardOwner(file, 5, 'pg2', 'pg3'),
      rewriteShardOwner(file, 2, 'pg1', 'pg3'),
    ]);
    const config = parseConfig(readFileSync(file, 'utf8'), { file, checkMigrationsDir: false });
    expect(config.hosts.map((h) => h.shards)).toEqual([
      [0, 3],
      [4, 6, 7],
      [1, 2, 5],
    ]);
  });
});

describe('the map file lock', () => {
  it('takes over a lock left by a process that no longer exists', async () => {
    const { readFileSync, writeFileSync, existsSync } = await import('node:fs');
    const { join } = await import('node:path');
    const { rewriteShardOwner } = await import('../../src/config/rewrite.js');
    const file = join(tempDir('shardctl-rewrite-'), 'shardctl.yaml');
    writeFileSync(file, yaml);
    writeFileSync(`${file}.lock`, '2147483646\n'); // no such pid
    const started = Date.now();
    expect(await rewriteShardOwner(file, 1, 'pg1', 'pg3')).toBe(true);
    expect(Date.now() - started).toBeLessThan(5_000);
    expect(readFileSync(file, 'utf8')).toContain('shards: "0,2-3"');
    expect(existsSync(`${file}.lock`)).toBe(false);
  });
});
