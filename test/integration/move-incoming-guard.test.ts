/**
 * The guard of a move's incoming copy (src/moves/sql/incoming.ts): none for a shard new to the
 * target; on a move back, once the shard is active there, it lets writes through, the clean-up
 * drops it where the table is free, and gc drops one a busy table kept, with the move's function.
 * Its schema is its owner's alone until the switch (src/moves/privileges.ts withheldSchemaAcl): an
 * application role's router on an old map reads the shard where it is, not the copy being filled.
 */
import { randomBytes } from 'node:crypto';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import pg from 'pg';
import { afterAll, describe, expect, it } from 'vitest';
import { init } from '../../src/commands/init.js';
import { ShardRouter } from '../../src/router/router.js';
import { move } from '../helpers/faults.js';
import { makeFleet, runCli } from '../helpers/fleet.js';
import { adminClient, asRole, errorOf, useTestDatabases, withClient } from '../helpers/hosts.js';
import { removeCliSnapshot, shardRow, spawnCli } from '../helpers/moves.js';

const db = useTestDatabases(2);
afterAll(removeCliSnapshot);

const GUARDS_SQL = `select c.relname as table from pg_trigger t join pg_class c on c.oid = t.tgrelid
  join pg_namespace n on n.oid = c.relnamespace where t.tgname = 'shardctl_incoming' and n.nspname = 'insta1' order by 1`;
const GUARD_FUNCTIONS_SQL = `select proname from pg_proc where proname like 'shardctl\\_move\\_%\\_incoming'`;

describe("an incoming copy's guard after the switch", () => {
  it('lets writes through once the shard is active; a table busy at the clean-up keeps it, and gc drops it with its function', async () => {
    const fleet = makeFleet({
      urls: db.urls,
      shards: 2,
      split: ['0-1', ''],
    });
    expect((await init(await fleet.config())).ok).toBe(true);
    // The move back's target is pg1: `target` there, `source` pg2.
    const [target, source, reader] = await Promise.all([
      adminClient(db.urls[0]!),
      adminClient(db.urls[1]!),
      adminClient(db.urls[0]!),
    ]);
    try {
      await target.query(`insert into insta1.photos (user_id, image_url) values (1, 'a'), (1, 'b')`);
      // Shard 1 moves to pg2 and back; the move back (whose copy is guarded: pg1 held the shard
      // before) is killed once switched.
      const away = await runCli(move(fleet, 1, '--to', 'pg2'));
      expect(away.code, away.stderr).toBe(0);
      // pg2 never held shard 1: its incoming copy had no guard, nor the move a guard function there.
      expect((await source.query(GUARDS_SQL)).rows).toEqual([]);
      expect((await source.query(GUARD_FUNCTIONS_SQL)).rows).toEqual([]);
      expect((await runCli(['gc', '--yes', '-c', fleet.configFile])).code).toBe(0);
      const back = await spawnCli(move(fleet, 1, '--to', 'pg1'), { SHARDCTL_FAULT_AFTER_STEP: 'switched' });
      expect(back.signal, back.stderr).toBe('SIGKILL');
      expect(await shardRow(target, 1)).toMatchObject({ state: 'active' });
      // Every table was guarded while incoming; active now, the guard lets writes through.
      expect((await target.query(GUARDS_SQL)).rows).toEqual([
        { table: 'comments' },
        { table: 'likes' },
        { table: 'photos' },
      ]);
      await target.query(`insert into insta1.photos (user_id, image_url) values (1, 'after the switch')`);

      // A reader holds photos through the clean-up: its guard stays, the others go.
      await reader.query(`begin; select count(*) from insta1.photos`);
      const resumed = await runCli(move(fleet, 1, '--resume'));
      expect(resumed.code, resumed.stderr).toBe(0);
      expect((await target.query(GUARDS_SQL)).rows).toEqual([{ table: 'photos' }]);
      expect((await target.query(GUARD_FUNCTIONS_SQL)).rows).toHaveLength(1);
      await target.query(`insert into insta1.photos (user_id, image_url) values (1, 'kept guard, active shard')`);
      await reader.query('commit');

      const gc = await runCli(['gc', '--yes', '--json', '-c', fleet.configFile]);
      expect(gc.code, gc.stderr).toBe(0);
      expect(JSON.parse(gc.stdout)).toMatchObject({
        triggers: [
          { host: 'pg1', shard: 1, schema: 'insta1', table: 'photos', trigger: 'shardctl_incoming', dropped: true },
        ],
      });
      expect((await target.query(GUARDS_SQL)).rows).toEqual([]);
      expect((await target.query(GUARD_FUNCTIONS_SQL)).rows).toEqual([]);
      expect(
        (await target.query(`select image_url from insta1.photos order by id`)).rows.map((r) => r.image_url),
      ).toEqual(['a', 'b', 'after the switch', 'kept guard, active shard']);
    } finally {
      await reader.query('rollback').catch(() => undefined);
      await Promise.all([source.end(), target.end(), reader.end()]);
    }
  }, 120_000);
});

