import { readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import pg from 'pg';
import { beforeAll, describe, expect, it } from 'vitest';
import { RUNNER_LOCK_TABLE, WORKERS_TABLE } from '../../src/fleet/locks.js';
import { init } from '../../src/commands/init.js';
import { type Fleet, makeFleet, runCli } from '../helpers/fleet.js';
import { adminClient, useTestDatabases, withClient } from '../helpers/hosts.js';
import { range, shardsAt, shardsNotAt, spawnCli, waitFor } from '../helpers/migrations.js';

async function count(url: string, sql: string, params: unknown[] = []): Promise<number> {
  return withClient(url, async (client) => Number((await client.query<{ n: string }>(sql, params)).rows[0]!.n));
}

/** Per shard schema on a host: how many rows of `table` match `where` (a constant SQL condition). */
async function rowsPerShard(url: string, table: string, where: string): Promise<Map<number, number>> {
  return withClient(url, async (client) => {
    const result = await client.query<{ shard: number; n: number }>(
      `select substr(nspname, 6)::int as shard,
              (xpath('/row/n/text()', query_to_xml(format('select count(*) as n from %I.%I where ${where.replaceAll("'", "''")}', nspname, $1::text), false, true, '')))[1]::text::int as n
         from pg_namespace where nspname ~ '^insta[0-9]+$' order by 1`,
      [table],
    );
    return new Map(result.rows.map((r) => [r.shard, r.n]));
  });
}

function counts(map: Map<number, number>): number[] {
  return [...new Set(map.values())].sort();
}

describe('migrate with a table locked by the application', () => {
  const db = useTestDatabases(2);

  it('with --lock-retries 0 fails only the busy shard after lockTimeout, naming host, shard, migration and holder; the others finish (exit 1) and a rerun completes it', async () => {
    const fleet = makeFleet({ urls: db.urls, shards: 80, extra: 'lockTimeout: 300ms' });
    expect((await init(await fleet.config())).ok).toBe(true);
    fleet.writeMigration('0004_photo_views.sql', 'ALTER TABLE photos ADD COLUMN views bigint NOT NULL DEFAULT 0;\n');

    const app = await adminClient(db.urls[1]!);
    try {
      await app.query('begin');
      await app.query('lock table insta50.photos in access exclusive mode');
      const started = Date.now();
      const run = await runCli(['migrate', '--lock-retries', '0', '-c', fleet.configFile]);
      const took = Date.now() - started;
      expect(run.stderr).toMatch(
        /host pg2, shard 50: migration 0004_photo_views: could not lock a table within lockTimeout 300ms \(held by pid \d+ \([^)]*AccessExclusiveLock on photos\)\): /,
      );
      expect(run.stderr).toContain(
        'this shard was skipped, the others went on; run migrate again when the lock is released — canceling statement due to lock timeout (SQLSTATE 55P03); not tried again (lock retries 0)',
      );
      expect(run.stderr).toMatch(/^migrate: 79 migrations applied, 0 shards already current, 1 failed; 2 hosts/m);
      expect(run.code).toBe(1);
      expect(took).toBeLessThan(5_000);
      expect(await shardsAt(db.urls[0]!, 4)).toBe(40);
      expect(await shardsNotAt(db.urls[1]!, range(40, 79), [1, 2, 3, 4])).toEqual(['shard 50: [1,2,3]']);
    } finally {
      await app.query('rollback');
      await app.end();
    }

    const rerun = await runCli(['migrate', '-c', fleet.configFile]);
    expect(rerun.stderr).toContain('migrate: 1 migration applied, 79 shards already current, 0 failed; 2 hosts');
    expect(rerun.code).toBe(0);
  });
});

