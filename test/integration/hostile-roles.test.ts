/**
 * Roles without rights on what shardctl protects: a role that can only connect, and one with USAGE
 * on a shard schema. Neither can take, call or write the locks shardctl relies on (the runner lock,
 * the workers' records, the tracking lock, next_id's slow-path lock), nor move a sequence; holding
 * what they can take (any advisory key, ACCESS SHARE on the control tables) stalls nothing.
 */
import { randomBytes } from 'node:crypto';
import pg from 'pg';
import { beforeAll, describe, expect, it } from 'vitest';
import { init } from '../../src/commands/init.js';
import { RUNNER_LOCK_TABLE, TRACKING_LOCK_TABLE, WORKERS_TABLE } from '../../src/fleet/locks.js';
import { ID_LOCK_TABLES } from '../../src/id/sql.js';
import { type Fleet, makeFleet, runCli } from '../helpers/fleet.js';
import { errorOf, useTestDatabases, withClient } from '../helpers/hosts.js';

const db = useTestDatabases(2);
const suffix = randomBytes(4).toString('hex');
const STRANGER = `stranger_${suffix}`;
const SCHEMA_USER = `schema_user_${suffix}`;
const PASSWORD = `pw_${suffix}`;
/** An advisory-lock class named for shardctl ('shrd'): shardctl locks rows, never advisory keys, so a stranger holding these must stall nothing. */
const ADVISORY_CLASS = 0x73687264;

function urlAs(url: string, role: string): string {
  const u = new URL(url);
  u.username = role;
  u.password = PASSWORD;
  return u.toString();
}

async function connectAs(url: string, role: string): Promise<pg.Client> {
  const client = new pg.Client({ connectionString: urlAs(url, role), application_name: 'hostile' });
  client.on('error', () => undefined);
  await client.connect();
  return client;
}