// The move back killed at points before its switch (the copy built; verified, about to switch) and
// right after it (the grants committed with the activation), then resumed.
describe.each(['target-created', 'verified', 'switched'])(
  "an incoming copy's schema, the move killed after %s",
  (step) => {
    const pair = useTestDatabases(2);
    const suffix = randomBytes(4).toString('hex');
    const APP = `incoming_reader_${suffix}`;
    /** A role granted only while the copy is incoming. */
    const LATE = `incoming_late_${suffix}`;
    const PASSWORD = `pw_${suffix}`;
    const switched = step === 'switched';

    it("is its owner's alone until the switch: an application role's router on an old map reads the shard's current copy; the switch gives the schema its grants", async () => {
      const fleet = makeFleet({ urls: pair.urls, shards: 2, split: ['0-1', ''] });
      expect((await init(await fleet.config())).ok).toBe(true);
      for (const url of pair.urls)
        await withClient(url, (c) => c.query(`CREATE ROLE ${APP} LOGIN PASSWORD '${PASSWORD}'`));
      const granted = await runCli(['grant', APP, '--app', '-c', fleet.configFile]);
      expect(granted.code, granted.stderr).toBe(0);
      const appFile = join(fleet.dir, 'app.yaml');
      writeFileSync(
        appFile,
        pair.urls.reduce(
          (text, url) => text.replace(url, asRole(url, APP, PASSWORD)),
          readFileSync(fleet.configFile, 'utf8'),
        ),
      );
      const [first, second] = await Promise.all([adminClient(pair.urls[0]!), adminClient(pair.urls[1]!)]);
      const appOnFirst = new pg.Client({ connectionString: asRole(pair.urls[0]!, APP, PASSWORD) });
      await appOnFirst.connect();
      // Never refreshed: it places shard 1 on pg1 throughout, unless a call teaches it otherwise.
      // Two such routers: one names the shard's tables through its search path, one by qualified names.
      const router = await ShardRouter.open(appFile, { mapRefreshMs: 0 });
      const qualifying = await ShardRouter.open(appFile, { mapRefreshMs: 0 });
      try {
        const read = (by = router, table = 'photos') =>
          by.withShard(1, async (client) =>
            (await client.query<{ image_url: string }>(`select image_url from ${table} order by id`)).rows.map(
              (r) => r.image_url,
            ),
          );
        const readQualified = () => read(qualifying, 'insta1.photos');
        await first.query(`insert into insta1.photos (user_id, image_url) values (1, 'a')`);
        expect(await read()).toEqual(['a']);
        expect(await readQualified()).toEqual(['a']);
        const cli = async (...args: string[]) => {
          const run = await runCli([...args, '-c', fleet.configFile]);
          expect(run.code, `${args.join(' ')}: ${run.stdout}${run.stderr}`).toBe(0);
        };
        await cli('move-shard', '1', '--to', 'pg2', '--yes');
        await cli('gc', '--yes');
        for (const url of pair.urls)
          await withClient(url, (c) => c.query(`CREATE ROLE ${LATE} LOGIN PASSWORD '${PASSWORD}'`));
        await second.query(`insert into insta1.photos (user_id, image_url) values (1, 'b')`);
        // The move back stops at the step (a killed run).
        const killed = await spawnCli(move(fleet, 1, '--to', 'pg1'), { SHARDCTL_FAULT_AFTER_STEP: step });
        expect(killed.signal, killed.stderr).toBe('SIGKILL');
        expect((await shardRow(first, 1))?.state).toBe(switched ? 'active' : 'incoming');
        expect(router.hostForShard(1).name).toBe('pg1');

        const usage = `select has_schema_privilege($1, 'insta1', 'USAGE') as usage`;
        expect((await first.query(usage, [APP])).rows[0]).toEqual({ usage: switched });
        // A grant meanwhile gives the copy's schema no USAGE before the switch either.
        await cli('grant', LATE, '--app');
        expect((await first.query(usage, [LATE])).rows[0]).toEqual({ usage: switched });
        expect((await second.query(usage, [LATE])).rows[0]).toEqual({ usage: true });
        if (!switched) {
          // The copy's schema: its owner's alone. The role finds none of its tables, by either name.
          expect((await errorOf(appOnFirst.query('select count(*) from insta1.photos'))).code).toBe('42501');
          await appOnFirst.query('set search_path to insta1');
          expect((await errorOf(appOnFirst.query('select count(*) from photos'))).code).toBe('42P01');
          await appOnFirst.query('reset search_path');
          // The router's read meets that on pg1, which no longer holds the shard, and follows it to pg2.
          expect(await read()).toEqual(['a', 'b']);
          expect(router.hostForShard(1).name).toBe('pg2');
          expect(qualifying.hostForShard(1).name).toBe('pg1');
          expect(await readQualified()).toEqual(['a', 'b']);
          expect(qualifying.hostForShard(1).name).toBe('pg2');
        }

        // The switch gives the schema the source's grants with the copy's activation.
        const acl = `select array_agg(a::text order by a::text)::text as acl from pg_namespace, unnest(nspacl) a where nspname = 'insta1'`;
        const sourceAcl = (await second.query<{ acl: string }>(acl)).rows[0]!.acl;
        expect(sourceAcl).toContain(APP);
        expect(sourceAcl).toContain(LATE);
        await cli('move-shard', '1', '--resume', '--yes');
        expect((await shardRow(first, 1))?.state).toBe('active');
        expect((await first.query(usage, [APP])).rows[0]).toEqual({ usage: true });
        expect((await first.query(usage, [LATE])).rows[0]).toEqual({ usage: true });
        expect((await first.query(acl)).rows[0]).toEqual({ acl: sourceAcl });
        expect(await read()).toEqual(['a', 'b']);
        expect(await readQualified()).toEqual(['a', 'b']);
        expect([router.hostForShard(1).name, qualifying.hostForShard(1).name]).toEqual(['pg1', 'pg1']);
        expect((await appOnFirst.query<{ n: number }>('select count(*)::int as n from insta1.photos')).rows[0]!.n).toBe(
          2,
        );
      } finally {
        await Promise.all([router.close(), qualifying.close()]);
        await Promise.all([first.end(), second.end(), appOnFirst.end()]);
      }
    }, 180_000);
  },
);
