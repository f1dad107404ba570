/**
 * ShardMap.load with an environment of the caller's own: the file's ${VAR}s come from it, at load
 * and at every reload (they came from the process's environment only, as loadConfig's options allow
 * otherwise).
 */
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { ShardMap } from '../../src/config/shard-map.js';
import { UsageError } from '../../src/errors.js';

const dir = mkdtempSync(path.join(tmpdir(), 'shardctl-shard-map-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

function write(file: string, split: readonly [string, string]): void {
  writeFileSync(
    file,
    [
      'shards: 8',
      'hosts:',
      '  - name: pg1',
      '    url: postgres://app:${MAP_TEST_SECRET}@db1/app',
      `    shards: "${split[0]}"`,
      '  - name: pg2',
      '    url: postgres://app:${MAP_TEST_SECRET}@db2/app',
      `    shards: "${split[1]}"`,
      '',
    ].join('\n'),
  );
}

describe('ShardMap.load', () => {
  it('takes ${VAR}s from the env it is given, and reloads with the same one', async () => {
    expect(process.env.MAP_TEST_SECRET).toBeUndefined();
    const file = path.join(dir, 'env.yaml');
    write(file, ['0-3', '4-7']);
    await expect(ShardMap.load(file)).rejects.toThrow(/MAP_TEST_SECRET/);
    const map = await ShardMap.load('env.yaml', { env: { MAP_TEST_SECRET: 's3cret' }, cwd: dir });
    expect(map.hostForShard(3)).toMatchObject({ name: 'pg1', url: 'postgres://app:s3cret@db1/app' });
    write(file, ['0-2', '3-7']);
    await map.reload();
    expect(map.hostForShard(3)).toMatchObject({ name: 'pg2', url: 'postgres://app:s3cret@db2/app' });
  });

  it('refuses an option it does not know, naming it', async () => {
    const file = path.join(dir, 'opt.yaml');
    write(file, ['0-3', '4-7']);
    const load = ShardMap.load(file, { environment: {} } as never);
    await expect(load).rejects.toBeInstanceOf(UsageError);
    await expect(load).rejects.toThrow(/environment/);
  });
});