describe('roles without rights on what shardctl protects', () => {
  let fleet: Fleet;

  beforeAll(async () => {
    fleet = makeFleet({ urls: db.urls, shards: 4, extra: 'lockTimeout: 1s' });
    expect((await init(await fleet.config())).ok).toBe(true);
    await withClient(db.urls[0]!, async (client) => {
      for (const role of [STRANGER, SCHEMA_USER])
        await client.query(`create role ${role} login password '${PASSWORD}'`);
      // CONNECT is PUBLIC's; the schema user also has USAGE on a shard schema and its tables, not its sequence.
      await client.query(`grant usage on schema insta0 to ${SCHEMA_USER}`);
      await client.query(`grant select on insta0.photos to ${SCHEMA_USER}`);
    });
  });

  it.each([
    ['lock the runner lock', `begin; lock table ${RUNNER_LOCK_TABLE} in share update exclusive mode`],
    ['lock the runner lock in access exclusive mode', `begin; lock table ${RUNNER_LOCK_TABLE}`],
    ['lock the tracking lock', `begin; lock table ${TRACKING_LOCK_TABLE} in exclusive mode`],
    [
      'pose as a worker',
      `insert into ${WORKERS_TABLE} select pid, backend_start from pg_stat_activity where pid = pg_backend_pid()`,
    ],
    ['hold a slow-path lock row', 'begin; select from shardctl.id_locks for no key update'],
    ['hold a slow-path lock table', 'begin; lock table shardctl.id_lock_0 in exclusive mode'],
    ['empty the slow-path lock rows', 'delete from shardctl.id_locks'],
  ])('a role with only CONNECT cannot %s', async (_what, sql) => {
    const stranger = await connectAs(db.urls[0]!, STRANGER);
    try {
      const error = await errorOf(stranger.query(sql));
      expect(error.code).toBe('42501');
    } finally {
      await stranger.end();
    }
  });

  it('what a role with only CONNECT can hold (advisory keys of a shardctl-named class, ACCESS SHARE on the lock tables) stalls neither next_id nor init and migrate', async () => {
    const stranger = await connectAs(db.urls[0]!, STRANGER);
    try {
      const seq = (
        await withClient(db.urls[0]!, (c) =>
          c.query<{ oid: number }>(`select 'insta0.photos_id_seq'::regclass::oid::int as oid`),
        )
      ).rows[0]!.oid;
      await stranger.query('begin');
      for (const objid of [0, 1, 2, seq])
        await stranger.query('select pg_advisory_lock($1, $2)', [ADVISORY_CLASS, objid]);
      const tables = await stranger.query<{ oid: number }>(
        `select oid::int from pg_class where relnamespace = 'shardctl'::regnamespace and (relname in ('runner_lock', 'tracking_lock', 'workers', 'id_locks') or relname ~ '^id_lock_[0-9]+$')`,
      );
      expect(tables.rows).toHaveLength(4 + ID_LOCK_TABLES);
      for (const { oid } of tables.rows) await stranger.query('select pg_relation_size($1::oid::regclass)', [oid]);

      await withClient(db.urls[0]!, async (client) => {
        await client.query(`set statement_timeout = '5s'`);
        // Idle, so the insert takes the slow path (as on main, where the stranger's key stalled it).
        await client.query(`select setval('insta0.photos_id_seq', 1024)`);
        const inserted = await client.query<{ id: string }>(
          `insert into insta0.photos (user_id, image_url) values (1, 'x') returning id`,
        );
        expect(inserted.rows).toHaveLength(1);
      });
      fleet.writeMigration('0004_stranger.sql', 'ALTER TABLE photos ADD COLUMN stranger_proof boolean;\n');
      for (const command of ['init', 'migrate']) {
        const started = Date.now();
        const run = await runCli([command, '-c', fleet.configFile]);
        expect(run.stderr).not.toContain('runner lock');
        expect(run.code).toBe(0);
        expect(Date.now() - started).toBeLessThan(10_000);
      }
    } finally {
      await stranger.end();
    }
  });

  it("a role with USAGE on the shard schema (and on the control schema) but no right on its sequence cannot move it through the host's next_id_locked, nor draw from it through next_id", async () => {
    const before = await withClient(db.urls[0]!, async (client) => {
      // USAGE on the control schema, as a router's role may have: the slow path is then callable by name.
      await client.query(`grant usage on schema shardctl to ${SCHEMA_USER}`);
      await client.query(`select setval('insta0.photos_id_seq', 2048)`);
      return (await client.query<{ last_value: string }>('select last_value from insta0.photos_id_seq')).rows[0]!
        .last_value;
    });
    const user = await connectAs(db.urls[0]!, SCHEMA_USER);
    try {
      const locked = await errorOf(user.query(`select shardctl.next_id_locked('insta0.photos_id_seq', 0)`));
      expect(locked.code).toBe('SC006');
      expect(locked.message).toBe(
        'next_id: this session has not drawn from sequence insta0.photos_id_seq, so it may not move it',
      );
      const drawn = await errorOf(user.query(`select insta0.next_id('insta0.photos_id_seq')`));
      expect(drawn.code).toBe('42501');
    } finally {
      await user.end();
    }
    const after = await withClient(
      db.urls[0]!,
      async (client) =>
        (await client.query<{ last_value: string }>('select last_value from insta0.photos_id_seq')).rows[0]!.last_value,
    );
    expect(after).toBe(before);
    await withClient(db.urls[0]!, (client) => client.query(`revoke usage on schema shardctl from ${SCHEMA_USER}`));
  });

  it('a role that may insert (USAGE on the sequence) still gets ids from the slow path', async () => {
    await withClient(db.urls[0]!, async (client) => {
      await client.query(`grant usage on schema insta1 to ${STRANGER}`);
      await client.query(`grant usage on sequence insta1.photos_id_seq to ${STRANGER}`);
      await client.query(`grant insert, select on insta1.photos to ${STRANGER}`);
      await client.query(`select setval('insta1.photos_id_seq', 1024)`);
    });
    const app = await connectAs(db.urls[0]!, STRANGER);
    try {
      const r = await app.query<{ id: string }>(
        `insert into insta1.photos (user_id, image_url) values (1, 'x'), (2, 'y') returning id`,
      );
      expect(r.rows).toHaveLength(2);
      const position = await withClient(db.urls[0]!, async (client) =>
        BigInt(
          (await client.query<{ last_value: string }>('select last_value from insta1.photos_id_seq')).rows[0]!
            .last_value,
        ),
      );
      // Moved to the clock by the slow path, far past where it was set.
      expect(position).toBeGreaterThan(1n << 30n);
    } finally {
      await app.end();
    }
  });
});

