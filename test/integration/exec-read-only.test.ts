import { existsSync, chmodSync } from 'node:fs';
import { join } from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import { init } from '../../src/commands/init.js';
import { ShardRouter } from '../../src/router/router.js';
import { execSql } from '../../src/commands/exec.js';
import { UsageError } from '../../src/errors.js';
import { makeFleet, runCli, type Fleet } from '../helpers/fleet.js';
import { useTestDatabases, withClient } from '../helpers/hosts.js';
import { tempDir } from '../helpers/temp.js';

/**
 * exec without --write changes nothing, whatever the text says: each hostile text is refused with
 * exit 2 before anything is sent, and afterwards every shard still holds what it held.
 */

const db = useTestDatabases(2);

const MIGRATIONS = {
  '0001_photos.sql': `CREATE SEQUENCE photos_id_seq;
CREATE TABLE photos (id bigint PRIMARY KEY DEFAULT next_id('photos_id_seq'), user_id bigint NOT NULL, image_url text);
ALTER SEQUENCE photos_id_seq OWNED BY photos.id;`,
};

let fleet: Fleet;

beforeAll(async () => {
  fleet = makeFleet({ urls: db.urls, shards: 8, split: ['0-3', '4-7'], schemaPrefix: 'ro', migrations: MIGRATIONS });
  expect((await init(await fleet.config())).ok).toBe(true);
  for (const [i, url] of db.urls.entries()) {
    await withClient(url, async (c) => {
      for (let shard = i * 4; shard < i * 4 + 4; shard++)
        await c.query(`insert into ro${shard}.photos (user_id, image_url) values (${shard}, 'a'), (${shard}, 'b')`);
      // A function of the database that sets a transaction-local setting behind the text's back.
      await c.query(`create function public.mark() returns text language sql as $$
        select coalesce(current_setting('shardctl_test.mark', true), '') || '>' || set_config('shardctl_test.mark', current_schema(), true) $$`);
    });
  }
});

/** Each shard's photo rows (shards in order, over both hosts) and the tables in public. */
async function state(): Promise<{ photos: number[]; strayTables: string[] }> {
  const photos: number[] = [];
  const strayTables: string[] = [];
  for (const url of db.urls) {
    await withClient(url, async (c) => {
      for (let s = 0; s < 8; s++) {
        const n = await c.query<{ n: number }>(
          `select count(*)::int as n from pg_tables where schemaname = 'ro${s}' and tablename = 'photos'`,
        );
        if (n.rows[0]!.n === 1)
          photos.push((await c.query<{ n: number }>(`select count(*)::int as n from ro${s}.photos`)).rows[0]!.n);
      }
      const stray = await c.query<{ t: string }>(
        `select schemaname || '.' || tablename as t from pg_tables where schemaname = 'public' order by 1`,
      );
      strayTables.push(...stray.rows.map((row) => row.t));
    });
  }
  return { photos, strayTables };
}

