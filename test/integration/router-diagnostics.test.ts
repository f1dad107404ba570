import diagnosticsChannel from 'node:diagnostics_channel';
import { describe, expect, it } from 'vitest';
import { init } from '../../src/commands/init.js';
import { moveShard } from '../../src/commands/move-shard.js';
import {
  CALL_CHANNEL,
  RouterDiagnostics,
  SLOW_CALL_CHANNEL,
  type RouterCallEvent,
  type SlowCallEvent,
} from '../../src/router/diagnostics.js';
import { ShardRouter } from '../../src/router/router.js';
import { makeFleet } from '../helpers/fleet.js';
import { useTestDatabases } from '../helpers/hosts.js';

const PHOTOS_ONLY = {
  '0001_photos.sql': `CREATE SEQUENCE photos_id_seq;
CREATE TABLE photos (id bigint PRIMARY KEY DEFAULT next_id('photos_id_seq'), user_id bigint NOT NULL, image_url text NOT NULL);
ALTER SEQUENCE photos_id_seq OWNED BY photos.id;`,
};

describe('ShardRouter diagnostics', () => {
  const db = useTestDatabases(2);

  it('a subscriber sees the events of a call that followed a move (attempts, the retried SC100, the follow), and stats() counts per host', async () => {
    const fleet = makeFleet({
      urls: db.urls,
      shards: 4,
      split: ['0-1', '2-3'],
      schemaPrefix: 'dg',
      migrations: PHOTOS_ONLY,
    });
    const config = await fleet.config();
    expect((await init(config)).ok).toBe(true);
    const router = await ShardRouter.open(fleet.configFile, { poolSize: 2 });
    const events: RouterCallEvent[] = [];
    const listener = (message: unknown) => events.push(message as RouterCallEvent);
    try {
      await router.withKey(1n, (c) => c.query(`insert into photos (user_id, image_url) values ($1, 'a')`, [1]));
      // Nobody listened: no event, but the call was counted.
      expect(events).toEqual([]);
      expect(router.stats().find((s) => s.host === 'pg1')).toMatchObject({ calls: 1, errors: 0, follows: 0 });

      // The router's map still says pg1 for shard 1.
      expect((await moveShard(config, 1, 'pg2', { configFile: fleet.configFile })).outcome).toBe('moved');
      diagnosticsChannel.subscribe(CALL_CHANNEL, listener);
      await router.withKey(1n, (c) => c.query(`insert into photos (user_id, image_url) values ($1, 'b')`, [1]));
      expect(events).toHaveLength(1);
      const event = events[0]!;
      expect(event).toMatchObject({
        shard: 1,
        host: 'pg2',
        ok: true,
        attempts: 2,
        follows: [{ from: 'pg1', to: 'pg2' }],
      });
      expect(event.retried).toEqual([expect.objectContaining({ host: 'pg1', code: 'SC100' })]);
      expect(event.durationMs).toBeGreaterThan(0);
      expect(event.poolWaitMs).toBeGreaterThanOrEqual(0);
      expect(event.poolWaitMs).toBeLessThanOrEqual(event.durationMs);
      expect(event.fenceWaits).toBe(0);

      // A failing call: its error, on the host it ran on.
      await expect(router.withKey(2n, (c) => c.query('select 1 / $1::int', [0]))).rejects.toMatchObject({
        code: '22012',
      });
      expect(events[1]).toMatchObject({ shard: 2, host: 'pg2', ok: false, attempts: 1, error: { code: '22012' } });

      const stats = router.stats();
      expect(stats.map((s) => [s.host, s.calls, s.errors, s.follows])).toEqual([
        ['pg1', 1, 0, 1],
        ['pg2', 2, 1, 0],
      ]);
      for (const s of stats) {
        expect(s.poolSize).toBeGreaterThanOrEqual(1);
        expect(s.idle).toBe(s.poolSize);
        expect(s.waiting).toBe(0);
      }
    } finally {
      diagnosticsChannel.unsubscribe(CALL_CHANNEL, listener);
      await router.close();
    }
  });
});

