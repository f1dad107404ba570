/**
 * The operator without superuser, as on a managed service (which has none): a role that owns its
 * database's objects, has REPLICATION and (PostgreSQL 16 and later) pg_create_subscription. It
 * builds the fleet and moves shards; each right it lacks is named by the move's preflight before
 * anything changes, with what to grant.
 */
import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { init } from '../../src/commands/init.js';
import { makeFleet, runCli, type Fleet } from '../helpers/fleet.js';
import { asRole, createOperatorRole, databaseOf, useTestDatabases, withClient } from '../helpers/hosts.js';
import { fleetState, replicationObjects } from '../helpers/moves.js';

const db = useTestDatabases(2);
const builtByOthers = useTestDatabases(1);
const suffix = randomBytes(4).toString('hex');
const OPS = `ops_${suffix}`;
const PASSWORD = `pw_${suffix}`;

const asOps = (url: string): string => asRole(url, OPS, PASSWORD);

const move = (fleet: Fleet, shard: number, ...flags: string[]) => [
  'move-shard',
  String(shard),
  '--to',
  'pg2',
  ...flags,
  '--yes',
  '-c',
  fleet.configFile,
];

/** The target's server major, which decides who may create a subscription. */
let targetMajor = 0;

async function onTarget(sql: string): Promise<void> {
  await withClient(db.urls[1]!, (c) => c.query(sql));
}

