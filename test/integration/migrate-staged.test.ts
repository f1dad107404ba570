import pg from 'pg';
import { describe, expect, it } from 'vitest';
import { init } from '../../src/commands/init.js';
import { makeFleet, runCli } from '../helpers/fleet.js';
import { useTestDatabases, withClient } from '../helpers/hosts.js';
import { range, shardsAt, shardsNotAt, waitFor } from '../helpers/migrations.js';

const VIEWS = 'ALTER TABLE photos ADD COLUMN views bigint NOT NULL DEFAULT 0;\n';

/** The shards of a host with version 4 recorded. */
async function at4(url: string): Promise<number[]> {
  return withClient(url, async (client) =>
    (
      await client.query<{ shard: number }>('select shard from shardctl.migrations where version = 4 order by shard')
    ).rows.map((r) => r.shard),
  );
}

describe('a staged rollout: canary, one host, then every shard', () => {
  const db = useTestDatabases(2);

  it('moves the levels stage by stage, status and migrate --check describe each stage (exit 3) with no drift, and current at the end', async () => {
    const fleet = makeFleet({ urls: db.urls, shards: 80 });
    expect((await init(await fleet.config())).ok).toBe(true);
    fleet.writeMigration('0004_photo_views.sql', VIEWS);

    const canary = await runCli(['migrate', '--canary', '3', '-c', fleet.configFile]);
    expect(canary.code).toBe(0);
    expect(canary.stderr).toContain('migrate: 3 migrations applied, 0 shards already current, 0 failed; 2 hosts');
    expect(canary.stderr).toContain('canary: 3 shards (0-1,40 on pg1, pg2); 77 other shards still have work pending');
    expect(canary.stderr).toContain('shardctl migrate --hosts NAME');
    expect(await at4(db.urls[0]!)).toEqual([0, 1]);
    expect(await at4(db.urls[1]!)).toEqual([40]);
    expect(await shardsNotAt(db.urls[0]!, range(2, 39), [1, 2, 3])).toEqual([]);

    const status = await runCli(['status', '-c', fleet.configFile]);
    expect(status.code).toBe(3);
    expect(status.stdout).toContain('rollout: 0004_photo_views: 3 of 80 shards');
    expect(status.stdout).toContain('migration level 3 (2-39), 4 (0-1) of 4');
    expect(status.stdout).not.toContain('drift');
    const check = await runCli(['migrate', '--check', '-c', fleet.configFile]);
    expect(check.code).toBe(3);
    expect(check.stderr).toContain('rollout: 0004_photo_views: 3 of 80 shards');
    expect(check.stderr).toContain('migrate --check: 77 migrations pending');
    expect(check.stderr).not.toContain('drift');

    const host = await runCli(['migrate', '--hosts', 'pg2', '--json', '-c', fleet.configFile]);
    expect(host.code).toBe(0);
    expect(host.stderr).toContain('stage: 39 shards (41-79 on pg2); 38 other shards still have work pending');
    expect(JSON.parse(host.stdout).stage).toEqual({ shards: range(41, 79), canary: false, pendingElsewhere: 38 });
    expect(await at4(db.urls[0]!)).toEqual([0, 1]);
    expect(await shardsAt(db.urls[1]!, 4)).toBe(40);
    const middle = await runCli(['status', '--json', '-c', fleet.configFile]);
    expect(middle.code).toBe(3);
    const result = JSON.parse(middle.stdout) as { rollout: unknown; hosts: { drift: string[] }[] };
    expect(result.rollout).toEqual([{ name: '0004_photo_views', version: 4, applied: 42, shards: 80 }]);
    expect(result.hosts.flatMap((h) => h.drift)).toEqual([]);

    const all = await runCli(['migrate', '-c', fleet.configFile]);
    expect(all.code).toBe(0);
    expect(all.stderr).toContain('migrate: 38 migrations applied, 42 shards already current, 0 failed; 2 hosts');
    expect(all.stderr).not.toContain('stage:');
    expect(await shardsAt(db.urls[0]!, 4)).toBe(40);
    const done = await runCli(['status', '-c', fleet.configFile]);
    expect(done.code).toBe(0);
    expect(done.stdout).not.toContain('rollout:');
    expect((await runCli(['migrate', '--check', '-c', fleet.configFile])).code).toBe(0);
  });

  it.each([
    [['--hosts', 'pg9'], 'option --hosts "pg9": no such host in the config (its hosts: pg1, pg2)'],
    [['--hosts', 'pg1,,pg2'], 'option --hosts "pg1,,pg2": empty item (two commas in a row, or a comma at either end)'],
    [['--hosts', 'pg1,pg1'], 'option --hosts "pg1,pg1": names host pg1 twice'],
    [['--shards', '5-90'], 'option --shards "5-90"'],
    [['--canary', '0'], 'option --canary "0": expected a whole number from 1 to 999999'],
    [['--max-failures', 'x'], 'option --max-failures "x": expected a whole number from 1 to 999999'],
    [['--lock-retries', '-1'], 'option --lock-retries "-1": expected a whole number from 0 to 999999'],
    [['--check', '--canary', '2'], 'option --check looks at every shard and writes nothing; it takes no --canary'],
  ])('refuses migrate %j (exit 2), naming the option and the value', async (args, message) => {
    const fleet = makeFleet({ urls: db.urls, shards: 8 });
    const run = await runCli(['migrate', ...args, '-c', fleet.configFile]);
    expect(run.stderr).toContain(message);
    expect(run.code).toBe(2);
  });
});

