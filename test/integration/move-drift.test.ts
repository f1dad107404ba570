import { describe, expect, it } from 'vitest';
import { init } from '../../src/commands/init.js';
import { status } from '../../src/commands/status.js';
import { makeFleet, runCli } from '../helpers/fleet.js';
import { replicationObjects } from '../helpers/moves.js';
import { useTestDatabases, withClient } from '../helpers/hosts.js';

const db = useTestDatabases(2);

/** What a refused move must not have left: a target schema, a move record, replication objects. */
async function nothingCreated(shard: number): Promise<void> {
  expect(await replicationObjects(db.urls)).toEqual([]);
  await withClient(db.urls[1]!, async (c) => {
    expect((await c.query(`select 1 from pg_namespace where nspname = $1`, [`insta${shard}`])).rowCount).toBe(0);
  });
  for (const url of db.urls) {
    await withClient(url, async (c) => expect((await c.query(`select 1 from shardctl.moves`)).rowCount).toBe(0));
  }
}

describe('a column added or dropped by hand on a shard table', () => {
  it('is reported by status (exit 3) and refused by the move preflight, naming the table and the column, before anything is created', async () => {
    const fleet = makeFleet({ urls: db.urls, shards: 8, split: ['0-3', '4-7'] });
    expect((await init(await fleet.config())).ok).toBe(true);
    expect((await status(await fleet.config())).ok).toBe(true);

    await withClient(db.urls[0]!, (c) =>
      c.query(`alter table insta1.photos add column hotfix int; alter table insta2.likes drop column user_id`),
    );
    await withClient(db.urls[0]!, (c) =>
      c.query(`insert into insta1.photos (user_id, image_url, hotfix) values (1, 'x', 7)`),
    );

    const report = await status(await fleet.config());
    expect(report.ok).toBe(false);
    const pg1 = report.hosts[0]!;
    expect(pg1.drift).toEqual([
      'shard 1 (insta1) differs from shard 0 (insta0), which has the same migrations: table insta1.photos has a column hotfix (integer) that insta0 lacks (changed by hand, outside the migrations)',
      'shard 2 (insta2) differs from shard 0 (insta0), which has the same migrations: table insta2.likes lacks the column user_id (bigint) of insta0 (changed by hand, outside the migrations)',
    ]);
    expect(report.hosts[1]!.drift).toEqual([]);
    const cli = await runCli(['status', '-c', fleet.configFile]);
    expect(cli.code).toBe(3);
    expect(cli.stdout).toContain('drift: shard 1 (insta1) differs');
    // migrate --check, a CI gate, says the same (it said "current").
    const check = await runCli(['migrate', '--check', '--json', '-c', fleet.configFile]);
    expect(check.code, check.stderr).toBe(3);
    expect((JSON.parse(check.stdout) as { drift: string[] }).drift).toEqual(pg1.drift);

    for (const [shard, named] of [
      [1, 'table insta1.photos has a column hotfix (integer) that insta0 lacks'],
      [2, 'table insta2.likes lacks the column user_id (bigint) of insta0'],
    ] as const) {
      const run = await runCli(['move-shard', String(shard), '--to', 'pg2', '--yes', '-c', fleet.configFile]);
      expect(run.code, run.stderr).toBe(1);
      expect(run.stderr).toContain('nothing was changed');
      expect(run.stderr).toContain(
        `same tables as the migrations build: shard ${shard} (insta${shard}) differs from shard 0 (insta0)`,
      );
      expect(run.stderr).toContain(named);
      await nothingCreated(shard);
    }

    // A shard as its migrations built it still passes.
    const clean = await runCli(['move-shard', '3', '--to', 'pg2', '--dry-run', '-c', fleet.configFile]);
    expect(clean.code, clean.stderr).toBe(0);
    expect(clean.stdout).toContain(
      'ok   same tables as the migrations build: the tables of the batch match the other shards with the same migrations',
    );

    // Put right by hand: status is clean again.
    await withClient(db.urls[0]!, (c) => c.query(`alter table insta1.photos drop column hotfix`));
    expect((await status(await fleet.config())).hosts[0]!.drift).toEqual([
      expect.stringContaining('table insta2.likes lacks the column user_id') as string,
    ]);
  });
});
