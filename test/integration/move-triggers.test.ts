/**
 * A shard's own triggers (an audit trigger, a BEFORE trigger that changes the row) must not fire on
 * the rows a move copies, nor its foreign keys depend on the order the tables are copied in: the
 * copy takes the replica role, and a role that may not is refused by the preflight before anything
 * changes.
 */
import { randomBytes } from 'node:crypto';
import { readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { init } from '../../src/commands/init.js';
import { FIXTURE_MIGRATIONS, makeFleet, runCli, type Fleet } from '../helpers/fleet.js';
import { asRole, createOperatorRole, useTestDatabases, withClient } from '../helpers/hosts.js';
import { fleetState, replicationObjects } from '../helpers/moves.js';

const db = useTestDatabases(2);
const suffix = randomBytes(4).toString('hex');
const OPS = `ops_${suffix}`;
const PASSWORD = `pw_${suffix}`;
const asOps = (url: string): string => asRole(url, OPS, PASSWORD);
const examples = Object.fromEntries(
  readdirSync(FIXTURE_MIGRATIONS).map((f) => [f, readFileSync(join(FIXTURE_MIGRATIONS, f), 'utf8')]),
);

describe("the shards' own triggers and an operator that is not a superuser", () => {
  let fleet: Fleet;
  /** The target's server major: before 16 only a superuser may create a subscription. */
  let targetMajor = 0;
  beforeAll(async () => {
    targetMajor = (await createOperatorRole(db.urls, OPS, PASSWORD))[1]!;
    fleet = makeFleet({
      urls: db.urls.map(asOps),
      replicationUrls: db.replicationUrls.map(asOps),
      shards: 4,
      split: ['0-3', ''],
      migrations: {
        ...examples,
        '0004_audit.sql': `CREATE TABLE aaa_child (id bigint PRIMARY KEY, photo_id bigint NOT NULL REFERENCES photos (id));
CREATE TABLE audit (id bigserial PRIMARY KEY, photo_id bigint NOT NULL);
CREATE FUNCTION audit_photo() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN EXECUTE format('INSERT INTO %I.audit (photo_id) VALUES ($1)', TG_TABLE_SCHEMA) USING NEW.id; RETURN NEW; END $$;
CREATE TRIGGER photos_audit AFTER INSERT ON photos FOR EACH ROW EXECUTE FUNCTION audit_photo();
CREATE FUNCTION stamp() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN NEW.body := 'stamped ' || NEW.body; RETURN NEW; END $$;
CREATE TRIGGER comments_stamp BEFORE INSERT ON comments FOR EACH ROW EXECUTE FUNCTION stamp();`,
      },
    });
    expect((await init(await fleet.config())).ok).toBe(true);
    await withClient(asOps(db.urls[0]!), (c) =>
      c.query(
        [0, 1]
          .map(
            (s) =>
              `SET search_path = insta${s}; insert into photos (user_id, image_url) select g, 'p' from generate_series(1, 300) g; insert into comments (photo_id, user_id, body) select g, g, 'c' from generate_series(1, 20) g; insert into aaa_child select id, id from photos;`,
          )
          .join('\n'),
      ),
    );
  });
  afterAll(async () => {
    for (const url of db.urls)
      await withClient(url, async (c) => {
        await c.query(`DROP OWNED BY ${OPS} CASCADE`);
        await c.query(`DROP ROLE ${OPS}`);
      });
  });

  it.each(['offline', 'online'])(
    '%s: a role that may not take the replica role is refused by the preflight, naming the triggers, the foreign key and the grant; nothing changed',
    async (mode) => {
      const before = await fleetState(db.urls, fleet.configFile);
      const run = await runCli(['move-shard', '0', '--to', 'pg2', '--mode', mode, '--yes', '-c', fleet.configFile]);
      expect(run.code, run.stderr).toBe(1);
      expect(run.stderr).toContain(
        `replica role on target: ${OPS} on pg2 may not set session_replication_role, so the copy would fire the shards' triggers and check their foreign keys on every copied row (foreign key aaa_child_photo_id_fkey on insta0.aaa_child, trigger comments_stamp on insta0.comments, trigger photos_audit on insta0.photos); GRANT SET ON PARAMETER session_replication_role TO "${OPS}" on pg2, or connect as a superuser`,
      );
      expect(run.stderr).not.toContain(PASSWORD);
      expect(await fleetState(db.urls, fleet.configFile)).toEqual(before);
      expect(await replicationObjects(db.urls)).toEqual([]);
    },
  );

  it.each([
    [0, 'offline'],
    [1, 'online'],
  ])(
    'with SET on session_replication_role: shard %i moves %s, the triggers not fired by the copy, a table copied before the one it references',
    async (shard, mode) => {
      await withClient(db.urls[1]!, (c) => c.query(`GRANT SET ON PARAMETER session_replication_role TO ${OPS}`));
      const run = await runCli([
        'move-shard',
        String(shard),
        '--to',
        'pg2',
        '--mode',
        mode,
        '--yes',
        '-c',
        fleet.configFile,
      ]);
      if (mode === 'online' && targetMajor < 16) {
        // PostgreSQL 15: the role may not subscribe at all; the preflight says so, offline works.
        expect(run.code, run.stderr).toBe(1);
        expect(run.stderr).toContain(`let ${OPS} create subscriptions on pg2`);
        return;
      }
      expect(run.code, run.stderr).toBe(0);
      const onTarget = await withClient(
        db.urls[1]!,
        async (c) =>
          (
            await c.query<{ photos: string; audit: string; children: string; stamped: string }>(
              `select (select count(*) from insta${shard}.photos)::text as photos, (select count(*) from insta${shard}.audit)::text as audit, (select count(*) from insta${shard}.aaa_child)::text as children,
                  (select count(*) from insta${shard}.comments where body like 'stamped stamped%')::text as stamped`,
            )
          ).rows[0],
      );
      expect(onTarget).toEqual({ photos: '300', audit: '300', children: '300', stamped: '0' });
    },
  );
});