describe('migrate --max-failures', () => {
  const db = useTestDatabases(2);

  it('starts no new shard once that many have failed; the run says how many were not started (exit 1)', async () => {
    const fleet = makeFleet({ urls: db.urls, shards: 80, extra: 'concurrency: 1' });
    expect((await init(await fleet.config())).ok).toBe(true);
    // Fails on shard 0, the first of pg1's list; every shard takes a moment, so pg2 is mid-shard when it fails.
    fleet.writeMigration(
      '0004_fails_on_0.sql',
      `DO $$ BEGIN IF current_schema() = 'insta0' THEN RAISE EXCEPTION 'broken on %', current_schema(); END IF; END $$;\nSELECT pg_sleep(0.5);\n`,
    );
    const run = await runCli(['migrate', '--max-failures', '1', '--json', '-c', fleet.configFile]);
    expect(run.code).toBe(1);
    expect(run.stderr).toContain('host pg1, shard 0: migration 0004_fails_on_0: broken on insta0');
    const result = JSON.parse(run.stdout) as {
      stoppedEarly: boolean;
      summary: { failed: number; notStarted: number; migrationsApplied: number };
    };
    expect(result.stoppedEarly).toBe(true);
    expect(result.summary.failed).toBe(1);
    expect(await shardsAt(db.urls[0]!, 4)).toBe(0);
    // pg2 finishes the shard it was on, and starts no other.
    const applied = await shardsAt(db.urls[1]!, 4);
    expect(applied).toBeLessThanOrEqual(1);
    expect(result.summary.migrationsApplied).toBe(applied);
    expect(result.summary.notStarted).toBe(79 - applied);
    expect(run.stderr).toContain(`${79 - applied} shards not started (stopped after 1 failure, --max-failures)`);
  });
});

describe('migrate against a table another session holds locked', () => {
  const db = useTestDatabases(2);

  it('retries the busy shard with growing pauses and applies it once the lock is released, saying who held it', async () => {
    const fleet = makeFleet({ urls: db.urls, shards: 80, extra: 'lockTimeout: 500ms' });
    expect((await init(await fleet.config())).ok).toBe(true);
    fleet.writeMigration('0004_photo_views.sql', VIEWS);
    const app = new pg.Client({ connectionString: db.urls[1]!, application_name: 'lock-holder-test' });
    await app.connect();
    try {
      await app.query('begin');
      await app.query('lock table insta50.photos in access exclusive mode');
      const appPid = (await app.query<{ pid: number }>('select pg_backend_pid() as pid')).rows[0]!.pid;
      const running = runCli(['migrate', '--json', '-c', fleet.configFile]);
      // Released once the run has met the lock and had time to try again (lockTimeout 500ms, then a
      // pause): counted from the run's own wait, not from its start, which a loaded machine delays.
      await waitFor(
        'the run to wait for the lock on insta50.photos',
        async () =>
          (
            await app.query<{ n: number }>(
              `select count(*)::int as n from pg_locks where not granted and relation = 'insta50.photos'::regclass`,
            )
          ).rows[0]!.n > 0,
        60_000,
      );
      await new Promise((resolve) => setTimeout(resolve, 1_500));
      await app.query('rollback');
      const run = await running;
      expect(run.code).toBe(0);
      expect(run.stderr).toMatch(
        new RegExp(
          `host pg2, shard 50: migration 0004_photo_views met a busy table, tried again [1-3] times?: applied; ` +
            `held by pid ${appPid} \\(application lock-holder-test, user \\S+, from [^,]+, transaction open [\\d.]+ s, AccessExclusiveLock on photos\\)`,
        ),
      );
      expect(run.stderr).toContain(
        'migrate: 80 migrations applied, 0 shards already current, 0 failed, 1 shard waited for a lock; 2 hosts',
      );
      const result = JSON.parse(run.stdout) as {
        hosts: {
          host: string;
          lockWaits: {
            shard: number;
            retries: number;
            applied: boolean;
            holders: { pid: number; application: string }[];
          }[];
        }[];
      };
      expect(result.hosts[0]!.lockWaits).toEqual([]);
      const [wait] = result.hosts[1]!.lockWaits;
      expect(wait).toMatchObject({
        shard: 50,
        step: 'migration 0004_photo_views',
        applied: true,
        holders: [{ pid: appPid, application: 'lock-holder-test' }],
      });
      expect(wait!.retries).toBeGreaterThanOrEqual(1);
      expect(await shardsAt(db.urls[1]!, 4)).toBe(40);
    } finally {
      await app.end();
    }
  });
});