describe('ShardRouter diagnostics', () => {
  const db = useTestDatabases(2);

  it('a round trip of several shards (queryPage, queryEachShard) publishes one event naming all its shards and its host', async () => {
    const fleet = makeFleet({
      urls: db.urls,
      shards: 8,
      split: ['0-3', '4-7'],
      schemaPrefix: 'dr',
      migrations: PHOTOS_ONLY,
    });
    expect((await init(await fleet.config())).ok).toBe(true);
    const router = await ShardRouter.open(fleet.configFile, { poolSize: 2 });
    const events: RouterCallEvent[] = [];
    const listener = (message: unknown) => events.push(message as RouterCallEvent);
    diagnosticsChannel.subscribe(CALL_CHANNEL, listener);
    try {
      // perHost 1: each host's shards after the first (the probe, a call of its own) go in one round trip.
      const trips = { shardsPerQuery: 8, perHost: 1 } as const;
      await router.queryPage('select id from photos', { limit: 5, ...trips });
      await router.queryEachShard('select $1::int as n', { params: [1], readOnly: true, ...trips });
      await router.queryEachShard('select 1 as n', { readOnly: true, ...trips });
      // With parameters (queryPage, queryEachShard) the text is known to give one result per shard:
      // each host's shards go in one round trip. Without them, the run's first shard runs alone
      // first (a call of its own, its event without `shards`) to learn how many results the text gives.
      // (The hosts run at once: compared in a sorted order.)
      const sorted = (rows: unknown[]) => rows.map((r) => JSON.stringify(r)).sort();
      expect(sorted(events.map((e) => [e.shard, e.shards ?? null, e.host, e.ok, e.attempts]))).toEqual(
        sorted([
          [0, [0, 1, 2, 3], 'pg1', true, 1],
          [4, [4, 5, 6, 7], 'pg2', true, 1],
          [0, [0, 1, 2, 3], 'pg1', true, 1],
          [4, [4, 5, 6, 7], 'pg2', true, 1],
          [0, null, 'pg1', true, 1],
          [1, [1, 2, 3], 'pg1', true, 1],
          [4, [4, 5, 6, 7], 'pg2', true, 1],
        ]),
      );
    } finally {
      diagnosticsChannel.unsubscribe(CALL_CHANNEL, listener);
      await router.close();
    }
  });
});

describe('ShardRouter diagnostics', () => {
  const db = useTestDatabases(2);

  it('a call waiting past slowCallMs logs one warning naming its shard, host and what it waits for', async () => {
    const fleet = makeFleet({
      urls: db.urls,
      shards: 4,
      split: ['0-1', '2-3'],
      schemaPrefix: 'ds',
      migrations: PHOTOS_ONLY,
    });
    expect((await init(await fleet.config())).ok).toBe(true);
    const router = await ShardRouter.open(fleet.configFile, { poolSize: 1, slowCallMs: 200 });
    const warnings: Error[] = [];
    const onWarning = (w: Error) => warnings.push(w);
    const slow: SlowCallEvent[] = [];
    const onSlow = (m: unknown) => slow.push(m as SlowCallEvent);
    process.on('warning', onWarning);
    diagnosticsChannel.subscribe(SLOW_CALL_CHANNEL, onSlow);
    try {
      // The pool's one connection opened first: the holder below gets it at once, so the only wait
      // its slow-call event can name is its own fn's, however long a connection takes to open here.
      await router.withShard(0, (c) => c.query('select 1'));
      // (Opening it may itself have been a slow call: not counted below.)
      await new Promise((resolve) => setImmediate(resolve));
      slow.length = 0;
      warnings.length = 0;
      // The only connection to pg1 is held for 600 ms; a second call on pg1 waits for it.
      let release!: () => void;
      const held = router.withShard(0, async (c) => {
        await c.query('select $1::int', [1]);
        await new Promise<void>((resolve) => (release = resolve));
      });
      await expect
        .poll(() => router.stats().find((s) => s.host === 'pg1')?.idle === 0 && release !== undefined)
        .toBe(true);
      const waiting = router.withShard(1, (c) => c.query('select $1::int', [1]));
      await expect.poll(() => slow.some((e) => e.shard === 1), { timeout: 5_000 }).toBe(true);
      expect(router.stats().find((s) => s.host === 'pg1')?.waiting).toBe(1);
      release();
      await held;
      await waiting;
      // One event per slow call: the holder waits on its own fn (the server's side of the call), the other for a connection.
      expect(slow.map((e) => [e.shard, e.host, e.waitingFor])).toEqual([
        [0, 'pg1', 'the transaction (fn and its statements)'],
        [1, 'pg1', 'a pooled connection'],
      ]);
      await expect
        .poll(() => warnings.filter((w) => (w as { code?: string }).code === 'SHARDCTL_SLOW_CALL').length)
        .toBe(2);
      const mine = warnings.filter((w) => (w as { code?: string }).code === 'SHARDCTL_SLOW_CALL').map((w) => w.message);
      // The holder (waiting for the server, i.e. its fn) and the waiter: one warning each.
      expect(
        mine.some((m) =>
          /^shardctl: a call on shard 1 on host pg1 has taken \d+ ms; it is waiting for a pooled connection/.test(m),
        ),
      ).toBe(true);
      expect(
        mine.some((m) =>
          /^shardctl: a call on shard 0 on host pg1 has taken \d+ ms; it is waiting for the transaction \(fn and its statements\)/.test(
            m,
          ),
        ),
      ).toBe(true);
    } finally {
      process.off('warning', onWarning);
      diagnosticsChannel.unsubscribe(SLOW_CALL_CHANNEL, onSlow);
      await router.close();
    }
  });
});

describe('ShardRouter diagnostics', () => {
  it('builds no trace when nobody subscribes and no bound is set', () => {
    expect(new RouterDiagnostics(0).begin(3)).toBeUndefined();
    const listener = () => undefined;
    diagnosticsChannel.subscribe(CALL_CHANNEL, listener);
    try {
      expect(new RouterDiagnostics(0).begin(3)).toBeDefined();
    } finally {
      diagnosticsChannel.unsubscribe(CALL_CHANNEL, listener);
    }
  });
});