describe("next_id's lock rows", () => {
  const rowsDb = useTestDatabases(1);

  it('init restores missing lock rows (the slow path of a host changing over takes them)', async () => {
    const fleet = makeFleet({ urls: rowsDb.urls, shards: 2 });
    expect((await init(await fleet.config())).ok).toBe(true);
    await withClient(rowsDb.urls[0]!, async (client) => {
      await client.query(
        `delete from shardctl.id_locks where slot = 'insta0.photos_id_seq'::regclass::oid::bigint % 8192`,
      );
      // The slow path of this release does not need them (test/integration/slow-path-lock.test.ts).
      await client.query(`select setval('insta0.photos_id_seq', 1024)`);
      await client.query(`insert into insta0.photos (user_id, image_url) values (1, 'x')`);
    });
    expect((await runCli(['init', '-c', fleet.configFile])).code).toBe(0);
    await withClient(rowsDb.urls[0]!, async (client) => {
      expect((await client.query(`select count(*)::int as n from shardctl.id_locks`)).rows[0]!.n).toBe(8192);
    });
  });
});

describe('status and sequences next_id would repeat ids from', () => {
  // A host's layout is fixed once built: a database per test.
  const [backDb, oneDb, borrowedDb] = [useTestDatabases(1), useTestDatabases(1), useTestDatabases(1)];

  it.each([
    [
      'moved back 100 positions',
      `select setval('insta2.photos_id_seq', (select last_value from insta2.photos_id_seq) - 100)`,
      () => backDb,
    ],
    ['set to 1', `select setval('insta2.photos_id_seq', 1)`, () => oneDb],
  ])(
    'reports a sequence %s behind the ids in its table (exit 3), naming the shard and the table',
    async (_what, setval, database) => {
      const statusDb = database();
      const fleet = makeFleet({ urls: statusDb.urls, shards: 4, schemaPrefix: `s${randomBytes(2).toString('hex')}_` });
      const config = await fleet.config();
      expect((await init(config)).ok).toBe(true);
      const schema = `${config.schemaPrefix}2`;
      await withClient(statusDb.urls[0]!, async (client) => {
        await client.query(
          `insert into "${schema}".photos (user_id, image_url) select g, 'x' from generate_series(1, 5000) g`,
        );
        expect((await runCli(['status', '-c', fleet.configFile])).code).toBe(0);
        await client.query(setval.replaceAll('insta2', `"${schema}"`));
      });
      const run = await runCli(['status', '-c', fleet.configFile]);
      expect(run.code).toBe(3);
      expect(run.stdout).toMatch(
        new RegExp(
          `id sequence: shard 2, table ${schema}\\.photos: sequence ${schema}\\.photos_id_seq is behind the ids in id`,
        ),
      );
      const json = JSON.parse((await runCli(['status', '--json', '-c', fleet.configFile])).stdout) as {
        hosts: { sequenceProblems: string[] }[];
      };
      expect(json.hosts[0]!.sequenceProblems).toHaveLength(1);
    },
  );

  it("reports a default that draws from another shard's sequence (exit 3), naming both", async () => {
    const statusDb = borrowedDb;
    const fleet = makeFleet({ urls: statusDb.urls, shards: 2, schemaPrefix: `x${randomBytes(2).toString('hex')}_` });
    const config = await fleet.config();
    expect((await init(config)).ok).toBe(true);
    const [zero, one] = [`${config.schemaPrefix}0`, `${config.schemaPrefix}1`];
    await withClient(statusDb.urls[0]!, (client) =>
      client.query(
        `create table "${zero}".borrowed (id bigint primary key default "${zero}".next_id('"${one}".photos_id_seq'))`,
      ),
    );
    const run = await runCli(['status', '-c', fleet.configFile]);
    expect(run.code).toBe(3);
    expect(run.stdout).toContain(
      `id sequence: shard 0, table ${zero}.borrowed: id draws from sequence ${one}.photos_id_seq of another schema`,
    );
  });
});