describe('a CREATE INDEX CONCURRENTLY that meets an old transaction (lock_timeout)', () => {
  const db = useTestDatabases(1);

  it('drops the invalid index its attempt left before trying again, and builds it once the transaction ends; status names one a stopped build left', async () => {
    const fleet = makeFleet({
      urls: db.urls,
      shards: 2,
      split: ['0-1'],
      schemaPrefix: 'ci',
      extra: 'lockTimeout: 500ms',
    });
    expect((await init(await fleet.config())).ok).toBe(true);
    fleet.writeMigration(
      '0004_photos_user.sql',
      '-- shardctl:no-transaction\nCREATE INDEX CONCURRENTLY IF NOT EXISTS photos_user_idx ON photos (user_id);\n',
    );
    // An old snapshot in the same database: the index build waits for it (and gives up at lock_timeout).
    const old = new pg.Client({ connectionString: db.urls[0]! });
    await old.connect();
    try {
      await old.query('begin isolation level repeatable read');
      await old.query('select 1');
      const running = runCli(['migrate', '--lock-retries', '5', '-c', fleet.configFile]);
      await waitFor(
        'the index build to wait for the old transaction',
        async () =>
          withClient(
            db.urls[0]!,
            async (c) =>
              (
                await c.query<{ n: number }>(
                  `select count(*)::int as n from pg_stat_activity where wait_event_type = 'Lock' and wait_event = 'virtualxid'`,
                )
              ).rows[0]!.n > 0,
          ),
        60_000,
      );
      // Past lock_timeout (500 ms): at least one build gave up, leaving its index invalid.
      await new Promise((resolve) => setTimeout(resolve, 1_500));
      await old.query('rollback');
      const run = await running;
      expect(run.code, run.stderr).toBe(0);
      expect(run.stderr).toMatch(/met a busy table, tried again \d+ times?: applied/);
    } finally {
      await old.end();
    }
    await withClient(db.urls[0]!, async (c) => {
      const built = await c.query<{ s: string; valid: boolean }>(
        `select n.nspname as s, i.indisvalid as valid from pg_index i join pg_class c on c.oid = i.indexrelid join pg_namespace n on n.oid = c.relnamespace where c.relname = 'photos_user_idx' order by 1`,
      );
      expect(built.rows).toEqual([
        { s: 'ci0', valid: true },
        { s: 'ci1', valid: true },
      ]);
      // A build that stopped (here: a unique index over duplicates) leaves an invalid index: status names it.
      await c.query(`insert into ci0.photos (user_id, image_url) values (7, 'a'), (7, 'b')`);
      await expect(c.query('create unique index concurrently dup_idx on ci0.photos (user_id)')).rejects.toThrow();
    });
    const status = await runCli(['status', '-c', fleet.configFile]);
    expect(status.code, status.stdout).toBe(3);
    expect(status.stdout).toContain(
      'invalid index ci0.dup_idx: a CREATE INDEX CONCURRENTLY that was stopped left it, and IF NOT EXISTS would skip it (migrate will not record the migration): DROP INDEX ci0.dup_idx; then run migrate again',
    );
    await withClient(db.urls[0]!, (c) => c.query('drop index ci0.dup_idx'));
    expect((await runCli(['status', '-c', fleet.configFile])).code).toBe(0);
  });
});