describe('one shardctl runner per host', () => {
  const db = useTestDatabases(2);
  let fleet: Fleet;

  beforeAll(async () => {
    fleet = makeFleet({ urls: db.urls, shards: 80, extra: 'lockTimeout: 300ms' });
    expect((await init(await fleet.config())).ok).toBe(true);
  });

  it('a second migrate, init or add-schema fails fast (exit 1) naming the host and the holder, and writes nothing', async () => {
    fleet.writeMigration('0004_photo_views.sql', 'ALTER TABLE photos ADD COLUMN views bigint NOT NULL DEFAULT 0;\n');
    const holder = new pg.Client({ connectionString: db.urls[1]!, application_name: 'held-by-test' });
    await holder.connect();
    try {
      await holder.query(`begin; lock table ${RUNNER_LOCK_TABLE} in share update exclusive mode`);
      for (const command of [['migrate'], ['init'], ['add-schema', '5']]) {
        const started = Date.now();
        const run = await runCli([...command, '-c', fleet.configFile]);
        expect(run.stderr).toMatch(
          /host pg2: another shardctl run holds the runner lock \(backend pid \d+, application held-by-test, from [^)]+\); waited 300ms, nothing was written/,
        );
        expect(run.code).toBe(1);
        // Not held up by the holder, which keeps the lock until the test ends: the CLI's start-up and
        // its one wait of lockTimeout (300ms). Loosely bounded: a loaded machine starts the CLI slowly.
        expect(Date.now() - started).toBeLessThan(10_000);
      }
      expect(await shardsAt(db.urls[0]!, 4)).toBe(0);
      expect(await shardsAt(db.urls[1]!, 4)).toBe(0);
      // pg1 was locked first; giving up released it.
      expect(
        await count(
          db.urls[0]!,
          `select count(*) as n from pg_locks where locktype = 'relation' and relation = to_regclass($1)`,
          [RUNNER_LOCK_TABLE],
        ),
      ).toBe(0);
    } finally {
      await holder.end();
    }
    const run = await runCli(['migrate', '-c', fleet.configFile]);
    expect(run.code).toBe(0);
    expect(await shardsAt(db.urls[1]!, 4)).toBe(40);
  });

  it('waits for workers a killed run left running before it reads the catalog, and names them when they outlast lockTimeout', async () => {
    fleet.writeMigration(
      '0005_photo_flags.sql',
      'ALTER TABLE photos ADD COLUMN flagged boolean NOT NULL DEFAULT false;\n',
    );
    const waitingConfig = path.join(path.dirname(fleet.configFile), 'waiting.shardctl.yaml');
    // A worker of a dead run: its backend is still recorded, and alive, while it finishes a statement.
    const orphan = new pg.Client({ connectionString: db.urls[0]!, application_name: 'shardctl worker' });
    await orphan.connect();
    try {
      const pid = (
        await orphan.query<{ pid: number }>(
          `insert into ${WORKERS_TABLE} select pid, backend_start from pg_stat_activity where pid = pg_backend_pid() returning pid`,
        )
      ).rows[0]!.pid;
      const statement = orphan.query('select pg_sleep(60)').catch(() => undefined);
      await waitFor(
        'the orphan to run its statement',
        async () =>
          (await count(db.urls[0]!, `select count(*) as n from pg_stat_activity where pid = $1 and state = 'active'`, [
            pid,
          ])) === 1,
      );
      const run = await runCli(['migrate', '-c', fleet.configFile]);
      expect(run.stderr).toMatch(
        /host pg1: workers of another shardctl run are still running after 300ms \(backend pid \d+, application shardctl worker, [^)]+\); nothing was written/,
      );
      expect(run.code).toBe(1);
      expect(await shardsAt(db.urls[0]!, 5)).toBe(0);
      expect(await shardsAt(db.urls[1]!, 5)).toBe(0);

      // The orphan's statement ends while the next run waits: that run goes on. The orphan's
      // backend stays, idle: a backend that runs nothing (a dead client's, or one a pooler keeps
      // for other clients) is no reason to wait. That run waits up to 30 s, not 300 ms: the
      // cancel below must land within its wait (a loaded machine once took longer than 300 ms).
      writeFileSync(
        waitingConfig,
        readFileSync(fleet.configFile, 'utf8').replace('lockTimeout: 300ms', 'lockTimeout: 30s'),
      );
      const waiting = runCli(['migrate', '-c', waitingConfig]);
      await waitFor(
        'the run to hold the runner lock and wait for the worker',
        async () =>
          (await count(
            db.urls[0]!,
            `select count(*) as n from pg_locks where locktype = 'relation' and relation = to_regclass($1) and granted`,
            [RUNNER_LOCK_TABLE],
          )) === 1,
      );
      await withClient(db.urls[0]!, (c) => c.query('select pg_cancel_backend($1)', [pid]));
      await statement;
      const done = await waiting;
      expect(done.stderr).toContain('migrate: 80 migrations applied');
      expect(done.code).toBe(0);
    } finally {
      await orphan.end();
    }
  });

  it("does not wait for a recorded backend that now runs another client's statement (a pooler hands a killed run's server connections to applications)", async () => {
    // A backend a killed run recorded, now busy for an application, as behind a transaction pooler.
    const pooled = new pg.Client({ connectionString: db.urls[0]!, application_name: 'photo-app' });
    await pooled.connect();
    try {
      const pid = (
        await pooled.query<{ pid: number }>(
          `insert into ${WORKERS_TABLE} select pid, backend_start from pg_stat_activity where pid = pg_backend_pid() returning pid`,
        )
      ).rows[0]!.pid;
      const statement = pooled.query('select pg_sleep(60)').catch(() => undefined);
      await waitFor(
        'the application to run its statement',
        async () =>
          (await count(db.urls[0]!, `select count(*) as n from pg_stat_activity where pid = $1 and state = 'active'`, [
            pid,
          ])) === 1,
      );
      // Nothing pending: the run takes the runner lock, looks for workers, and finds none running.
      const run = await runCli(['migrate', '-c', fleet.configFile]);
      expect({ code: run.code, stderr: run.stderr }).toEqual({ code: 0, stderr: expect.any(String) });
      await withClient(db.urls[0]!, (c) => c.query('select pg_cancel_backend($1)', [pid]));
      await statement;
    } finally {
      await pooled.end();
    }
  });

  it('two real runners at once: the second fails fast naming the host, the first finishes, nothing is applied twice', async () => {
    fleet.writeMigration(
      '0006_runner_rows.sql',
      "INSERT INTO photos (user_id, image_url) VALUES (-6, 'runner-test');\nSELECT pg_sleep(0.05);\n",
    );
    const first = spawnCli(['migrate', '-c', fleet.configFile]);
    await waitFor(
      'the first runner to apply something',
      async () => (await shardsAt(db.urls[0]!, 6)) > 0 || first.child.exitCode !== null,
    );
    const started = Date.now();
    const second = await runCli(['migrate', '-c', fleet.configFile]);
    // Refused (below), not run after the first: loosely bounded, a loaded machine starts the CLI slowly.
    expect(Date.now() - started).toBeLessThan(10_000);
    expect(second.stderr).toMatch(
      /host pg1: another shardctl run holds the runner lock \(backend pid \d+, application shardctl, /,
    );
    expect(second.code).toBe(1);

    const end = await first.exited;
    expect(end.stderr).toContain('migrate: 80 migrations applied, 0 shards already current, 0 failed; 2 hosts');
    expect(end.code).toBe(0);
    for (const url of db.urls)
      expect(counts(await rowsPerShard(url, 'photos', "image_url = 'runner-test'"))).toEqual([1]);
    expect(await shardsNotAt(db.urls[0]!, range(0, 39), [1, 2, 3, 4, 5, 6])).toEqual([]);
    expect(await shardsNotAt(db.urls[1]!, range(40, 79), [1, 2, 3, 4, 5, 6])).toEqual([]);
  });
});

