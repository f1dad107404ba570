import { describe, expect, it } from 'vitest';
import { init } from '../../src/commands/init.js';
import { addSchema } from '../../src/commands/add-schema.js';
import { status } from '../../src/commands/status.js';
import { makeFleet, runCli } from '../helpers/fleet.js';
import { useTestDatabases, withClient } from '../helpers/hosts.js';

const SHARDS = 1100;
const db = useTestDatabases(2);

async function shardSchemas(url: string): Promise<number[]> {
  return withClient(url, async (client) => {
    const result = await client.query<{ n: number }>(
      `select substr(nspname, 6)::int as n from pg_namespace where nspname ~ '^insta[0-9]+$' order by 1`,
    );
    return result.rows.map((r) => r.n);
  });
}

/** A fingerprint of everything init could touch: objects, their identities, and the control rows. */
async function catalogFingerprint(url: string): Promise<string> {
  return withClient(url, async (client) => {
    const result = await client.query<{ f: string }>(`
      select md5(string_agg(x, ',' order by x)) as f from (
        select n.nspname || '.' || c.relname || ':' || c.oid || ':' || c.relkind::text as x
          from pg_class c join pg_namespace n on n.oid = c.relnamespace where n.nspname ~ '^(insta[0-9]+|shardctl)$'
        union all
        select n.nspname || '.' || p.proname || ':' || p.oid || ':' || md5(p.prosrc)
          from pg_proc p join pg_namespace n on n.oid = p.pronamespace where n.nspname ~ '^insta[0-9]+$'
        union all select 'm' || shard || ':' || version || ':' || applied_at from shardctl.migrations
        union all select 's' || shard || ':' || created_at from shardctl.shards
      ) s`);
    return result.rows[0]!.f;
  });
}