describe('an operator role that is not a superuser', () => {
  let fleet: Fleet;

  beforeAll(async () => {
    targetMajor = (await createOperatorRole(db.urls, OPS, PASSWORD))[1]!;
    fleet = makeFleet({
      urls: db.urls.map(asOps),
      replicationUrls: db.replicationUrls.map(asOps),
      shards: 4,
      split: ['0-1', '2-3'],
    });
    expect((await init(await fleet.config())).ok).toBe(true);
    await withClient(asOps(db.urls[0]!), (c) =>
      c.query(`insert into insta0.photos (user_id, image_url) select g, 'p' from generate_series(1, 500) g;
               insert into insta1.photos (user_id, image_url) select g, 'p' from generate_series(1, 500) g`),
    );
  });

  afterAll(async () => {
    // Roles are the cluster's: the test's own goes, with what it owns and was granted in the database.
    for (const url of db.urls)
      await withClient(url, async (c) => {
        await c.query(`DROP OWNED BY ${OPS} CASCADE`);
        await c.query(`DROP ROLE ${OPS}`);
      });
  });

  it('may not create schemas on the target: both modes refused by the preflight, naming the role, the database and the grant; nothing changed', async () => {
    await onTarget(`REVOKE CREATE ON DATABASE "${databaseOf(db.urls[1]!)}" FROM ${OPS}`);
    try {
      const before = await fleetState(db.urls, fleet.configFile);
      for (const mode of ['online', 'offline']) {
        const run = await runCli(move(fleet, 0, '--mode', mode));
        expect(run.code, run.stderr).toBe(1);
        expect(run.stderr).toContain(
          `create on target: ${OPS} may not create schemas in database ${databaseOf(db.urls[1]!)} on pg2: GRANT CREATE ON DATABASE "${databaseOf(db.urls[1]!)}" TO "${OPS}" there`,
        );
      }
      expect(await fleetState(db.urls, fleet.configFile)).toEqual(before);
    } finally {
      await onTarget(`GRANT CREATE ON DATABASE "${databaseOf(db.urls[1]!)}" TO ${OPS}`);
    }
  });

  it('may not create subscriptions on the target: an online move refused, saying what to grant or to move offline; nothing changed', async () => {
    if (targetMajor >= 16) await onTarget(`REVOKE pg_create_subscription FROM ${OPS}`);
    try {
      const before = await fleetState(db.urls, fleet.configFile);
      const run = await runCli(move(fleet, 0));
      expect(run.code, run.stderr).toBe(1);
      expect(run.stderr).toContain('target reaches source: pg2 cannot subscribe to pg1 at its replicationUrl: ');
      expect(run.stderr).toContain(
        `let ${OPS} create subscriptions on pg2 (PostgreSQL 16 and later: GRANT pg_create_subscription TO it;`,
      );
      expect(run.stderr).toContain('or use --mode offline');
      expect(run.stderr).not.toContain(PASSWORD);
      expect(await fleetState(db.urls, fleet.configFile)).toEqual(before);
      expect(await replicationObjects(db.urls)).toEqual([]);
    } finally {
      if (targetMajor >= 16) await onTarget(`GRANT pg_create_subscription TO ${OPS}`);
    }
  });

  it('moves shards: offline on any major, online where it may subscribe (PostgreSQL 16 and later); status and gc after', async () => {
    const offline = await runCli(move(fleet, 0, '--mode', 'offline'));
    expect(offline.code, offline.stderr).toBe(0);
    if (targetMajor >= 16) {
      const online = await runCli(move(fleet, 1));
      expect(online.code, online.stderr).toBe(0);
      expect(online.stdout).toMatch(/shard 1 moved from pg1 to pg2: 500 rows verified/);
    }
    const gc = await runCli(['gc', '--yes', '-c', fleet.configFile]);
    expect(gc.code, gc.stderr).toBe(0);
    const status = await runCli(['status', '-c', fleet.configFile]);
    expect(status.code, status.stderr).toBe(0);
    const moved = targetMajor >= 16 ? [0, 1] : [0];
    for (const shard of moved)
      await withClient(asOps(db.urls[1]!), async (c) => {
        const r = await c.query<{ n: string }>(`select count(*)::text as n from insta${shard}.photos`);
        expect(r.rows[0]!.n).toBe('500');
      });
    expect(await replicationObjects(db.urls)).toEqual([]);
    // Back to pg1, which held it: a guarded copy, whose schema is its owner's alone until the
    // switch (the operator's own, so the move goes on as before), then granted as the source's.
    const back = await runCli([
      ...move(fleet, 0, ...(targetMajor >= 16 ? [] : ['--mode', 'offline'])).map((a) => (a === 'pg2' ? 'pg1' : a)),
    ]);
    expect(back.code, back.stderr).toBe(0);
    const acl = `select nspacl::text as acl from pg_namespace where nspname = 'insta0'`;
    const [onFirst] = await withClient(asOps(db.urls[0]!), async (c) => (await c.query(acl)).rows);
    const [movedAway] = await withClient(
      asOps(db.urls[1]!),
      async (c) => (await c.query(acl.replace("= 'insta0'", "like 'insta0\\_moved\\_%'"))).rows,
    );
    expect(onFirst).toEqual(movedAway);
    expect(await replicationObjects(db.urls)).toEqual([]);
  });

  it("a fleet another role built: init, migrate, gc, add-schema and rebalance refuse, naming the control schema's owner and what lets the operator in; the commands that take no lock name the host", async () => {
    const url = builtByOthers.urls[0]!;
    const database = databaseOf(url);
    const builder = `builder_${suffix}`;
    const superuser = new URL(url).username;
    await withClient(url, async (c) => {
      await c.query(`CREATE ROLE ${builder} LOGIN PASSWORD '${PASSWORD}'`);
      await c.query(`GRANT CREATE ON DATABASE "${database}" TO ${builder}, ${OPS}`);
    });
    try {
      const as = (role: string): string => {
        const u = new URL(url);
        u.username = role;
        u.password = PASSWORD;
        return u.toString();
      };
      const bySuperuser = makeFleet({ urls: [url], shards: 2, schemaPrefix: 'su' });
      expect((await init(await bySuperuser.config())).ok).toBe(true);
      const asOperator = makeFleet({ urls: [as(OPS)], shards: 2, schemaPrefix: 'su' });
      for (const command of [['init'], ['migrate'], ['gc', '--yes'], ['add-schema', '1'], ['rebalance', '--yes']]) {
        const run = await runCli([...command, '-c', asOperator.configFile]);
        expect(run.code, run.stderr).toBe(1);
        expect(run.stderr).toContain(
          `host pg1: ${OPS} has no rights on the control schema shardctl, which belongs to ${superuser} (permission denied for schema shardctl`,
        );
        // A superuser's membership would let the operator become it: not offered.
        expect(run.stderr).toContain(`run shardctl as ${superuser}, the role that built the fleet\n`);
        expect(run.stderr).not.toContain(PASSWORD);
      }

      // Commands that take no runner lock still name the host that refused them.
      for (const command of [
        ['rebalance', '--dry-run'],
        ['grant', OPS, '--app'],
      ]) {
        const run = await runCli([...command, '-c', asOperator.configFile]);
        expect(run.code, run.stderr).toBe(1);
        expect(run.stderr).toMatch(
          /^error: host pg1: cannot read the (fleet's placement|shards): permission denied for schema shardctl/,
        );
      }

      // Built by a role that is not a superuser: its membership is offered, and lets the operator in.
      await withClient(url, (c) => c.query('DROP SCHEMA shardctl, su0, su1 CASCADE'));
      const byBuilder = makeFleet({ urls: [as(builder)], shards: 2, schemaPrefix: 'su' });
      expect((await init(await byBuilder.config())).ok).toBe(true);
      const refused = await runCli(['migrate', '-c', asOperator.configFile]);
      expect(refused.code).toBe(1);
      expect(refused.stderr).toContain(
        `which belongs to ${builder} (permission denied for schema shardctl (SQLSTATE 42501)): run shardctl as ${builder}, the role that built the fleet, or GRANT "${builder}" TO "${OPS}"`,
      );
      await withClient(url, (c) => c.query(`GRANT ${builder} TO ${OPS}`));
      const migrated = await runCli(['migrate', '-c', asOperator.configFile]);
      expect(migrated.code, migrated.stderr).toBe(0);
    } finally {
      await withClient(url, async (c) => {
        await c.query(`DROP OWNED BY ${builder} CASCADE`);
        await c.query(`DROP ROLE ${builder}`);
      });
    }
  });
});
