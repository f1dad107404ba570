/**
 * Owners, grants and default privileges of a shard travel with it: the target's copy is built by the
 * migrations as the connecting role, then given the source's owners, ACLs and default privileges. A
 * role the source names that the target's cluster lacks refuses the move up front.
 */
import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { init } from '../../src/commands/init.js';
import { moveShard } from '../../src/commands/move-shard.js';
import { ShardMap } from '../../src/config/shard-map.js';
import { FIXTURE_MIGRATIONS, type Fleet, makeFleet, runCli } from '../helpers/fleet.js';
import { useTestDatabases, withClient } from '../helpers/hosts.js';
import { fleetState, replicationObjects, spawnCli, startShardWriter } from '../helpers/moves.js';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';

const db = useTestDatabases(2);
// Roles belong to the cluster, which every test file shares: names of this file's own.
const suffix = randomBytes(4).toString('hex');
const APP = `app_${suffix}`;
const READER = `reader_${suffix}`;
const GHOST = `ghost_${suffix}`;
const WEAK = `weak_${suffix}`;
const PASSWORD = `pw_${suffix}`;

/** The example migrations, and one that grants (to PUBLIC, which every cluster has) and builds a partitioned table, a view, a materialized view and a function. */
const migrations: Record<string, string> = {
  ...Object.fromEntries(
    readdirSync(FIXTURE_MIGRATIONS).map((f) => [f, readFileSync(join(FIXTURE_MIGRATIONS, f), 'utf8')]),
  ),
  '0004_more.sql': `
CREATE TABLE events (id bigint NOT NULL, at date NOT NULL, PRIMARY KEY (id, at)) PARTITION BY RANGE (at);
CREATE TABLE events_2024 PARTITION OF events FOR VALUES FROM ('2024-01-01') TO ('2025-01-01');
CREATE VIEW recent_photos AS SELECT id, user_id FROM photos ORDER BY id DESC LIMIT 10;
CREATE MATERIALIZED VIEW photo_stats AS SELECT count(*) AS n FROM photos;
CREATE FUNCTION photo_count(min_user bigint) RETURNS bigint LANGUAGE sql STABLE AS 'SELECT count(*) FROM photos WHERE user_id >= min_user';
CREATE DOMAIN positive_count AS bigint CHECK (VALUE >= 0);
CREATE TYPE mood AS ENUM ('happy', 'sad');
CREATE AGGREGATE sum_counts(bigint) (sfunc = int8pl, stype = bigint);
GRANT SELECT ON comments TO PUBLIC;
`,
};

/** Owners and ACLs (role names, entries sorted; the default ACL where the catalog has none) of a shard schema and its objects, and its default ACLs. */
async function privileges(url: string, schema: string): Promise<Record<string, string>> {
  return withClient(url, async (c) => {
    const r = await c.query<{ what: string; owner: string | null; acl: string | null }>(
      `select 'schema' as what, pg_get_userbyid(n.nspowner) as owner,
              array(select unnest(coalesce(n.nspacl, acldefault('n', n.nspowner)))::text order by 1)::text as acl
         from pg_namespace n where n.nspname = $1
       union all
       select c.relkind::text || ' ' || c.relname, pg_get_userbyid(c.relowner),
              array(select unnest(coalesce(c.relacl, acldefault(case c.relkind when 'S' then 's' else 'r' end::"char", c.relowner)))::text order by 1)::text
         from pg_class c where c.relnamespace = $1::regnamespace and c.relkind in ('r', 'p', 'S', 'v', 'm')
       union all
       select 'column ' || c.relname || '.' || a.attname, null, array(select unnest(a.attacl)::text order by 1)::text
         from pg_attribute a join pg_class c on c.oid = a.attrelid
        where c.relnamespace = $1::regnamespace and a.attacl is not null and a.attnum > 0
       union all
       select 'function ' || p.oid::regprocedure::text, pg_get_userbyid(p.proowner),
              array(select unnest(coalesce(p.proacl, acldefault('f', p.proowner)))::text order by 1)::text
         from pg_proc p where p.pronamespace = $1::regnamespace
       union all
       select 'type ' || t.typname, pg_get_userbyid(t.typowner),
              array(select unnest(coalesce(t.typacl, acldefault('T', t.typowner)))::text order by 1)::text
         from pg_type t where t.typnamespace = $1::regnamespace and t.typtype in ('d', 'e')
       union all
       select 'default ' || pg_get_userbyid(d.defaclrole) || ' ' || d.defaclobjtype::text, null, array(select unnest(d.defaclacl)::text order by 1)::text
         from pg_default_acl d where d.defaclnamespace = $1::regnamespace`,
      [schema],
    );
    return Object.fromEntries(r.rows.map((row) => [row.what, `${row.owner ?? ''} ${row.acl}`]));
  });
}