describe('migrate --lock-retries 0 against a table another session holds locked', () => {
  const db = useTestDatabases(2);

  it('with --lock-retries 0 fails the shard at once, naming the host, the shard and the lock holder (exit 1)', async () => {
    const fleet = makeFleet({ urls: db.urls, shards: 80, extra: 'lockTimeout: 300ms' });
    expect((await init(await fleet.config())).ok).toBe(true);
    fleet.writeMigration(
      '0005_photo_flags.sql',
      '-- shardctl:lock-timeout 200ms\nALTER TABLE photos ADD COLUMN flagged boolean NOT NULL DEFAULT false;\n',
    );
    const app = new pg.Client({ connectionString: db.urls[0]!, application_name: 'lock-holder-test' });
    await app.connect();
    try {
      await app.query('begin');
      await app.query('lock table insta7.photos in access share mode');
      const appPid = (await app.query<{ pid: number }>('select pg_backend_pid() as pid')).rows[0]!.pid;
      const started = Date.now();
      const run = await runCli(['migrate', '--lock-retries', '0', '-c', fleet.configFile]);
      expect(Date.now() - started).toBeLessThan(5_000);
      expect(run.code).toBe(1);
      expect(run.stderr).toMatch(
        new RegExp(
          `host pg1, shard 7: migration 0005_photo_flags: could not lock a table within lock_timeout 200ms \\(the file's marker\\) ` +
            `\\(held by pid ${appPid} \\(application lock-holder-test, [^)]*AccessShareLock on photos\\)\\): this shard was skipped, the others went on; ` +
            `run migrate again when the lock is released — canceling statement due to lock timeout \\(SQLSTATE 55P03\\); not tried again \\(lock retries 0\\)`,
        ),
      );
      expect(await shardsNotAt(db.urls[0]!, [7], [1, 2, 3])).toEqual([]);
      expect(await shardsAt(db.urls[0]!, 5)).toBe(39);
    } finally {
      await app.query('rollback');
      await app.end();
    }
  });
});

describe('a file with its own statement_timeout', () => {
  const db = useTestDatabases(2);

  it('bounds its own statements only: a no-transaction file leaves the session without it, a slow transactional file fails on it', async () => {
    const fleet = makeFleet({ urls: db.urls, shards: 4 });
    expect((await init(await fleet.config())).ok).toBe(true);
    fleet.writeMigration(
      '0004_quick.sql',
      '-- shardctl:no-transaction\n-- shardctl:statement-timeout 1500ms\nSELECT pg_sleep(0.01);\n',
    );
    // Without the marker: would fail if the previous file's statement_timeout had stayed on the
    // connection. (The quick file's bound leaves room for a loaded machine: its statements, and the
    // run's own around them, must each end within it.)
    fleet.writeMigration('0005_slow.sql', 'SELECT pg_sleep(1.7);\n');
    const first = await runCli(['migrate', '-c', fleet.configFile]);
    expect(first.stderr).toContain('migrate: 8 migrations applied, 0 shards already current, 0 failed; 2 hosts');
    expect(first.code).toBe(0);

    fleet.writeMigration('0006_too_slow.sql', '-- shardctl:statement-timeout 200ms\nSELECT pg_sleep(0.5);\n');
    const second = await runCli(['migrate', '-c', fleet.configFile]);
    expect(second.code).toBe(1);
    expect(second.stderr).toContain(
      'host pg1, shard 0: migration 0006_too_slow: canceling statement due to statement timeout (SQLSTATE 57014)',
    );
    expect(second.stderr).toContain('migrate: 0 migrations applied, 0 shards already current, 4 failed; 2 hosts');
    expect(await shardsAt(db.urls[0]!, 6)).toBe(0);
  });
});

describe('a canary run again', () => {
  const own = useTestDatabases(2);

  it('--canary N run again (after a stopped run, or to widen it) takes only what N still lacks: the shards that have the file count', async () => {
    const fleet = makeFleet({ urls: own.urls, shards: 8, schemaPrefix: 'cy' });
    expect((await init(await fleet.config())).ok).toBe(true);
    fleet.writeMigration('0004_photo_views.sql', VIEWS);
    const first = await runCli(['migrate', '--canary', '2', '-c', fleet.configFile]);
    expect(first.code, first.stderr).toBe(0);
    expect(first.stderr).toContain('canary: 2 shards (0,4 on pg1, pg2); 6 other shards');
    const wider = await runCli(['migrate', '--canary', '3', '--json', '-c', fleet.configFile]);
    expect(wider.code, wider.stderr).toBe(0);
    expect(wider.stderr).toContain(
      'canary: 1 shard (1 on pg1), and 2 shards (0,4) that had it from an earlier run; 5 other shards',
    );
    expect(JSON.parse(wider.stdout).stage).toEqual({ shards: [1], canary: true, pendingElsewhere: 5, reached: [0, 4] });
    const again = await runCli(['migrate', '--canary', '3', '-c', fleet.configFile]);
    expect(again.code, again.stderr).toBe(0);
    expect(again.stderr).toContain(
      'canary: 0 shards, and 3 shards (0-1,4) that had it from an earlier run; 5 other shards',
    );
    const levels = await runCli(['status', '-c', fleet.configFile]);
    expect(levels.stdout).toContain('rollout: 0004_photo_views: 3 of 8 shards');
  });
});