describe('shardctl exec without --write', () => {
  const marker = (() => {
    const dir = tempDir('shardctl-copy-');
    chmodSync(dir, 0o777);
    return join(dir, 'ran');
  })();

  it.each([
    [
      `set transaction read write; insert into photos(user_id, image_url) values (42, 'x') returning id`,
      'statement 1 "set transaction read write": SET is not a read',
    ],
    [
      `commit; insert into photos(user_id, image_url) values (42, 'x')`,
      'statement 1 "commit": COMMIT ends or starts a transaction',
    ],
    ['select 1; commit; create table public.t(x int)', 'statement 2 "commit": COMMIT ends or starts a transaction'],
    ['select count(*) from photos; delete from photos', 'statement 2 "delete from photos": DELETE is not a read'],
    [`copy (select 1) to program 'touch ${marker}'`, 'COPY is not a read'],
    [`select set_config('search_path', 'public', false)`, 'set_config() changes a setting'],
    [`select set_config('shardctl_test.x', 'y', false)`, 'set_config() changes a setting'],
    [`select pg_advisory_lock(42)`, 'pg_advisory_lock() holds its lock after the transaction'],
    [
      `with x as (select 1) select * from x;\nrollback;\ndelete from photos`,
      'statement 2 (line 2) "rollback": ROLLBACK ends the transaction',
    ],
    [`select 'a\\'; commit; delete from photos; select '`, 'statement 2 "commit"'],
  ])('refuses %j with exit 2 and the reason, changing nothing', async (sql, reason) => {
    const before = await state();
    const run = await runCli(['exec', '-c', fleet.configFile, '--concurrency', '1', sql]);
    expect(run.code).toBe(2);
    expect(run.stderr).toContain('error: argument <sql>: ');
    expect(run.stderr).toContain(reason);
    expect(run.stdout).toBe('');
    expect(await state()).toEqual(before);
    expect(before.photos).toEqual([2, 2, 2, 2, 2, 2, 2, 2]);
    expect(before.strayTables).toEqual([]);
    expect(existsSync(marker)).toBe(false);
  });

  it('with --write still refuses what ends the shard transaction or changes the session', async () => {
    for (const [sql, refused] of [
      [`insert into photos (user_id) values (1); commit; delete from photos`, 'statement 2 "commit": COMMIT ends'],
      ['set search_path to public; create table t(x int)', 'statement 1 "set search_path to public": SET outlives'],
      ['delete from photos; reset all', 'statement 2 "reset all": RESET changes'],
    ]) {
      const run = await runCli(['exec', '-c', fleet.configFile, '--write', sql!]);
      expect(run.code, sql).toBe(2);
      expect(run.stderr).toContain(`error: argument <sql>: ${refused}`);
    }
    expect(await state()).toEqual({ photos: [2, 2, 2, 2, 2, 2, 2, 2], strayTables: [] });
  });

  it('the library refuses the same texts (execSql and queryEachShard), before connecting', async () => {
    const router = ShardRouter.fromConfig(await fleet.config());
    try {
      await expect(execSql(router, 'select 1; commit; create table public.t(x int)')).rejects.toBeInstanceOf(
        UsageError,
      );
      await expect(execSql(router, 'delete from photos')).rejects.toThrow('DELETE is not a read');
      await expect(router.queryEachShard('select 1; commit', { readOnly: true })).rejects.toThrow(
        'COMMIT ends or starts a transaction',
      );
      await expect(
        router.queryEachShard('insert into photos (user_id) values (1); set search_path to public', {}),
      ).rejects.toThrow('SET outlives');
      expect(router.openPools()).toEqual([]);
    } finally {
      await router.close();
    }
  });

  it("runs a transaction-local set_config() of a setting other than search_path and role (row-level security's)", async () => {
    const run = await runCli([
      'exec',
      '-c',
      fleet.configFile,
      '--shards',
      '0-1',
      '--csv',
      "select set_config('shardctl_test.user_id', '42', true) as v, current_setting('shardctl_test.user_id') as s",
    ]);
    expect(run.code, run.stderr).toBe(0);
    expect(run.stdout).toBe('shard,v,s\n0,42,42\n1,42,42\n');
  });

  it('gives each shard of a round trip its own transaction: a setting one shard makes is not seen by the next', async () => {
    // One connection per host, so each host's shards 1-3 and 5-7 go in one round trip.
    const run = await runCli([
      'exec',
      '-c',
      fleet.configFile,
      '--concurrency',
      '1',
      '--csv',
      'select public.mark() as m, current_schema() as s',
    ]);
    expect(run.code).toBe(0);
    expect(run.stdout).toBe(`shard,m,s\n${Array.from({ length: 8 }, (_, i) => `${i},>ro${i},ro${i}\n`).join('')}`);
  });

  it('runs SELECTs, CTEs, VALUES, TABLE, EXPLAIN and SHOW on every shard in its own schema', async () => {
    const show = await runCli(['exec', '-c', fleet.configFile, '--csv', 'show search_path']);
    expect(show.code).toBe(0);
    expect(show.stdout).toBe(
      `shard,search_path\n${Array.from({ length: 8 }, (_, i) => `${i},"ro${i}, pg_temp"\n`).join('')}`,
    );
    const cte = await runCli([
      'exec',
      '-c',
      fleet.configFile,
      '--csv',
      `with c as (select count(*)::int as n from photos where image_url <> 'commit; delete') select n, current_schema() as s from c; -- commit;`,
    ]);
    expect(cte.code).toBe(0);
    expect(cte.stdout).toBe(`shard,n,s\n${Array.from({ length: 8 }, (_, i) => `${i},2,ro${i}\n`).join('')}`);
    const explain = await runCli([
      'exec',
      '-c',
      fleet.configFile,
      '--json',
      '--shards',
      '0,5',
      'explain select * from photos',
    ]);
    expect(explain.code).toBe(0);
    expect(
      (JSON.parse(explain.stdout) as { shard: number; 'QUERY PLAN': string }[]).some(
        (r) => r.shard === 5 && r['QUERY PLAN'].includes('photos'),
      ),
    ).toBe(true);
    const table = await runCli(['exec', '-c', fleet.configFile, '--csv', '--shards', '2', 'values (1); table photos']);
    expect(table.code).toBe(0);
    expect(table.stdout.split('\n')).toHaveLength(4);
  });

  it('lets PostgreSQL refuse what reads cannot hide: a data-modifying CTE, SELECT INTO, FOR UPDATE, nextval', async () => {
    for (const sql of [
      `with d as (delete from photos returning 1) select count(*) from d`,
      'select * into public.copy from photos',
      'select * from photos for update',
      `select nextval('photos_id_seq')`,
    ]) {
      const run = await runCli(['exec', '-c', fleet.configFile, '--shards', '0-7', sql]);
      expect(run.code, sql).toBe(1);
      expect(run.stderr).toContain('8 of 8 shards failed');
      expect(run.stderr).toContain('(SQLSTATE 25006)');
    }
    expect(await state()).toEqual({ photos: [2, 2, 2, 2, 2, 2, 2, 2], strayTables: [] });
  });
});
