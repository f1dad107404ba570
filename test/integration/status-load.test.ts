import { describe, expect, it } from 'vitest';
import { init } from '../../src/commands/init.js';
import { shardLoad } from '../../src/commands/load.js';
import { ShardRouter } from '../../src/router/router.js';
import { makeFleet, runCli } from '../helpers/fleet.js';
import { useTestDatabases } from '../helpers/hosts.js';

const PHOTOS_ONLY = {
  '0001_photos.sql': `CREATE SEQUENCE photos_id_seq;
CREATE TABLE photos (id bigint PRIMARY KEY DEFAULT next_id('photos_id_seq'), user_id bigint NOT NULL, image_url text NOT NULL);
ALTER SEQUENCE photos_id_seq OWNED BY photos.id;`,
};

describe('status --load', () => {
  const db = useTestDatabases(2);

  it('after a known number of inserts into one shard, it is first, with its host, in status --load', async () => {
    const fleet = makeFleet({
      urls: db.urls,
      shards: 8,
      split: ['0-3', '4-7'],
      schemaPrefix: 'ld',
      migrations: PHOTOS_ONLY,
    });
    const config = await fleet.config();
    expect((await init(config)).ok).toBe(true);
    const router = await ShardRouter.open(fleet.configFile);
    try {
      // 40 single-row inserts into shard 6 (keys 6, 14, …), 5 into shard 1, and one read of shard 1.
      for (let i = 0n; i < 40n; i++) {
        await router.withKey(6n + 8n * i, (c) =>
          c.query(`insert into photos (user_id, image_url) values ($1, 'h')`, [i]),
        );
      }
      for (let i = 0n; i < 5n; i++) {
        await router.withKey(1n, (c) => c.query(`insert into photos (user_id, image_url) values ($1, 'c')`, [i]));
      }
      await router.withKey(1n, (c) => c.query('select * from photos where user_id >= $1', [0]));
    } finally {
      await router.close();
    }
    // The server counts a session's rows when it reports them (PostgreSQL 15+: within a second of idling).
    await expect
      .poll(async () => (await shardLoad(config)).shards.find((s) => s.shard === 6)?.writes, { timeout: 10_000 })
      .toBe(40n);
    await expect
      .poll(async () => (await shardLoad(config)).shards.find((s) => s.shard === 1)?.reads, { timeout: 10_000 })
      .toBe(5n);
    const load = await shardLoad(config);
    expect(load.shards.slice(0, 2).map((s) => [s.shard, s.host, s.writes, s.reads])).toEqual([
      [6, 'pg2', 40n, 0n],
      [1, 'pg1', 5n, 5n],
    ]);
    expect(load.shards).toHaveLength(8);
    expect(load.hosts.map((h) => [h.host, h.shards, h.writes, h.reads])).toEqual([
      ['pg2', 4, 40n, 0n],
      ['pg1', 4, 5n, 5n],
    ]);

    const human = await runCli(['status', '--load', '-c', fleet.configFile]);
    expect(human.code).toBe(0);
    const lines = human.stdout.split('\n');
    expect(lines[0]).toMatch(/^host\s+shards\s+writes\s+reads/);
    expect(lines[1]).toMatch(/^pg2\s+4\s+40\s+0\s+since /);
    const busiest = lines.indexOf('busiest shards:');
    expect(lines[busiest + 2]).toMatch(/^\s+6\s+pg2\s+40\s+0$/);

    const json = await runCli(['status', '--load', '--json', '-c', fleet.configFile]);
    const data = JSON.parse(json.stdout) as { shards: { shard: number; writes: unknown }[] };
    expect(data.shards[0]).toMatchObject({ shard: 6, host: 'pg2', writes: '40' });

    // rebalance --by load weighs the shards by the same counts (a dry run: the plan, nothing moved).
    const plan = await runCli(['rebalance', '--by', 'load', '--dry-run', '--json', '-c', fleet.configFile]);
    expect(plan.code, plan.stderr).toBe(0);
    const planned = JSON.parse(plan.stdout) as { outcome: string; by: string; plan: { by: string } };
    expect(planned).toMatchObject({ outcome: 'dry-run', by: 'load', plan: { by: 'load' } });
    const wrong = await runCli(['rebalance', '--by', 'heat', '--dry-run', '-c', fleet.configFile]);
    expect(wrong.code).toBe(2);
    expect(wrong.stderr).toContain('expected count, size or load');

    const both = await runCli(['status', '--load', '--sizes', '-c', fleet.configFile]);
    expect(both.code).toBe(2);
    expect(both.stderr).toContain('option --load: give --sizes or --load, not both');
  });
});