describe('shardctl init over two hosts', () => {
  it('creates 1100 shards with next_id and the example tables, each on its mapped host', async () => {
    const fleet = makeFleet({ urls: db.urls, shards: SHARDS });
    const result = await init(await fleet.config());
    expect(result.ok).toBe(true);
    expect(result.hosts.map((h) => h.shardsCreated)).toEqual([550, 550]);
    expect(result.hosts.map((h) => h.migrationsApplied)).toEqual([1650, 1650]);

    const first = await shardSchemas(db.urls[0]!);
    const second = await shardSchemas(db.urls[1]!);
    expect(first).toEqual(Array.from({ length: 550 }, (_, i) => i));
    expect(second).toEqual(Array.from({ length: 550 }, (_, i) => 550 + i));

    await withClient(db.urls[1]!, async (client) => {
      const tables = await client.query<{ count: string }>(
        `select count(*) from pg_tables where schemaname ~ '^insta[0-9]+$' and tablename in ('photos','likes','comments')`,
      );
      expect(Number(tables.rows[0]!.count)).toBe(550 * 3);
      const functions = await client.query<{ count: string }>(
        `select count(*) from pg_proc p join pg_namespace n on n.oid = p.pronamespace
          where n.nspname ~ '^insta[0-9]+$' and p.proname = 'next_id' and p.prolang = (select oid from pg_language where lanname = 'sql')`,
      );
      expect(Number(functions.rows[0]!.count)).toBe(550);
      // The id default works and carries the shard number.
      const row = await client.query<{ id: string }>(
        `insert into insta777.photos (user_id, image_url) values (1, 'x') returning id`,
      );
      expect((BigInt(row.rows[0]!.id) >> 10n) & 8191n).toBe(777n);
    });
  });

  it('changes nothing when run again on a complete cluster', async () => {
    const fleet = makeFleet({ urls: db.urls, shards: SHARDS });
    const before = await Promise.all(db.urls.map(catalogFingerprint));
    const result = await init(await fleet.config());
    expect(result.ok).toBe(true);
    expect(result.hosts.map((h) => [h.shardsCreated, h.migrationsApplied, h.upToDate])).toEqual([
      [0, 0, 550],
      [0, 0, 550],
    ]);
    expect(result.plan.hosts.every((h) => h.jobs.length === 0 && h.controlSql === null)).toBe(true);
    expect(await Promise.all(db.urls.map(catalogFingerprint))).toEqual(before);
  });

  it('status finds a dropped schema (exit 3) and add-schema brings it back at the current level', async () => {
    const fleet = makeFleet({ urls: db.urls, shards: SHARDS });
    const config = await fleet.config();
    await withClient(db.urls[1]!, (c) => c.query('drop schema insta600 cascade'));

    const cli = await runCli(['status', '-c', fleet.configFile]);
    expect(cli.code).toBe(3);
    expect(cli.stdout).toContain('pg2: NOT OK');
    expect(cli.stdout).toContain('missing: 600');
    const report = await status(config);
    expect(report.hosts[1]!.missing).toEqual([600]);
    expect(report.hosts[0]!.ok).toBe(true);

    const added = await addSchema(config, [600]);
    expect(added.ok).toBe(true);
    expect(added.hosts.find((h) => h.host === 'pg2')!.shardsCreated).toBe(1);
    expect((await status(config)).ok).toBe(true);
    expect((await runCli(['status', '-c', fleet.configFile])).code).toBe(0);
  });

  it('status reports a sequence with CACHE > 1, which next_id would refuse (exit 3)', async () => {
    const fleet = makeFleet({ urls: db.urls, shards: SHARDS });
    await withClient(db.urls[0]!, (c) => c.query('alter sequence insta3.likes_id_seq cache 20'));
    const cli = await runCli(['status', '-c', fleet.configFile]);
    expect(cli.code).toBe(3);
    expect(cli.stdout).toContain(
      'sequences with CACHE > 1 (next_id refuses them; ALTER SEQUENCE … CACHE 1): insta3.likes_id_seq',
    );
    await withClient(db.urls[0]!, (c) => c.query('alter sequence insta3.likes_id_seq cache 1'));
    expect((await runCli(['status', '-c', fleet.configFile])).code).toBe(0);
  });

  it('add-schema refuses a shard whose schema exists on another host, writing nothing', async () => {
    const fleet = makeFleet({ urls: db.urls, shards: SHARDS });
    await withClient(db.urls[1]!, (c) => c.query('drop schema insta601 cascade'));
    // The map puts 601 on pg2; a copy on pg1 means the data lives elsewhere.
    await withClient(db.urls[0]!, (c) => c.query('create schema insta601'));
    const cli = await runCli(['add-schema', '601', '-c', fleet.configFile]);
    expect(cli.code).toBe(1);
    expect(cli.stderr).toMatch(/shard 601 is mapped to pg2 but its schema exists on host pg1/);
    expect(await shardSchemas(db.urls[1]!)).not.toContain(601);
    await withClient(db.urls[0]!, (c) => c.query('drop schema insta601'));
    expect((await runCli(['add-schema', '601', '-c', fleet.configFile])).code).toBe(0);
  });

  it('refuses a config whose prefix or shard count differs from what the hosts were built with, writing nothing', async () => {
    const other = makeFleet({ urls: db.urls, shards: 4, schemaPrefix: 'other' });
    const cli = await runCli(['init', '-c', other.configFile]);
    expect(cli.code).toBe(2);
    expect(cli.stderr).toContain('host pg1 was built with schemaPrefix insta (config: other), shards 1100 (config: 4)');
    expect(cli.stderr).toContain('host pg2 was built with');
    for (const url of db.urls) {
      await withClient(url, async (client) => {
        expect((await client.query(`select 1 from pg_namespace where nspname ~ '^other[0-9]+$'`)).rowCount).toBe(0);
      });
    }
  });
});

describe('shardctl init --dry-run on fresh hosts', () => {
  const fresh = useTestDatabases(2);

  it('prints the SQL plan and writes nothing, not even the control schema', async () => {
    const fleet = makeFleet({ urls: fresh.urls, shards: 4, schemaPrefix: 'dry' });
    const cli = await runCli(['init', '--dry-run', '-c', fleet.configFile]);
    expect(cli.code).toBe(0);
    expect(cli.stdout).toContain('CREATE SCHEMA "dry0"');
    expect(cli.stdout).toContain('CREATE OR REPLACE FUNCTION "dry3".next_id(seq regclass)');
    expect(cli.stdout).toContain('CREATE SCHEMA IF NOT EXISTS "shardctl"');
    // The plan names each host by its URL, with the password masked.
    expect(cli.stdout).toMatch(/host pg1 \(postgres:\/\/postgres:\*\*\*@/);
    for (const url of fresh.urls) {
      await withClient(url, async (client) => {
        const r = await client.query(
          `select 1 from pg_namespace where nspname ~ '^dry[0-9]+$' or nspname = 'shardctl'`,
        );
        expect(r.rowCount).toBe(0);
      });
    }
  });
});
