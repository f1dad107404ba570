import { readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import { init } from '../../src/commands/init.js';
import { WORKER_TRANSACTION_SQL } from '../../src/fleet/control.js';
import { type Fleet, makeFleet, runCli } from '../helpers/fleet.js';
import { type TestDatabases, useTestDatabases, withClient } from '../helpers/hosts.js';
import { range, shardsAt, shardsNotAt } from '../helpers/migrations.js';

const SHARDS = 120; // pg1: 0-59, pg2: 60-119
const PG1 = range(0, 59);
const PG2 = range(60, 119);

async function count(url: string, sql: string): Promise<number> {
  return withClient(url, async (client) => Number((await client.query<{ n: string }>(sql)).rows[0]!.n));
}

/**
 * For one test: its own databases and a fleet initialised with the example migrations (versions
 * 1-3), so the test reads alone and runs alone (`-t`), whatever ran before it.
 */
function useFleet(options: { shards: number; extra?: string; setUp?: (db: TestDatabases) => Promise<void> }): {
  db: TestDatabases;
  fleet: () => Fleet;
} {
  const db = useTestDatabases(2);
  let fleet: Fleet | undefined;
  beforeAll(async () => {
    await options.setUp?.(db);
    fleet = makeFleet({ urls: db.urls, shards: options.shards, ...(options.extra ? { extra: options.extra } : {}) });
    expect((await init(await fleet.config())).ok).toBe(true);
  });
  return {
    db,
    fleet: () => {
      if (!fleet) throw new Error('useFleet(): the fleet exists once beforeAll has run');
      return fleet;
    },
  };
}

describe('shardctl migrate over two hosts', () => {
  describe('check, --to, apply', () => {
    const { db, fleet } = useFleet({ shards: SHARDS });

    it('reports pending files with --check (exit 3, --json detail), applies them in version order with --to and without, then reports the fleet current (exit 0)', async () => {
      fleet().writeMigration(
        '0004_photo_views.sql',
        'ALTER TABLE photos ADD COLUMN views bigint NOT NULL DEFAULT 0;\n',
      );
      // Needs 0004's column: fails unless the files run in version order.
      fleet().writeMigration('0005_photo_views_index.sql', 'CREATE INDEX photos_views_idx ON photos (views);\n');
      fleet().writeMigration('0006_comment_edits.sql', 'ALTER TABLE comments ADD COLUMN edited_at timestamptz;\n');

      const check = await runCli(['migrate', '--check', '--json', '-c', fleet().configFile]);
      expect(check.code).toBe(3);
      const pendingOn = (shards: string) => [
        { name: '0004_photo_views', version: 4, shards, count: 60 },
        { name: '0005_photo_views_index', version: 5, shards, count: 60 },
        { name: '0006_comment_edits', version: 6, shards, count: 60 },
      ];
      expect(JSON.parse(check.stdout)).toEqual({
        current: false,
        targetVersion: 6,
        pending: 360,
        hosts: [
          { host: 'pg1', shards: 60, migrations: 180, pending: pendingOn('0-59'), missingShards: 0, error: null },
          { host: 'pg2', shards: 60, migrations: 180, pending: pendingOn('60-119'), missingShards: 0, error: null },
        ],
        drift: [],
        unreadHosts: [],
        rollout: [
          { name: '0004_photo_views', version: 4, applied: 0, shards: 120 },
          { name: '0005_photo_views_index', version: 5, applied: 0, shards: 120 },
          { name: '0006_comment_edits', version: 6, applied: 0, shards: 120 },
        ],
        exitCode: 3,
      });
      expect(check.stderr).toContain(
        'pg1: 60 shards behind (180 migrations pending: 0004_photo_views on 0-59; 0005_photo_views_index on 0-59; 0006_comment_edits on 0-59)',
      );
      expect(check.stderr.trimEnd().split('\n').at(-1)).toBe('migrate --check: 360 migrations pending');
      expect(await shardsAt(db.urls[0]!, 4)).toBe(0); // --check wrote nothing

      const upTo5 = await runCli(['migrate', '--to', '5', '-c', fleet().configFile]);
      expect(upTo5.stderr).toContain('migrate: 240 migrations applied, 0 shards already current, 0 failed; 2 hosts, ');
      expect(upTo5.code).toBe(0);
      expect(await shardsNotAt(db.urls[0]!, PG1, [1, 2, 3, 4, 5])).toEqual([]);
      expect(await shardsNotAt(db.urls[1]!, PG2, [1, 2, 3, 4, 5])).toEqual([]);
      expect((await runCli(['migrate', '--check', '--to', '5', '-c', fleet().configFile])).code).toBe(0);
      const behind = await runCli(['migrate', '--check', '-c', fleet().configFile]);
      expect(behind.code).toBe(3);
      expect(behind.stderr).toContain('migrate --check: 120 migrations pending');

      const run = await runCli(['migrate', '-c', fleet().configFile]);
      expect(run.stderr).toContain('pg1: 60/60 shards\n');
      expect(run.stderr).toContain('pg2: 60/60 shards\n');
      expect(run.stderr).toMatch(/^pg1: 60 migrations applied, 0 already current \(\d+\.\d s\)$/m);
      expect(run.stderr).toMatch(
        /^migrate: 120 migrations applied, 0 shards already current, 0 failed; 2 hosts, \d+\.\d s$/m,
      );
      expect(run.code).toBe(0);
      expect(await shardsNotAt(db.urls[0]!, PG1, [1, 2, 3, 4, 5, 6])).toEqual([]);
      expect(await shardsNotAt(db.urls[1]!, PG2, [1, 2, 3, 4, 5, 6])).toEqual([]);
      for (const url of db.urls) {
        expect(
          await count(
            url,
            `select count(*) as n from pg_indexes where schemaname ~ '^insta[0-9]+$' and indexname = 'photos_views_idx'`,
          ),
        ).toBe(60);
      }

      const current = await runCli(['migrate', '--check', '--json', '-c', fleet().configFile]);
      expect(current.code).toBe(0);
      expect(JSON.parse(current.stdout)).toMatchObject({
        current: true,
        targetVersion: 6,
        pending: 0,
        drift: [],
        exitCode: 0,
      });
      expect(current.stderr.trimEnd().split('\n').at(-1)).toBe('migrate --check: current (version 6 on every shard)');

      const again = await runCli(['migrate', '--json', '-c', fleet().configFile]);
      expect(again.stderr).toContain('migrate: 0 migrations applied, 120 shards already current, 0 failed; 2 hosts, ');
      expect(again.code).toBe(0);
      expect(JSON.parse(again.stdout)).toMatchObject({
        command: 'migrate',
        ok: true,
        targetVersion: 6,
        summary: { shardsCreated: 0, migrationsApplied: 0, upToDate: 120, failed: 0, behind: 0 },
        hosts: [
          { host: 'pg1', migrationsApplied: 0, upToDate: 60, failures: [], hostError: null, behind: 0 },
          { host: 'pg2', migrationsApplied: 0, upToDate: 60, failures: [], hostError: null, behind: 0 },
        ],
      });
    });
  });

  describe('dry run', () => {
    const { db, fleet } = useFleet({ shards: SHARDS });

    it('migrate --dry-run prints the SQL each shard would run, in one transaction with its record, and writes nothing', async () => {
      fleet().writeMigration(
        '0004_photo_tags.sql',
        'CREATE TABLE photo_tags (photo_id bigint NOT NULL, tag text NOT NULL);\n',
      );
      const dry = await runCli(['migrate', '--dry-run', '-c', fleet().configFile]);
      expect(dry.code).toBe(0);
      expect(dry.stdout).toContain(
        `-- shard 0: migration 0004_photo_tags\nBEGIN;\n${WORKER_TRANSACTION_SQL}\nSET LOCAL search_path TO "insta0", pg_temp;\nSET LOCAL lock_timeout = '5s';`,
      );
      expect(dry.stdout).toMatch(
        /CREATE TABLE photo_tags[^\n]*\n;\nDO \$shardctl\$ BEGIN\n[^$]*\nEND \$shardctl\$;\nINSERT INTO "shardctl".migrations \(shard, version, name, checksum\) VALUES \(0, 4, '0004_photo_tags', '[0-9a-f]{64}'\);\nCOMMIT;\nRESET ALL; UNLISTEN \*; DISCARD TEMP;/,
      );
      expect(dry.stderr).toContain('migrate --dry-run: 120 shards would change on 2 hosts; nothing was written');
      expect(await shardsAt(db.urls[0]!, 4)).toBe(0);
      expect(await shardsAt(db.urls[1]!, 4)).toBe(0);
    });
  });

  describe('a failing shard', () => {
    const { db, fleet } = useFleet({ shards: SHARDS });

    it('a migration that fails on one shard rolls back there alone, naming host, shard and migration; the others go on and a rerun finishes it', async () => {
      await withClient(db.urls[0]!, (c) =>
        c.query(`insert into insta7.photos (user_id, image_url, caption) values (7, 'x', null)`),
      );
      await withClient(db.urls[1]!, (c) =>
        c.query(`insert into insta100.photos (user_id, image_url, caption) values (100, 'x', null)`),
      );
      fleet().writeMigration(
        '0004_photo_tags.sql',
        'CREATE TABLE photo_tags (photo_id bigint NOT NULL, tag text NOT NULL);\n',
      );
      // Batched after 0004 in one round trip: the failure must be pinned on 0005, not on its batch.
      fleet().writeMigration(
        '0005_caption_required.sql',
        'CREATE TABLE caption_audit (photo_id bigint);\nALTER TABLE photos ADD CONSTRAINT photos_caption_present CHECK (caption IS NOT NULL);\n',
      );

      const run = await runCli(['migrate', '-c', fleet().configFile]);
      expect(run.code).toBe(1);
      expect(run.stderr).toContain(
        'host pg1, shard 7: migration 0005_caption_required: check constraint "photos_caption_present" of relation "photos" is violated by some row',
      );
      expect(run.stderr).toContain('host pg2, shard 100: migration 0005_caption_required: check constraint');
      expect(run.stderr).toMatch(
        /^migrate: 238 migrations applied, 0 shards already current, 2 failed; 2 hosts, \d+\.\d s — fix the cause and run it again/m,
      );
      // Shard 7 has 0004 but nothing of 0005: not its record, not its first statement.
      expect(await shardsNotAt(db.urls[0]!, PG1, [1, 2, 3, 4, 5])).toEqual(['shard 7: [1,2,3,4]']);
      expect(await shardsNotAt(db.urls[1]!, PG2, [1, 2, 3, 4, 5])).toEqual(['shard 100: [1,2,3,4]']);
      await withClient(db.urls[0]!, async (c) => {
        expect((await c.query(`select to_regclass('insta7.caption_audit') as t`)).rows[0]!.t).toBeNull();
        expect((await c.query(`select to_regclass('insta8.caption_audit') as t`)).rows[0]!.t).not.toBeNull();
      });

      const check = await runCli(['migrate', '--check', '-c', fleet().configFile]);
      expect(check.code).toBe(3);
      expect(check.stderr).toContain('pg1: 1 shard behind (1 migration pending: 0005_caption_required on 7)');

      await withClient(db.urls[0]!, (c) => c.query(`update insta7.photos set caption = '' where caption is null`));
      await withClient(db.urls[1]!, (c) => c.query(`update insta100.photos set caption = '' where caption is null`));
      const rerun = await runCli(['migrate', '-c', fleet().configFile]);
      expect(rerun.stderr).toContain('migrate: 2 migrations applied, 118 shards already current, 0 failed; 2 hosts, ');
      expect(rerun.code).toBe(0);
    });
  });

  describe('a syntax error', () => {
    const { db, fleet } = useFleet({ shards: SHARDS });

    it('names the broken file when a syntax error stops the whole batch, and still applies the files before it', async () => {
      fleet().writeMigration('0004_albums.sql', 'CREATE TABLE albums (id bigint PRIMARY KEY, name text);\n');
      fleet().writeMigration('0005_broken.sql', 'CREATE TABLE broken (id bigint,, name text);\n');
      const run = await runCli(['migrate', '-c', fleet().configFile]);
      expect(run.code).toBe(1);
      expect(run.stderr).toContain('host pg1, shard 0: migration 0005_broken: syntax error at or near ","');
      expect(run.stderr).toContain('host pg2, shard 60: migration 0005_broken: syntax error at or near ","');
      // The first 20 of 60 are listed, by shard (workers finish in no fixed order).
      const listed = [...run.stderr.matchAll(/host pg1, shard (\d+): migration 0005_broken/g)].map((m) => Number(m[1]));
      expect(listed).toEqual(Array.from({ length: 20 }, (_, i) => i));
      expect(run.stderr).not.toContain('migration 0004_albums:');
      expect(await shardsAt(db.urls[0]!, 4)).toBe(60);
      expect(await shardsAt(db.urls[1]!, 4)).toBe(60);
      expect(await shardsAt(db.urls[0]!, 5)).toBe(0);

      // Never applied anywhere, so removing it is not drift.
      rmSync(join(fleet().migrationsDir, '0005_broken.sql'));
      expect((await runCli(['migrate', '--check', '-c', fleet().configFile])).code).toBe(0);
    });
  });

  describe('an edited applied file', () => {
    const { db, fleet } = useFleet({ shards: SHARDS });

    it('refuses to run when an applied file was edited, naming the file and the shards on each host; nothing is applied (exit 3)', async () => {
      const likes = join(fleet().migrationsDir, '0002_likes.sql');
      const original = readFileSync(likes, 'utf8');
      fleet().writeMigration('0002_likes.sql', `${original}CREATE INDEX likes_user_idx ON likes (user_id);\n`);
      fleet().writeMigration('0004_photo_location.sql', 'ALTER TABLE photos ADD COLUMN location text;\n');

      const run = await runCli(['migrate', '-c', fleet().configFile]);
      expect(run.code).toBe(3);
      expect(run.stderr).toContain('migration drift: nothing was applied');
      expect(run.stderr).toContain(
        'host pg1: 0002_likes.sql changed after it was applied to shards 0-59 (checksum differs)',
      );
      expect(run.stderr).toContain(
        'host pg2: 0002_likes.sql changed after it was applied to shards 60-119 (checksum differs)',
      );
      expect(await shardsAt(db.urls[0]!, 4)).toBe(0);
      expect(await shardsAt(db.urls[1]!, 4)).toBe(0);

      const check = await runCli(['migrate', '--check', '--json', '-c', fleet().configFile]);
      expect(check.code).toBe(3);
      const report = JSON.parse(check.stdout) as { drift: string[]; pending: number; current: boolean };
      expect(report.current).toBe(false);
      expect(report.pending).toBe(120);
      expect(report.drift).toHaveLength(2);
      expect(report.drift[0]).toContain('0002_likes.sql changed after it was applied to shards 0-59');
      expect(check.stderr).toContain('migrate --check: drift found (2 problems), 120 migrations pending');

      fleet().writeMigration('0002_likes.sql', original);
      const restored = await runCli(['migrate', '--check', '--json', '-c', fleet().configFile]);
      expect(restored.code).toBe(3);
      expect(JSON.parse(restored.stdout)).toMatchObject({ drift: [], pending: 120 });
    });
  });

  describe('a deleted applied file', () => {
    const { db, fleet } = useFleet({ shards: SHARDS });

    it('refuses to run when the file of an applied version was deleted, naming it and the shards (exit 3)', async () => {
      fleet().writeMigration('0004_photo_location.sql', 'ALTER TABLE photos ADD COLUMN location text;\n');
      const comments = join(fleet().migrationsDir, '0003_comments.sql');
      const original = readFileSync(comments, 'utf8');
      rmSync(comments);
      const run = await runCli(['migrate', '-c', fleet().configFile]);
      expect(run.code).toBe(3);
      expect(run.stderr).toContain(
        'host pg1: 0003_comments.sql (version 3) is applied to shards 0-59 but no file in the migrations folder has that version; restore it',
      );
      expect(run.stderr).toContain('host pg2: 0003_comments.sql (version 3) is applied to shards 60-119');
      expect(await shardsAt(db.urls[0]!, 4)).toBe(0);
      expect((await runCli(['migrate', '--check', '-c', fleet().configFile])).code).toBe(3);
      fleet().writeMigration('0003_comments.sql', original);
    });
  });

  describe('a file numbered too low', () => {
    const { db, fleet } = useFleet({ shards: SHARDS });

    it('refuses a new file numbered below versions the shards already have, instead of running it out of order (exit 3)', async () => {
      fleet().writeMigration('0005_photo_location.sql', 'ALTER TABLE photos ADD COLUMN location text;\n');
      const run = await runCli(['migrate', '-c', fleet().configFile]);
      expect(run.code).toBe(0);
      expect(await shardsAt(db.urls[0]!, 5)).toBe(60);

      fleet().writeMigration('0004_late.sql', 'CREATE TABLE late (id bigint);\n');
      const late = await runCli(['migrate', '-c', fleet().configFile]);
      expect(late.code).toBe(3);
      expect(late.stderr).toContain(
        'host pg1: 0004_late.sql is not applied to shards 0-59, which already have version 5',
      );
      expect(await shardsAt(db.urls[0]!, 4)).toBe(0);
      rmSync(join(fleet().migrationsDir, '0004_late.sql'));
    });
  });
});

describe('shardctl migrate with -- shardctl:no-transaction files', () => {
  const TOTAL = 80; // pg1: 0-39, pg2: 40-79

  describe('statement by statement', () => {
    // Four connections per host: without the one-shard-at-a-time rule, they would overlap.
    const { db, fleet } = useFleet({
      shards: TOTAL,
      extra: 'concurrency: 4',
      setUp: async (db) => {
        for (const url of db.urls) {
          await withClient(url, (c) =>
            c.query('create table public.no_tx_trace (schema_name text, started timestamptz, finished timestamptz)'),
          );
        }
      },
    });

    it('runs them outside a transaction, statement by statement, one shard at a time per host, and records them', async () => {
      fleet().writeMigration(
        '0004_indexes.sql',
        [
          '-- shardctl:no-transaction',
          '-- Built without blocking writes; CREATE INDEX CONCURRENTLY refuses to run in a transaction.',
          'CREATE INDEX CONCURRENTLY IF NOT EXISTS photos_user_idx ON photos (user_id);',
          'CREATE INDEX CONCURRENTLY IF NOT EXISTS likes_photo_idx ON likes (photo_id);',
          '',
        ].join('\n'),
      );
      fleet().writeMigration(
        '0005_trace.sql',
        '-- shardctl:no-transaction\nINSERT INTO public.no_tx_trace SELECT current_schema(), statement_timestamp(), clock_timestamp() FROM pg_sleep(0.005);\n',
      );
      fleet().writeMigration('0006_after.sql', 'CREATE TABLE after_no_tx (id bigint);\n');

      const run = await runCli(['migrate', '-c', fleet().configFile]);
      expect(run.stderr).toContain('migrate: 240 migrations applied, 0 shards already current, 0 failed; 2 hosts, ');
      expect(run.code).toBe(0);
      expect(await shardsNotAt(db.urls[0]!, range(0, 39), [1, 2, 3, 4, 5, 6])).toEqual([]);
      expect(await shardsNotAt(db.urls[1]!, range(40, 79), [1, 2, 3, 4, 5, 6])).toEqual([]);
      for (const url of db.urls) {
        expect(
          await count(
            url,
            `select count(*) as n from pg_index i join pg_class c on c.oid = i.indexrelid
              where c.relname in ('photos_user_idx', 'likes_photo_idx') and i.indisvalid`,
          ),
        ).toBe(80);
        const trace = await withClient(
          url,
          async (c) =>
            (
              await c.query<{ schema_name: string; started: Date; finished: Date }>(
                'select * from public.no_tx_trace order by started',
              )
            ).rows,
        );
        expect(trace).toHaveLength(40);
        const overlaps = trace.slice(1).filter((row, i) => row.started < trace[i]!.finished);
        expect(overlaps.map((r) => r.schema_name)).toEqual([]);
      }
    });
  });

  describe('recorded only on success', () => {
    const { db, fleet } = useFleet({ shards: TOTAL, extra: 'concurrency: 4' });

    it('records one only when it succeeded: a failed CREATE UNIQUE INDEX CONCURRENTLY leaves no record, and the invalid index it leaves is refused on rerun', async () => {
      await withClient(db.urls[0]!, (c) =>
        c.query(`insert into insta3.photos (user_id, image_url) values (42, 'a'), (42, 'b')`),
      );
      fleet().writeMigration(
        '0004_unique_photo_user.sql',
        '-- shardctl:no-transaction\nCREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS photos_user_unique ON photos (user_id);\n',
      );
      const run = await runCli(['migrate', '-c', fleet().configFile]);
      expect(run.code).toBe(1);
      expect(run.stderr).toContain(
        'host pg1, shard 3: migration 0004_unique_photo_user: could not create unique index "photos_user_unique"',
      );
      expect(await shardsNotAt(db.urls[0]!, range(0, 39), [1, 2, 3, 4])).toEqual(['shard 3: [1,2,3]']);
      expect(await shardsAt(db.urls[1]!, 4)).toBe(40);

      // IF NOT EXISTS now skips the invalid index: the statement succeeds, the record must not be written.
      const rerun = await runCli(['migrate', '-c', fleet().configFile]);
      expect(rerun.code).toBe(1);
      expect(rerun.stderr).toContain(
        'host pg1, shard 3: migration 0004_unique_photo_user: invalid index photos_user_unique in schema insta3',
      );
      expect(await shardsNotAt(db.urls[0]!, [3], [1, 2, 3, 4])).toEqual(['shard 3: [1,2,3]']);

      await withClient(db.urls[0]!, async (c) => {
        await c.query(`delete from insta3.photos where image_url = 'b'`);
        await c.query('drop index insta3.photos_user_unique');
      });
      const fixed = await runCli(['migrate', '-c', fleet().configFile]);
      expect(fixed.stderr).toContain('migrate: 1 migration applied, 79 shards already current, 0 failed; 2 hosts, ');
      expect(fixed.code).toBe(0);
      expect(
        await count(
          db.urls[0]!,
          `select count(*) as n from pg_index i join pg_class c on c.oid = i.indexrelid where c.relname = 'photos_user_unique' and i.indisvalid`,
        ),
      ).toBe(40);
    });
  });
});
