import { rmSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, beforeAll, describe, expect, it } from 'vitest';
import { init } from '../../src/commands/init.js';
import { makeFleet, runCli, type Fleet } from '../helpers/fleet.js';
import { useTestDatabases, withClient } from '../helpers/hosts.js';

/**
 * A migration file can never commit part of itself, record itself without having run, or write
 * outside its shard's schema: files that end the transaction or change the session are refused by
 * every command before anything runs, naming the file and the line; what the file check cannot
 * read (a function or DO body) is caught before the record and rolled back.
 */

const db = useTestDatabases(2);
let fleet: Fleet;

beforeAll(async () => {
  fleet = makeFleet({
    urls: db.urls,
    shards: 4,
    split: ['0-1', '2-3'],
    schemaPrefix: 'ms',
    migrations: { '0001_base.sql': 'CREATE TABLE base (x int);' },
  });
  expect((await init(await fleet.config())).ok).toBe(true);
});

afterEach(() => {
  rmSync(join(fleet.migrationsDir, '0002_bad.sql'), { force: true });
});

/** Tables named like the test's, in any schema of either host, and every record of version 2. */
async function leftovers(): Promise<{ tables: string[]; records: number }> {
  const tables: string[] = [];
  let records = 0;
  for (const url of db.urls) {
    await withClient(url, async (c) => {
      const t = await c.query<{ t: string }>(
        `select schemaname || '.' || tablename as t from pg_tables where tablename in ('a2', 'b2', 'e2', 'p2', 'f2') order by 1`,
      );
      tables.push(...t.rows.map((r) => r.t));
      records += (await c.query<{ n: number }>('select count(*)::int as n from shardctl.migrations where version = 2'))
        .rows[0]!.n;
    });
  }
  return { tables, records };
}

describe('migration files that end their transaction or change the session', () => {
  it.each([
    ['CREATE TABLE a2(x int);\nCOMMIT;\nCREATE TABLE b2(x int);', 2, '"COMMIT": COMMIT ends or starts a transaction'],
    ['CREATE TABLE e2(x int); ROLLBACK; BEGIN;', 1, '"ROLLBACK": ROLLBACK ends the transaction'],
    [
      '-- moves the rest\nSET search_path TO public;\nCREATE TABLE a2(x int);',
      2,
      '"SET search_path TO public": SET outlives the transaction',
    ],
    ['CREATE TABLE a2(x int);\nRESET ALL;\nCREATE TABLE b2(x int);', 2, '"RESET ALL": RESET changes settings'],
    ['SET ROLE nobody_here;\nCREATE TABLE a2(x int);', 1, '"SET ROLE nobody_here": SET outlives the transaction'],
    [
      'SET LOCAL search_path TO public, pg_catalog;\nCREATE TABLE a2(x int);',
      1,
      'SET LOCAL search_path changes where or as whom',
    ],
    ["SELECT set_config('search_path', 'public', true);\nCREATE TABLE a2(x int);", 1, 'set_config() changes a setting'],
    [
      '-- shardctl:no-transaction\nSET search_path TO public;\nCREATE TABLE a2(x int);',
      2,
      'SET outlives the transaction',
    ],
    ['-- shardctl:no-transaction\nBEGIN;\nCREATE TABLE a2(x int);\nCOMMIT;', 2, 'BEGIN ends or starts a transaction'],
  ])('refuses %j before anything runs, naming the file and line (every command)', async (sql, line, reason) => {
    fleet.writeMigration('0002_bad.sql', sql);
    const where = `${join(fleet.migrationsDir, '0002_bad.sql')}:${line}: `;
    for (const args of [['migrate'], ['migrate', '--check'], ['migrate', '--dry-run'], ['status'], ['init']]) {
      const run = await runCli([...args, '-c', fleet.configFile]);
      expect(run.code, args.join(' ')).toBe(2);
      expect(run.stderr).toContain(where);
      expect(run.stderr).toContain(reason);
    }
    expect(await leftovers()).toEqual({ tables: [], records: 0 });
  });

  it('reports every offending statement of a file at once', async () => {
    fleet.writeMigration('0002_bad.sql', 'CREATE TABLE a2(x int);\nCOMMIT;\nCREATE TABLE b2(x int);\nROLLBACK;\n');
    const run = await runCli(['migrate', '-c', fleet.configFile]);
    expect(run.code).toBe(2);
    expect(run.stderr).toContain('0002_bad.sql:2: "COMMIT"');
    expect(run.stderr).toContain('0002_bad.sql:4: "ROLLBACK"');
  });

  it('is not tripped by COMMIT, ROLLBACK or semicolons in strings, comments, identifiers and bodies', async () => {
    fleet.writeMigration(
      '0002_bad.sql',
      [
        "SET LOCAL lock_timeout = '2s';",
        '/* COMMIT; SET search_path TO public; */',
        'CREATE TABLE a2 ("commit; rollback" text DEFAULT \'COMMIT; RESET ALL;\'); -- ROLLBACK;',
        'CREATE PROCEDURE p2() LANGUAGE plpgsql AS $body$ BEGIN COMMIT; END $body$;',
        'CREATE FUNCTION f2() RETURNS text LANGUAGE sql AS $$ SELECT $q$; COMMIT;$q$ $$;',
        "SAVEPOINT s; INSERT INTO a2 VALUES (E'it\\'s; BEGIN'); RELEASE SAVEPOINT s;",
      ].join('\n'),
    );
    const run = await runCli(['migrate', '-c', fleet.configFile]);
    expect(run.stderr).not.toContain('error');
    expect(run.code).toBe(0);
    const tables: string[] = [];
    for (const url of db.urls) {
      await withClient(url, async (c) => {
        tables.push(
          ...(
            await c.query<{ t: string }>(
              `select schemaname || '.' || tablename as t from pg_tables where tablename = 'a2' order by 1`,
            )
          ).rows.map((r) => r.t),
        );
      });
    }
    expect(tables).toEqual(['ms0.a2', 'ms1.a2', 'ms2.a2', 'ms3.a2']);
    expect((await leftovers()).records).toBe(4);
    // Undone for the other tests: they expect version 2 unapplied.
    for (const [i, url] of db.urls.entries()) {
      await withClient(url, async (c) => {
        for (const shard of [i * 2, i * 2 + 1])
          await c.query(`drop table ms${shard}.a2; drop procedure ms${shard}.p2; drop function ms${shard}.f2`);
        await c.query('delete from shardctl.migrations where version = 2');
      });
    }
  });

  it('rolls back, records nothing and names the file when a body moves search_path (what the file check cannot read)', async () => {
    fleet.writeMigration(
      '0002_bad.sql',
      // A function's body is not read by the file check (a DO block's is).
      "CREATE TABLE a2(x int);\nCREATE FUNCTION mp() RETURNS void LANGUAGE plpgsql AS $$ BEGIN PERFORM set_config('search_path', 'public', true); END $$;\nSELECT mp();\nCREATE TABLE b2(x int);",
    );
    const run = await runCli(['migrate', '-c', fleet.configFile]);
    expect(run.code).toBe(1);
    expect(run.stderr).toContain('0002_bad');
    expect(run.stderr).toContain('left search_path at public, not schema ms');
    expect(await leftovers()).toEqual({ tables: [], records: 0 });
  });

  it('keeps a no-transaction file in its schema when a body moves search_path, and does not record it', async () => {
    fleet.writeMigration(
      '0002_bad.sql',
      "-- shardctl:no-transaction\nCREATE OR REPLACE FUNCTION mp() RETURNS void LANGUAGE plpgsql AS $$ BEGIN PERFORM set_config('search_path', 'public', false); END $$;\nSELECT mp();\nCREATE TABLE IF NOT EXISTS a2(x int);\nSELECT mp();",
    );
    const run = await runCli(['migrate', '-c', fleet.configFile]);
    expect(run.code).toBe(1);
    expect(run.stderr).toContain('left search_path at public, not schema ms');
    // Each statement ran in the shard's schema; the last one moved search_path, so nothing is recorded.
    const found = await leftovers();
    expect(found).toEqual({ tables: ['ms0.a2', 'ms1.a2', 'ms2.a2', 'ms3.a2'], records: 0 });
    for (const [i, url] of db.urls.entries()) {
      await withClient(url, async (c) => {
        for (const shard of [i * 2, i * 2 + 1]) await c.query(`drop table ms${shard}.a2; drop function ms${shard}.mp`);
      });
    }
  });

  it('rolls back a migration that calls a procedure which commits (PostgreSQL refuses it inside the transaction)', async () => {
    fleet.writeMigration(
      '0002_bad.sql',
      'CREATE TABLE a2(x int);\nCREATE PROCEDURE p2() LANGUAGE plpgsql AS $$ BEGIN COMMIT; END $$;\nCALL p2();',
    );
    const run = await runCli(['migrate', '-c', fleet.configFile]);
    expect(run.code).toBe(1);
    expect(run.stderr).toContain('invalid transaction termination');
    expect(await leftovers()).toEqual({ tables: [], records: 0 });
  });
});