describe('move-shard carries owners, grants and default privileges', () => {
  let fleet: Fleet;

  beforeAll(async () => {
    for (const url of db.urls) {
      await withClient(url, async (c) => {
        for (const role of [APP, READER]) await c.query(`create role ${role}`);
        if (url === db.urls[0]) await c.query(`create role ${GHOST}`);
        else await c.query(`create role ${WEAK} login password '${PASSWORD}'`);
      });
    }
    fleet = makeFleet({ urls: db.urls, shards: 8, split: ['0-3', '4-7'], migrations });
    expect((await init(await fleet.config())).ok).toBe(true);
  });

  afterAll(async () => {
    // The roles own objects and privileges in this file's databases: removed there before the roles go.
    for (const url of db.urls) {
      await withClient(url, async (c) => {
        const roles = url === db.urls[0] ? [APP, READER, GHOST] : [APP, READER, WEAK];
        for (const role of roles) await c.query(`drop owned by ${role} cascade`);
        for (const role of roles) await c.query(`drop role ${role}`);
      });
    }
  });

  /** By hand on the source: the shard's objects given to the app role, grants and a revoke, default privileges. */
  async function handMade(shard: number, schemaOwnedByApp: boolean): Promise<void> {
    const s = `insta${shard}`;
    await withClient(db.urls[0]!, (c) =>
      c.query(`
        ${schemaOwnedByApp ? `alter schema ${s} owner to ${APP};` : `grant usage, create on schema ${s} to ${APP};`}
        alter table ${s}.photos owner to ${APP};
        alter table ${s}.likes owner to ${APP};
        alter table ${s}.comments owner to ${APP};
        alter table ${s}.events owner to ${APP};
        alter table ${s}.events_2024 owner to ${APP};
        alter view ${s}.recent_photos owner to ${APP};
        alter materialized view ${s}.photo_stats owner to ${APP};
        alter function ${s}.photo_count(bigint) owner to ${APP};
        alter domain ${s}.positive_count owner to ${APP};
        alter type ${s}.mood owner to ${APP};
        alter aggregate ${s}.sum_counts(bigint) owner to ${APP};
        revoke usage on type ${s}.mood from public;
        grant usage on type ${s}.mood to ${READER};
        revoke execute on function ${s}.sum_counts(bigint) from public;
        grant usage on schema ${s} to ${READER};
        grant select on ${s}.photos to ${READER};
        grant select (body) on ${s}.comments to ${READER};
        revoke select on ${s}.comments from public;
        revoke execute on function ${s}.photo_count(bigint) from public;
        grant execute on function ${s}.photo_count(bigint) to ${READER};
        alter default privileges for role ${APP} in schema ${s} grant select on tables to ${READER};
        alter default privileges in schema ${s} grant usage on sequences to ${READER} with grant option;
      `),
    );
  }

  /** On the target after the move: the app role writes, the reader reads, a table the owner creates later is readable. */
  async function rolesWork(shard: number): Promise<void> {
    const s = `insta${shard}`;
    await withClient(db.urls[1]!, async (c) => {
      await c.query(`set role ${APP}`);
      await c.query(`insert into ${s}.photos (user_id, image_url) values (42, 'by the app role')`);
      await c.query(`create table ${s}.later (x int)`);
      await c.query(`insert into ${s}.later values (1)`);
      await c.query(`set role ${READER}`);
      expect((await c.query(`select count(*)::int as n from ${s}.photos where user_id = 42`)).rows[0].n).toBe(1);
      expect((await c.query(`select x from ${s}.later`)).rows).toEqual([{ x: 1 }]);
      await c.query(`select body from ${s}.comments`);
      await expect(c.query(`select user_id from ${s}.comments`)).rejects.toThrow(/permission denied/);
      await c.query(`reset role`);
      // PUBLIC lost what the source revoked by hand, though the migration granted it on the target too.
      expect((await c.query(`select has_table_privilege('public', '${s}.comments', 'SELECT') as p`)).rows[0].p).toBe(
        false,
      );
    });
  }

  it('online, under a writer: owners, ACLs (columns too) and default ACLs on the target equal the source; the roles work there', async () => {
    await handMade(0, false);
    const before = await privileges(db.urls[0]!, 'insta0');
    expect(before['r photos']).toMatch(new RegExp(`^${APP} `));
    expect(before['type mood']).toMatch(new RegExp(`^${APP} .*${READER}=U/${APP}`));
    expect(before['function insta0.sum_counts(bigint)']).toMatch(new RegExp(`^${APP} `));
    expect(before['default ' + APP + ' r']).toContain(`${READER}=r/${APP}`);

    const map = await ShardMap.load(fleet.configFile);
    const writer = startShardWriter(map, 0);
    await new Promise((resolve) => setTimeout(resolve, 200));
    const result = await moveShard(await fleet.config(), 0, 'pg2', { configFile: fleet.configFile });
    await new Promise((resolve) => setTimeout(resolve, 200));
    await writer.stop();
    expect(result.outcome).toBe('moved');
    expect(writer.acknowledged.some((a) => a.host === 'pg2')).toBe(true);

    expect(await privileges(db.urls[1]!, 'insta0')).toEqual(before);
    await rolesWork(0);
    expect(await replicationObjects(db.urls)).toEqual([]);
  });

  it('offline, with the schema itself owned by the app role: the same', async () => {
    await handMade(1, true);
    const before = await privileges(db.urls[0]!, 'insta1');
    expect(before['schema']).toMatch(new RegExp(`^${APP} `));
    const result = await moveShard(await fleet.config(), 1, 'pg2', { configFile: fleet.configFile, mode: 'offline' });
    expect(result.outcome).toBe('moved');
    expect(await privileges(db.urls[1]!, 'insta1')).toEqual(before);
    await rolesWork(1);
  });

  it('a role the source names that the target lacks: refused by the preflight naming the role and the shard; nothing changed', async () => {
    await withClient(db.urls[0]!, (c) => c.query(`grant select on insta2.likes to ${GHOST}`));
    const before = await fleetState(db.urls, fleet.configFile);
    const run = await runCli(['move-shard', '2', '--to', 'pg2', '--yes', '-c', fleet.configFile]);
    expect(run.code, run.stderr).toBe(1);
    expect(run.stderr).toContain('nothing was changed');
    expect(run.stderr).toContain(
      `roles on target: role ${GHOST} (named by shard 2 on pg1) does not exist on pg2: roles are per cluster; create the role on pg2 first`,
    );
    expect(await fleetState(db.urls, fleet.configFile)).toEqual(before);
  });

  it('killed after the target copy was built and before its owners and grants were carried: --resume carries them', async () => {
    // The role the previous test named, which the target lacks, no longer named.
    await withClient(db.urls[0]!, (c) => c.query(`revoke select on insta2.likes from ${GHOST}`));
    await handMade(2, false);
    const before = await privileges(db.urls[0]!, 'insta2');
    const killed = await spawnCli(['move-shard', '2', '--to', 'pg2', '--yes', '-c', fleet.configFile], {
      SHARDCTL_FAULT_AFTER_STEP: 'target-migrations',
    });
    expect(killed.signal, killed.stderr).toBe('SIGKILL');
    // Built by the migrations, owned by the role that ran them: not yet the source's owners.
    const built = await privileges(db.urls[1]!, 'insta2');
    expect(built['r photos']).toBeDefined();
    expect(built['r photos']).not.toMatch(new RegExp(`^${APP} `));
    const resumed = await runCli(['move-shard', '2', '--resume', '--yes', '-c', fleet.configFile]);
    expect(resumed.code, resumed.stderr).toBe(0);
    expect(await privileges(db.urls[1]!, 'insta2')).toEqual(before);
    await rolesWork(2);
  });

  it('a connecting role on the target that is neither superuser nor a member of an owner: refused, naming both', async () => {
    await withClient(db.urls[0]!, (c) => c.query(`alter table insta3.photos owner to ${APP}`));
    // The target reached as a plain role that can read what the preflight reads there.
    await withClient(db.urls[1]!, (c) =>
      c.query(`grant usage on schema shardctl to ${WEAK}; grant select on all tables in schema shardctl to ${WEAK}`),
    );
    const weakUrl = new URL(db.urls[1]!);
    weakUrl.username = WEAK;
    weakUrl.password = PASSWORD;
    // The same fleet, as the moves so far left its map.
    const map = await ShardMap.load(fleet.configFile);
    const split = ['pg1', 'pg2'].map((host) =>
      Array.from({ length: 8 }, (_, s) => s)
        .filter((s) => map.hostForShard(s).name === host)
        .join(','),
    );
    const weak = makeFleet({ urls: [db.urls[0]!, weakUrl.toString()], shards: 8, split, migrations });
    const run = await runCli(['move-shard', '3', '--to', 'pg2', '--dry-run', '-c', weak.configFile]);
    expect(run.code, run.stdout + run.stderr).toBe(1);
    const failed = (out: string): string => out.split('\n').find((l) => l.includes('owners on target')) ?? '';
    // The superuser that built the rest of the shard on the source is an owner too.
    expect(failed(run.stdout)).toMatch(
      new RegExp(
        `^  FAIL owners on target: ${WEAK} on pg2 is neither superuser nor a member of .*${APP} \\(owner in shard 3\\)`,
      ),
    );
    expect(failed(run.stdout)).toContain(`or connect as a superuser`);
    const version = await withClient(db.urls[1]!, async (c) =>
      Number((await c.query<{ v: string }>(`select current_setting('server_version_num') as v`)).rows[0]!.v),
    );
    if (version >= 160000) {
      // A membership that may not SET ROLE to the owner cannot give it objects on 16 and later.
      await withClient(db.urls[1]!, (c) => c.query(`grant ${APP} to ${WEAK} with inherit true, set false`));
      const noSet = await runCli(['move-shard', '3', '--to', 'pg2', '--dry-run', '-c', weak.configFile]);
      expect(failed(noSet.stdout)).toMatch(
        new RegExp(`neither superuser nor a member of .*${APP} .*with the SET option`),
      );
      expect(failed(noSet.stdout)).toContain(`WITH SET TRUE`);
      await withClient(db.urls[1]!, (c) => c.query(`revoke ${APP} from ${WEAK}`));
    }
    await withClient(db.urls[1]!, (c) => c.query(`grant ${APP} to ${WEAK}`));
    const granted = await runCli(['move-shard', '3', '--to', 'pg2', '--dry-run', '-c', weak.configFile]);
    expect(failed(granted.stdout)).toContain('FAIL owners on target');
    expect(failed(granted.stdout)).not.toContain(APP);
  });
  it('default privileges recorded in a shard schema by a role that may not create there (any role can) neither refuse the move nor travel', async () => {
    // GHOST exists on the source only, and has no right on the schema: its entry never applies.
    await withClient(db.urls[0]!, (c) =>
      c.query(`alter default privileges for role ${GHOST} in schema insta3 grant select on tables to public`),
    );
    const result = await moveShard(await fleet.config(), 3, 'pg2', { configFile: fleet.configFile, mode: 'offline' });
    expect(result.outcome).toBe('moved');
    const after = await privileges(db.urls[1]!, 'insta3');
    expect(Object.keys(after).filter((k) => k.includes(GHOST))).toEqual([]);
  });
});
