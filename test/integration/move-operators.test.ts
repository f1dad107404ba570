/**
 * Two operators at once on the same move: a killed move resumed (or aborted) from two terminals.
 * The second run read the move's record before the first took the runner lock; once it gets the
 * lock the first has finished the move, and the second must not carry on from what it read.
 */
import { readFileSync, writeFileSync } from 'node:fs';
import type pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { gc } from '../../src/commands/gc.js';
import { init } from '../../src/commands/init.js';
import { loadConfig } from '../../src/config/load.js';
import { ShardRouter } from '../../src/router/router.js';
import { killedAfter, move, seed } from '../helpers/faults.js';
import { type Fleet, makeFleet, runCli } from '../helpers/fleet.js';
import { adminClient, useTestDatabases } from '../helpers/hosts.js';
import { lastMove, removeCliSnapshot, schemaFingerprint, shardRow, spawnCli, startCli } from '../helpers/moves.js';

const db = useTestDatabases(2);
afterAll(removeCliSnapshot);

/** Holds the runner lock of a host from the test until released: runs queue behind it. */
async function holdRunnerLock(client: pg.Client): Promise<() => Promise<void>> {
  await client.query('BEGIN; LOCK TABLE shardctl.runner_lock IN SHARE UPDATE EXCLUSIVE MODE');
  return async () => {
    await client.query('COMMIT');
  };
}

