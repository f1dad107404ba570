/**
 * A move whose subscription cannot deliver, before the fence: the target's apply fails again and
 * again (a row the target holds already), or the subscription is dropped under the move. The wait
 * stops at once, naming the target and the shard, with nothing fenced; the move is resumed once the
 * cause is fixed, or aborted.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { init } from '../../src/commands/init.js';
import { moveShard } from '../../src/index.js';
import { type Fleet, makeFleet, runCli } from '../helpers/fleet.js';
import { useTestDatabases, withClient } from '../helpers/hosts.js';
import { failure, move, runSqlBlocking, seed } from '../helpers/faults.js';
import { lastMove, pastIncomingGuard, removeCliSnapshot, replicationObjects } from '../helpers/moves.js';

const db = useTestDatabases(2);
afterAll(removeCliSnapshot);

describe("a move's subscription that cannot deliver before the fence", () => {
  let fleet: Fleet;
  beforeAll(async () => {
    fleet = makeFleet({ urls: db.urls, shards: 3, split: ['0-2', ''] });
    expect((await init(await fleet.config())).ok).toBe(true);
  });

  /** Moves `shard` to pg2 in process, running `sql` (url, statement) pairs once `synced` is announced. */
  async function moveBreakingAt(shard: number, sql: [string, string][], waitTimeoutMs = 600_000) {
    const notices: string[] = [];
    const started = performance.now();
    const error = await moveShard(await fleet.config(), shard, 'pg2', {
      configFile: fleet.configFile,
      // By default longer than the test's own limit: the old wait ran into it, where the new one stops.
      waitTimeoutMs,
      onNotice: (message) => notices.push(message),
      onStep: (done) => {
        if (done !== 'synced') return;
        for (const [url, statement] of sql) expect(runSqlBlocking(url, statement), statement).toBe(0);
      },
    }).then(
      () => null,
      (e: Error & { code?: string; host?: string; shard?: number }) => e,
    );
    return { error, notices: notices.join('\n'), ms: performance.now() - started };
  }

  it('an apply that keeps failing (3 tries, nothing applied for a quarter of the wait) stops the catch-up, source writable and nothing fenced; fixed, --resume finishes the move', async () => {
    await withClient(db.urls[0]!, (c) => seed(c, 1, 400));
    // The target holds a row of the id the source writes next: its apply fails on the key, and the
    // subscription's worker is started again and fails again (every 500 ms on the test servers).
    const row = `insert into insta1.photos (id, user_id, image_url) values (1, 1, 'conflict')`;
    // Within a 20 s limit: stopped once 3 tries failed and nothing was applied for a quarter of it.
    const { error, notices, ms } = await moveBreakingAt(
      1,
      [
        [db.urls[1]!, pastIncomingGuard(row)],
        [db.urls[0]!, row],
      ],
      20_000,
    );
    expect(error?.code, error?.message).toBe('SYNC_FAILED');
    expect(error?.message).toMatch(
      /^host pg2, shard 1: applying the replicated changes failed \d+ times while waiting for the changes committed on pg1 to be applied, and nothing was applied for [5-9] s .*nothing is fenced\. Fix it and resume the move, or abort it/,
    );
    // The subscription whose errors the server log holds, to look them up by.
    expect(error?.message).toMatch(/in the errors of subscription "shardctl_move_\w+"/);
    expect(ms).toBeLessThan(20_000);
    expect(error).toMatchObject({ shard: 1 });
    expect(notices).not.toMatch(/fenced/);
    await withClient(db.urls[0]!, async (c) => {
      expect(await failure(c, `insert into insta1.photos (user_id, image_url) values (2, 'writable')`)).toBeNull();
      expect(await lastMove(c, 1)).toMatchObject({ step: 'synced', status: 'running' });
    });
    // The cause removed: the apply goes on, and the move with it.
    await withClient(db.urls[1]!, (c) => c.query(pastIncomingGuard(`delete from insta1.photos where id = 1`)));
    const resumed = await runCli(move(fleet, 1, '--resume', '--json'));
    expect(resumed.code, resumed.stderr).toBe(0);
    expect(JSON.parse(resumed.stdout)).toMatchObject({ outcome: 'moved', verification: { ok: true, rows: '702' } });
    await withClient(db.urls[1]!, async (c) => {
      const r = await c.query<{ image_url: string }>(`select image_url from insta1.photos where id = 1`);
      expect(r.rows).toEqual([{ image_url: 'conflict' }]);
    });
    expect(await replicationObjects(db.urls)).toEqual([]);
  });

  it('a subscription dropped under the move stops it at once with the advice to abort; --abort undoes it', async () => {
    await withClient(db.urls[0]!, (c) => seed(c, 0, 40));
    // Its slot is kept on the source (slot_name = none): the abort drops it.
    const drop = `do $$ declare s text; begin
      for s in select subname from pg_subscription where subdbid = (select oid from pg_database where datname = current_database()) loop
        execute format('alter subscription %I disable', s);
        execute format('alter subscription %I set (slot_name = none)', s);
        execute format('drop subscription %I', s);
      end loop; end $$`;
    const { error, ms } = await moveBreakingAt(0, [[db.urls[1]!, drop]]);
    expect(error?.code, error?.message).toBe('SUBSCRIPTION_GONE');
    expect(error?.message).toMatch(
      /^host pg2, shard 0: the move's subscription \S+ is gone .*Abort the move to undo it/,
    );
    // Seen within a second or two of the drop, not after the wait's limit.
    expect(ms).toBeLessThan(60_000);
    const aborted = await runCli(move(fleet, 0, '--abort'));
    expect(aborted.code, aborted.stderr).toBe(0);
    expect(await replicationObjects(db.urls)).toEqual([]);
    await withClient(db.urls[0]!, async (c) => {
      expect(await failure(c, `insert into insta0.photos (user_id, image_url) values (2, 'writable')`)).toBeNull();
      expect(await lastMove(c, 0)).toMatchObject({ status: 'aborted' });
    });
  });

  it('a subscription disabled under the move: the catch-up stops at its limit, saying so, nothing fenced; enabled again, --resume finishes the move', async () => {
    await withClient(db.urls[0]!, (c) => seed(c, 2, 40));
    const disable = `do $$ declare s text; begin
      for s in select subname from pg_subscription where subdbid = (select oid from pg_database where datname = current_database()) loop
        execute format('alter subscription %I disable', s);
      end loop; end $$`;
    const { error } = await moveBreakingAt(2, [[db.urls[1]!, disable]], 2_000);
    expect(error?.code, error?.message).toBe('CATCH_UP_TIMEOUT');
    expect(error?.message).toMatch(
      /^host pg2, shard 2: the changes committed on pg1 are still not applied after \d+ s \(.* of WAL behind; its apply worker is not running: its subscription is disabled\); nothing is fenced\. Resume the move to wait again, or abort it$/,
    );
    await withClient(db.urls[0]!, async (c) => {
      expect(await failure(c, `insert into insta2.photos (user_id, image_url) values (2, 'writable')`)).toBeNull();
      expect(await lastMove(c, 2)).toMatchObject({ step: 'synced', status: 'running' });
    });
    await withClient(db.urls[1]!, (c) => c.query(disable.replaceAll(' disable', ' enable')));
    const resumed = await runCli(move(fleet, 2, '--resume', '--json'));
    expect(resumed.code, resumed.stderr).toBe(0);
    expect(JSON.parse(resumed.stdout)).toMatchObject({ outcome: 'moved', verification: { ok: true } });
    expect(await replicationObjects(db.urls)).toEqual([]);
  });
});