describe('what a body run by a migration leaves on the connection (out of the file check’s sight)', () => {
  const own = useTestDatabases(1);

  it('neither a temporary table named like a shard table nor a session setting reaches the next migrations: every shard gets the real change', async () => {
    const leaky = makeFleet({
      urls: own.urls,
      shards: 6,
      split: ['0-5'],
      schemaPrefix: 'ml',
      migrations: {
        '0001_base.sql': 'CREATE TABLE photos (id int); CREATE TABLE seen (role text, temps int);',
      },
    });
    expect((await init(await leaky.config())).ok).toBe(true);
    // A DO body may run EXECUTE (dynamic DDL), which the check cannot read: here it sets a session
    // setting that turns triggers off, listens, and makes a temporary table named like the shard's.
    leaky.writeMigration(
      '0002_stage.sql',
      "DO $$ BEGIN CREATE TEMP TABLE IF NOT EXISTS photos (x int); EXECUTE 'SET session_replication_role = replica'; EXECUTE 'LISTEN shardctl_test'; END $$;",
    );
    leaky.writeMigration(
      '0003_views.sql',
      "ALTER TABLE photos ADD COLUMN views int NOT NULL DEFAULT 0;\nINSERT INTO seen SELECT current_setting('session_replication_role'), (SELECT count(*) FROM pg_class WHERE relnamespace = pg_my_temp_schema());",
    );
    const run = await runCli(['migrate', '-c', leaky.configFile]);
    expect(run.code, run.stderr).toBe(0);
    await withClient(own.urls[0]!, async (c) => {
      const views = await c.query<{ s: string }>(
        `select table_schema as s from information_schema.columns where table_name = 'photos' and column_name = 'views' and table_schema like 'ml%' order by 1`,
      );
      expect(views.rows.map((r) => r.s)).toEqual(['ml0', 'ml1', 'ml2', 'ml3', 'ml4', 'ml5']);
      for (let shard = 0; shard < 6; shard++) {
        const seen = await c.query(`select role, temps::int from ml${shard}.seen`);
        expect(seen.rows, `shard ${shard}`).toEqual([{ role: 'origin', temps: 0 }]);
      }
    });
    const status = await runCli(['status', '-c', leaky.configFile]);
    expect(status.code, status.stdout).toBe(0);
  });
});