/** Waits until `count` sessions wait for the runner lock of the host. */
async function waitForLockWaiters(client: pg.Client, count: number): Promise<void> {
  const deadline = Date.now() + 60_000;
  for (;;) {
    const r = await client.query<{ n: number }>(
      `select count(*)::int as n from pg_locks where relation = 'shardctl.runner_lock'::regclass and not granted`,
    );
    if (r.rows[0]!.n >= count) return;
    if (Date.now() > deadline) throw new Error(`${count} runs never queued for the runner lock`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

/** The logical replication subscriptions of the host's database. */
async function subscriptions(client: pg.Client): Promise<string[]> {
  const r = await client.query<{ subname: string }>(
    'select subname from pg_subscription where subdbid = (select oid from pg_database where datname = current_database())',
  );
  return r.rows.map((row) => row.subname);
}

describe('two operators finishing the same killed move', () => {
  let fleet: Fleet;
  let source: pg.Client;
  let target: pg.Client;
  let locker: pg.Client;

  beforeAll(async () => {
    fleet = makeFleet({ urls: db.urls, shards: 8, split: ['0-3', '4-7'], extra: 'lockTimeout: 60s' });
    expect((await init(await fleet.config())).ok).toBe(true);
    source = await adminClient(db.urls[0]!);
    target = await adminClient(db.urls[1]!);
    locker = await adminClient(db.urls[0]!);
  });

  afterAll(async () => {
    await source?.end();
    await target?.end();
    await locker?.end();
  });

  it.each([
    ['copied', '--resume', '--resume', 1],
    ['subscribed', '--resume', '--abort', 2],
    ['target-created', '--abort', '--resume', 3],
  ] as const)(
    'killed after %s, %s and %s at once: one finishes it, the other changes nothing and the move stays finished',
    async (step, first, second, shard) => {
      await seed(source, shard, 400);
      await killedAfter(fleet, shard, step);
      const before = await lastMove(source, shard);
      expect(before?.status).toBe('running');

      // Both runs read the move's record, then queue for the runner lock the test holds.
      const release = await holdRunnerLock(locker);
      const runs = [await startCli(move(fleet, shard, first)), await startCli(move(fleet, shard, second))];
      try {
        await waitForLockWaiters(source, 2);
      } finally {
        await release();
      }
      // A run that carries on a finished move waits minutes for a subscription that cannot start.
      const timer = setTimeout(() => runs.forEach((r) => r.child.kill('SIGKILL')), 60_000);
      const ended = await Promise.all(runs.map((r) => r.done));
      clearTimeout(timer);
      const outcome = ended.map((r) => `exit ${r.code}: ${r.stdout}\n${r.stderr}`).join('\n---\n');

      // The move is finished on both hosts, as the run that got the lock first left it.
      const onSource = await lastMove(source, shard);
      const onTarget = await lastMove(target, shard);
      expect(onSource?.moveId, outcome).toBe(before!.moveId);
      expect(onTarget?.moveId, outcome).toBe(before!.moveId);
      expect(onSource?.status, outcome).not.toBe('running');
      expect(onTarget?.status, outcome).toBe(onSource?.status);
      const holder = onSource!.status === 'done' ? target : source;
      const other = holder === target ? source : target;
      expect((await shardRow(holder, shard))?.state, outcome).toBe('active');
      expect((await shardRow(other, shard))?.state ?? 'none', outcome).not.toBe('active');
      const rows = await schemaFingerprint(holder, `insta${shard}`);
      expect(rows['photos'], outcome).toMatch(/^400 /);
      // One run did the work; the other found nothing left to do and said so.
      expect(
        ended.map((r) => r.signal),
        outcome,
      ).toEqual([null, null]);
      expect(ended.map((r) => r.code).sort(), outcome).toEqual([0, 1]);
      expect(ended.find((r) => r.code === 1)!.stderr, outcome).toContain('finished or undone by another run');
      expect(await subscriptions(target), outcome).toEqual([]);

      const status = await runCli(['status', '-c', fleet.configFile]);
      expect(status.code, `${outcome}\n${status.stdout}${status.stderr}`).toBe(0);
    },
    180_000,
  );
});

describe('two operators moving shards in opposite directions at once', () => {
  const pair = useTestDatabases(2);

  it('pg1 → pg2 and pg2 → pg1 started together: the second waits for the first, both succeed', async () => {
    const fleet = makeFleet({ urls: pair.urls, shards: 4, split: ['0-1', '2-3'], extra: 'lockTimeout: 20s' });
    expect((await init(await fleet.config())).ok).toBe(true);
    const lockers = await Promise.all(pair.urls.map((url) => adminClient(url)));
    try {
      // Both runs queue behind the test's locks: one for pg1's lock, the other for pg2's (the
      // first host each of them locks, in its own order of hosts), then go at once.
      const releases = await Promise.all(lockers.map((c) => holdRunnerLock(c)));
      const runs = [await startCli(move(fleet, 1, '--to', 'pg2')), await startCli(move(fleet, 2, '--to', 'pg1'))];
      try {
        const deadline = Date.now() + 60_000;
        for (;;) {
          const waiting = await Promise.all(
            lockers.map(
              async (c) =>
                (
                  await c.query<{ n: number }>(
                    `select count(*)::int as n from pg_locks where relation = 'shardctl.runner_lock'::regclass and not granted`,
                  )
                ).rows[0]!.n,
            ),
          );
          if (waiting[0]! + waiting[1]! >= 2) break;
          if (Date.now() > deadline) throw new Error('the moves never queued for the runner locks');
          await new Promise((resolve) => setTimeout(resolve, 50));
        }
      } finally {
        await Promise.all(releases.map((release) => release()));
      }
      const outcome = await bothSucceed(runs);
      expect((await shardRow(lockers[1]!, 1))?.state, outcome).toBe('active');
      expect((await shardRow(lockers[0]!, 2))?.state, outcome).toBe('active');
    } finally {
      await Promise.all(lockers.map((c) => c.end()));
    }
  }, 180_000);
});

describe('gc and migrate queued behind a move', () => {
  const pair = useTestDatabases(2);
  const trio = useTestDatabases(2);
  const ownEnv = useTestDatabases(2);

  /**
   * Moves shard 1 to pg2 with `command` queued behind the move for pg1's runner lock (it read the
   * file before the move rewrote it); both must succeed. Then `check` with a client of pg1.
   */
  async function queuedBehindMove(
    urls: readonly string[],
    command: string[],
    prepare: (fleet: Fleet) => void,
    check: (locker: pg.Client, outcome: string) => Promise<void>,
  ): Promise<void> {
    const fleet = makeFleet({ urls, shards: 4, split: ['0-1', '2-3'], extra: 'lockTimeout: 30s' });
    expect((await init(await fleet.config())).ok).toBe(true);
    prepare(fleet);
    const locker = await adminClient(urls[0]!);
    try {
      const release = await holdRunnerLock(locker);
      let runs;
      try {
        const moving = await startCli(move(fleet, 1, '--to', 'pg2'));
        await waitForLockWaiters(locker, 1);
        const queued = await startCli([...command, '-c', fleet.configFile]);
        await waitForLockWaiters(locker, 2);
        runs = [moving, queued];
      } finally {
        await release();
      }
      await check(locker, await bothSucceed(runs));
    } finally {
      await locker.end();
    }
  }

  it('gc runs once the move has switched and rewritten the file, instead of calling the file stale', async () => {
    await queuedBehindMove(
      pair.urls,
      ['gc', '--yes'],
      () => undefined,
      async (locker, outcome) => {
        // gc dropped the old copy the move left on pg1.
        expect((await shardRow(locker, 1)) ?? 'dropped', outcome).toBe('dropped');
      },
    );
  }, 180_000);

  // The library's gc over a config loaded with an environment of the caller's own (the hosts'
  // password in a ${VAR} the process does not have), queued behind a move: it read its file again
  // with the process's environment to see whether the move had rewritten it, could not, and
  // called its map stale. It now sees that the fleet moved on while it waited.
  it('gc from the library, its config loaded with an environment of its own, runs once the move has switched', async () => {
    const fleet = makeFleet({ urls: ownEnv.urls, shards: 4, split: ['0-1', '2-3'], extra: 'lockTimeout: 30s' });
    expect((await init(await fleet.config())).ok).toBe(true);
    const password = new URL(ownEnv.urls[0]!).password;
    expect(password).not.toBe('');
    const text = readFileSync(fleet.configFile, 'utf8');
    writeFileSync(fleet.configFile, text.split(`:${password}@`).join(':${GC_QUEUED_SECRET}@'));
    expect(process.env.GC_QUEUED_SECRET).toBeUndefined();
    const env = { GC_QUEUED_SECRET: password };
    const config = await loadConfig(fleet.configFile, { env });
    const locker = await adminClient(ownEnv.urls[0]!);
    try {
      const release = await holdRunnerLock(locker);
      let moving;
      let queued: Promise<Awaited<ReturnType<typeof gc>> | Error>;
      try {
        moving = await startCli(move(fleet, 1, '--to', 'pg2'), env);
        await waitForLockWaiters(locker, 1);
        queued = gc(config).catch((error: unknown) => error as Error);
        await waitForLockWaiters(locker, 2);
      } finally {
        await release();
      }
      const moved = await moving.done;
      expect(moved.code, `${moved.stdout}\n${moved.stderr}`).toBe(0);
      const collected = await queued;
      if (collected instanceof Error) throw collected;
      // gc dropped the old copy the move left on pg1, and kept every shard where the fleet has it.
      expect(collected.oldCopies.map((c) => [c.host, c.shard])).toEqual([['pg1', 1]]);
      expect((await shardRow(locker, 1)) ?? 'dropped').toBe('dropped');
      expect((await shardRow(locker, 0))?.state).toBe('active');
    } finally {
      await locker.end();
    }
  }, 180_000);

  it('migrate runs once the move has switched and rewritten the file, applying the new file on every shard where it now is', async () => {
    await queuedBehindMove(
      trio.urls,
      ['migrate'],
      (fleet) => fleet.writeMigration('0100_queued.sql', 'alter table photos add column queued int'),
      async (locker, outcome) => {
        const withColumn = async (c: pg.Client) =>
          (
            await c.query<{ s: string }>(
              `select table_schema as s from information_schema.columns where column_name = 'queued' order by 1`,
            )
          ).rows.map((row) => row.s);
        // The moved shard got the column on pg2, where it is now; the others where they were.
        expect(await withColumn(locker), outcome).toEqual(['insta0']);
        const other = await adminClient(trio.urls[1]!);
        try {
          expect(await withColumn(other), outcome).toEqual(['insta1', 'insta2', 'insta3']);
        } finally {
          await other.end();
        }
      },
    );
  }, 180_000);
});

// A router that makes no call to a shard while it moves away from a host, is collected by gc, and
// starts moving back. With its map refreshed in the background, it no longer names the first host,
// so its write goes to the shard's current copy. Without the refresh it still places the shard on
// the first host, where the move back is building an incoming copy: the copy's guard refuses the
// write (SC100 naming the current holder, as a fence), and the router writes there instead; before
// the guard, the write landed in the incoming copy, was acknowledged and was lost by the resumed copy.
describe.each([
  ['refreshed in the background', 200],
  ['never refreshed (mapRefreshMs 0)', 0],
])('a router idle through a move and gc, while the shard moves back, its map %s', (_, mapRefreshMs) => {
  const pair = useTestDatabases(2);

  it("writes to the shard's current copy, never into the incoming one: the acknowledged row is there at the end", async () => {
    const fleet = makeFleet({ urls: pair.urls, shards: 4, split: ['0-1', '2-3'] });
    expect((await init(await fleet.config())).ok).toBe(true);
    await expect(ShardRouter.open(fleet.configFile, { mapRefreshMs: -1 })).rejects.toThrow(
      'mapRefreshMs -1: must be a whole number of milliseconds',
    );
    const first = await adminClient(pair.urls[0]!);
    const router = await ShardRouter.open(fleet.configFile, { mapRefreshMs });
    try {
      const insert = async (label: string) =>
        (
          await router.withKey(1n, (client) =>
            client.query<{ id: string }>(`insert into photos (user_id, image_url) values (1, $1) returning id::text`, [
              label,
            ]),
          )
        ).rows[0]!.id;
      await insert('before');
      const cli = async (...args: string[]) => {
        const run = await runCli([...args, '-c', fleet.configFile]);
        expect(run.code, `${args.join(' ')}: ${run.stdout}${run.stderr}`).toBe(0);
      };
      await cli('move-shard', '1', '--to', 'pg2', '--yes');
      if (mapRefreshMs > 0) {
        // No call for shard 1 meanwhile: the background refresh alone learns where it went.
        for (let i = 0; i < 50 && router.hostForShard(1).name !== 'pg2'; i++)
          await new Promise((r) => setTimeout(r, 100));
        expect(router.hostForShard(1).name).toBe('pg2');
      }
      await cli('gc', '--yes');
      // The move back stops after building its incoming copy on pg1 (a killed run).
      const killed = await spawnCli(move(fleet, 1, '--to', 'pg1'), {
        SHARDCTL_FAULT_AFTER_STEP: 'target-created',
      });
      expect(killed.signal, killed.stderr).toBe('SIGKILL');
      expect((await shardRow(first, 1))?.state).toBe('incoming');
      // Any write to the incoming copy, a superuser's included, is refused naming the holder.
      await expect(
        first.query(`insert into insta1.photos (user_id, image_url) values (1, 'by hand')`),
      ).rejects.toMatchObject({ code: 'SC100', message: expect.stringContaining('shard 1 has moved to host pg2') });
      // So is an application role's, which may not read the control schema (the guard can).
      const app = `incoming_app_${mapRefreshMs}`;
      await first.query(`create role ${app}`);
      try {
        await first.query(
          `grant usage on schema insta1 to ${app}; grant insert on insta1.photos to ${app}; grant usage on all sequences in schema insta1 to ${app}`,
        );
        await first.query(`begin; set local role ${app}`);
        await expect(
          first.query(`insert into insta1.photos (user_id, image_url) values (1, 'by the app')`),
        ).rejects.toMatchObject({ code: 'SC100' });
      } finally {
        await first.query('rollback');
        await first.query(`drop owned by ${app}; drop role ${app}`);
      }
      if (mapRefreshMs === 0) expect(router.hostForShard(1).name).toBe('pg1');

      const written = await insert('during');
      expect(router.hostForShard(1).name).toBe('pg2');
      await cli('move-shard', '1', '--resume', '--yes');
      const rows = await first.query<{ image_url: string }>(`select image_url from insta1.photos order by id`);
      expect(
        rows.rows.map((r) => r.image_url),
        `row ${written}`,
      ).toEqual(['before', 'during']);
      // Active again on pg1: the guard is gone, and so is its function.
      await first.query(`insert into insta1.photos (user_id, image_url) values (1, 'after')`);
      const left = await first.query(
        `select tgname from pg_trigger where tgname = 'shardctl_incoming'
           union all select proname from pg_proc where proname like 'shardctl\\_move\\_%\\_incoming'`,
      );
      expect(left.rows).toEqual([]);
    } finally {
      await router.close();
      await first.end();
    }
  }, 180_000);
});

/** Waits for both runs; each must exit 0. What they printed, for the assertions that follow. */
async function bothSucceed(
  runs: readonly { done: Promise<{ code: number | null; stdout: string; stderr: string }> }[],
) {
  const ended = await Promise.all(runs.map((r) => r.done));
  const outcome = ended.map((r) => `exit ${r.code}: ${r.stdout}\n${r.stderr}`).join('\n---\n');
  expect(
    ended.map((r) => r.code),
    outcome,
  ).toEqual([0, 0]);
  return outcome;
}
