/**
 * The guard of a move's incoming copy (src/moves/sql/incoming.ts): none for a shard new to the
 * target; on a move back, once the shard is active there, it lets writes through, the clean-up
 * drops it where the table is free, and gc drops one a busy table kept, with the move's function.
 */
import { afterAll, describe, expect, it } from 'vitest';
import { init } from '../../src/commands/init.js';
import { move } from '../helpers/faults.js';
import { makeFleet, runCli } from '../helpers/fleet.js';
import { adminClient, useTestDatabases } from '../helpers/hosts.js';
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
