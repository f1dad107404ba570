/**
 * Hosts that are down, or go down during a migrate. The second host is a throw-away cluster of
 * this file's own, so stopping it does not disturb the shared test hosts.
 */
import { randomBytes } from 'node:crypto';
import { chmod, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  findFreePort,
  initCluster,
  type LocalClusterOptions,
  startCluster,
  stopCluster,
} from '../../src/dev/local-postgres.js';
import { init } from '../../src/commands/init.js';
import { type Fleet, makeFleet, runCli } from '../helpers/fleet.js';
import { useTestDatabases } from '../helpers/hosts.js';
import { range, shardsAt, shardsNotAt, waitFor } from '../helpers/migrations.js';

describe('migrate when a host is down or goes down', () => {
  const db = useTestDatabases(1);
  let root = '';
  let cluster: LocalClusterOptions;
  let pg2 = '';
  let fleet: Fleet;

  beforeAll(async () => {
    root = await mkdtemp(join(tmpdir(), 'shardctl-host-down-'));
    // The server runs as the OS user postgres when we are root: it must reach the data directory.
    await chmod(root, 0o755);
    const password = randomBytes(12).toString('hex');
    cluster = { dataDir: join(root, 'pg2'), port: await findFreePort(), password };
    await initCluster(cluster);
    await startCluster(cluster);
    pg2 = `postgres://postgres:${password}@127.0.0.1:${cluster.port}/postgres`;
    fleet = makeFleet({ urls: [db.urls[0]!, pg2], shards: 120 }); // pg1: 0-59, pg2: 60-119
    expect((await init(await fleet.config())).ok).toBe(true);
  });

  afterAll(async () => {
    if (cluster) await stopCluster(cluster).catch(() => undefined);
    if (root) await rm(root, { recursive: true, force: true });
  });

  it('a host that goes down mid-run: the other host finishes; exit 1 names the host and how many shards are behind; a rerun once it is back completes', async () => {
    fleet.writeMigration(
      '0004_photo_views.sql',
      'ALTER TABLE photos ADD COLUMN views bigint NOT NULL DEFAULT 0;\nSELECT pg_sleep(0.03);\n',
    );
    const running = runCli(['migrate', '-c', fleet.configFile]);
    await waitFor('pg2 to be part-way', async () => (await shardsAt(pg2, 4)) >= 10);
    await stopCluster(cluster);
    const run = await running;

    expect(run.code).toBe(1);
    expect(run.stderr).toMatch(/^pg1: 60 migrations applied, 0 already current \(\d+\.\d s\)$/m);
    const failed =
      /^pg2: FAILED: connection lost while on shard (\d+) \(migration 0004_photo_views\): .+; (\d+) shards behind \(\d+ migrations applied before that\)$/m.exec(
        run.stderr,
      );
    expect(failed, run.stderr).not.toBeNull();
    const behind = Number(failed![2]);
    expect(run.stderr).toMatch(
      new RegExp(
        `^migrate: \\d+ migrations applied, 0 shards already current, 0 failed, ${behind} shards behind on pg2; 2 hosts`,
        'm',
      ),
    );
    expect(await shardsAt(db.urls[0]!, 4)).toBe(60);

    await startCluster(cluster);
    const missing = 60 - (await shardsAt(pg2, 4));
    expect(missing).toBeGreaterThan(0);
    // Shards whose commit was in flight when the server stopped count as behind: at most one per connection.
    expect(behind).toBeGreaterThanOrEqual(missing);
    expect(behind - missing).toBeLessThanOrEqual(2);

    const rerun = await runCli(['migrate', '-c', fleet.configFile]);
    expect(rerun.stderr).toContain(
      `migrate: ${missing} migrations applied, ${120 - missing} shards already current, 0 failed; 2 hosts`,
    );
    expect(rerun.code).toBe(0);
    expect(await shardsNotAt(pg2, range(60, 119), [1, 2, 3, 4])).toEqual([]);
  });

  it('a host that is down from the start: the other host is migrated; exit 1 names it with all its shards behind; --check exits 1', async () => {
    fleet.writeMigration('0005_after_outage.sql', 'CREATE TABLE after_outage (id bigint);\n');
    await stopCluster(cluster);
    try {
      const run = await runCli(['migrate', '-c', fleet.configFile]);
      expect(run.stderr).toMatch(/^warning: host pg2: cannot connect: .+; its shards are left behind$/m);
      expect(run.stderr).toMatch(/^pg2: FAILED: cannot connect: .+; 60 shards behind$/m);
      expect(run.stderr).toMatch(/^pg1: 60 migrations applied, 0 already current/m);
      expect(run.stderr).toMatch(
        /^migrate: 60 migrations applied, 0 shards already current, 0 failed, 60 shards behind on pg2; 2 hosts/m,
      );
      expect(run.code).toBe(1);
      expect(await shardsAt(db.urls[0]!, 5)).toBe(60);

      // A dry run cannot say what the real run would do on a host it cannot read: not a success.
      const dry = await runCli(['migrate', '--dry-run', '-c', fleet.configFile]);
      expect(dry.stderr).toMatch(
        /^migrate --dry-run: 0 shards would change on 1 host; pg2 could not be read \(60 shards not planned\); nothing was written$/m,
      );
      expect(dry.code).toBe(1);
      const dryJson = await runCli(['migrate', '--dry-run', '--json', '-c', fleet.configFile]);
      expect(dryJson.code).toBe(1);
      expect(JSON.parse(dryJson.stdout)).toMatchObject({
        ok: false,
        unreadHosts: [{ host: 'pg2', error: expect.stringContaining('cannot connect') }],
      });

      const check = await runCli(['migrate', '--check', '--json', '-c', fleet.configFile]);
      expect(check.code).toBe(1);
      expect(check.stderr).toMatch(/^pg2: cannot be read: cannot connect: /m);
      expect(check.stderr).toContain('migrate --check: pg2 could not be read');
      expect(JSON.parse(check.stdout)).toMatchObject({
        current: false,
        exitCode: 1,
        hosts: [
          { host: 'pg1', shards: 0 },
          { host: 'pg2', error: expect.stringContaining('cannot connect') },
        ],
      });
    } finally {
      await startCluster(cluster);
    }
    const rerun = await runCli(['migrate', '-c', fleet.configFile]);
    expect(rerun.stderr).toContain('migrate: 60 migrations applied, 60 shards already current, 0 failed; 2 hosts');
    expect(rerun.code).toBe(0);
    expect(await shardsNotAt(pg2, range(60, 119), [1, 2, 3, 4, 5])).toEqual([]);
  });
});