describe('a migrate killed with SIGKILL', () => {
  const db = useTestDatabases(2);
  const SHARDS = 160; // pg1: 0-79, pg2: 80-159

  it('resumes on rerun: every shard at the latest version, each migration recorded and applied exactly once', async () => {
    const fleet = makeFleet({ urls: db.urls, shards: SHARDS });
    expect((await init(await fleet.config())).ok).toBe(true);
    fleet.writeMigration(
      '0004_photo_views.sql',
      "ALTER TABLE photos ADD COLUMN views bigint NOT NULL DEFAULT 0;\nINSERT INTO photos (user_id, image_url) VALUES (-4, 'once');\nSELECT pg_sleep(0.05);\n",
    );
    fleet.writeMigration(
      '0005_shares.sql',
      'CREATE TABLE shares (photo_id bigint NOT NULL, user_id bigint NOT NULL);\nINSERT INTO shares VALUES (-5, -5);\nSELECT pg_sleep(0.05);\n',
    );
    const total = SHARDS * 2;
    const applied = async (): Promise<number> => {
      let n = 0;
      for (const url of db.urls)
        n += await count(url, 'select count(*) as n from shardctl.migrations where version in (4, 5)');
      return n;
    };

    // Killed at three moments, each run resuming what the one before left.
    for (const target of [20, 80, 150]) {
      const run = spawnCli(['migrate', '-c', fleet.configFile]);
      await waitFor(
        `${target} migrations applied`,
        async () => (await applied()) >= target || run.child.exitCode !== null,
      );
      run.child.kill('SIGKILL');
      const end = await run.exited;
      expect(end.signal, `the run finished before it could be killed:\n${end.stderr}`).toBe('SIGKILL');
      // Its coordinator's backend goes with the connection; its workers may still be finishing a statement.
      for (const url of db.urls) {
        await waitFor(
          'the killed coordinator to disconnect',
          async () =>
            (await count(
              url,
              `select count(*) as n from pg_stat_activity where datname = current_database() and application_name = 'shardctl'`,
            )) === 0,
        );
      }
    }
    expect(await applied()).toBeLessThan(total);

    const rerun = await runCli(['migrate', '-c', fleet.configFile]);
    expect(rerun.stderr).toMatch(/^migrate: \d+ migrations applied, \d+ shards already current, 0 failed; 2 hosts/m);
    expect(rerun.code).toBe(0);
    expect(await shardsNotAt(db.urls[0]!, range(0, 79), [1, 2, 3, 4, 5])).toEqual([]);
    expect(await shardsNotAt(db.urls[1]!, range(80, 159), [1, 2, 3, 4, 5])).toEqual([]);
    for (const url of db.urls) {
      expect(counts(await rowsPerShard(url, 'photos', "image_url = 'once'"))).toEqual([1]);
      expect(counts(await rowsPerShard(url, 'shares', 'true'))).toEqual([1]);
      expect(
        await count(
          url,
          `select count(*) as n from pg_attribute where attname = 'views' and not attisdropped and attrelid::regclass::text ~ '^insta[0-9]+\\.photos$'`,
        ),
      ).toBe(80);
    }
    expect((await runCli(['migrate', '--check', '-c', fleet.configFile])).code).toBe(0);
  });
});
