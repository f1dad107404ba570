import diagnosticsChannel from 'node:diagnostics_channel';
import type pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { init } from '../../src/commands/init.js';
import { moveShard } from '../../src/commands/move-shard.js';
import { CALL_CHANNEL, type RouterCallEvent } from '../../src/router/diagnostics.js';
import { parseLsn } from '../../src/router/replicas.js';
import { loadConfig } from '../../src/config/load.js';
import { ShardRouter } from '../../src/router/router.js';
import { makeFleet } from '../helpers/fleet.js';
import { useTestDatabases, withClient } from '../helpers/hosts.js';
import { startReplicatedHost, type ReplicatedHost } from '../helpers/standby.js';
import { startTcpProxy, timed } from '../helpers/tcp-proxy.js';
import { startPgBouncer, statementsLeft } from '../helpers/pgbouncer.js';
import { readFileSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';

const PHOTOS_ONLY = {
  '0001_photos.sql': `CREATE SEQUENCE photos_id_seq;
CREATE TABLE photos (id bigint PRIMARY KEY DEFAULT next_id('photos_id_seq'), user_id bigint NOT NULL, image_url text NOT NULL);
ALTER SEQUENCE photos_id_seq OWNED BY photos.id;`,
};

/** The standby's hostTimeout in the proxied router's map. */
const BOUND_MS = 2000;

interface Seen {
  inRecovery: boolean;
  rows: number;
}

/** What a read saw: whether it ran on a standby, and how many rows of `id` it found. */
function readBack(id: string) {
  return async (client: pg.PoolClient): Promise<Seen> => {
    const r = await client.query<{ in_recovery: boolean; rows: number }>(
      'SELECT pg_catalog.pg_is_in_recovery() AS in_recovery, (SELECT count(*) FROM photos WHERE id = $1)::int AS rows',
      [id],
    );
    return { inRecovery: r.rows[0]!.in_recovery, rows: r.rows[0]!.rows };
  };
}

describe('reads from replicas (PostgreSQL 15 primary and streaming standby)', () => {
  let host: ReplicatedHost;
  let router: ShardRouter;
  let configFile: string;

  beforeAll(async () => {
    host = await startReplicatedHost();
    await withClient(host.primary.url, (c) => c.query('create database fleet'));
    const url = host.multiHostUrl('fleet');
    const fleet = makeFleet({
      urls: [url],
      replicationUrls: [url],
      shards: 4,
      schemaPrefix: 'rr',
      migrations: PHOTOS_ONLY,
    });
    expect((await init(await fleet.config())).ok).toBe(true);
    await host.caughtUp();
    configFile = fleet.configFile;
    router = await ShardRouter.open(fleet.configFile, { poolSize: 2, trackWriteLsn: true });
  }, 180_000);

  afterAll(async () => {
    await router?.close();
    await host?.dispose();
  });

  const standbyUrl = (): string => host.standby.url.replace(/\/postgres$/, '/fleet');
  const stats = () => router.stats().find((s) => s.host === 'pg1')!;
  const insert = (key: bigint) =>
    router.withKey(key, async (client) => {
      const r = await client.query<{ id: string }>(
        `insert into photos (user_id, image_url) values ($1, 'x') returning id`,
        [key.toString()],
      );
      return r.rows[0]!.id;
    });

  it('without replica: true every read runs on the primary, readOnly or not', async () => {
    const before = stats();
    const id = await insert(1n);
    const seen = await router.withKey(1n, readBack(id), { readOnly: true });
    expect(seen).toEqual({ inRecovery: false, rows: 1 });
    const all = await router.forEachShard(
      async (client) => (await client.query('SELECT pg_catalog.pg_is_in_recovery() AS r')).rows[0].r as boolean,
      { readOnly: true },
    );
    expect(all.map((r) => r.value)).toEqual([false, false, false, false]);
    expect(stats().replicaReads).toBe(before.replicaReads);
    expect(stats().replicaFallbacks).toBe(before.replicaFallbacks);
  });

  it("a read given a write's LSN runs on the standby and sees the write", async () => {
    const id = await insert(2n);
    const shard = router.shardForKey(2n);
    const lsn = router.lastWriteLsn(shard);
    expect(lsn?.host).toBe('pg1');
    expect(lsn?.lsn).toMatch(/^[0-9A-F]+\/[0-9A-F]+$/);
    const before = stats().replicaReads;
    const seen = await router.withKey(2n, readBack(id), {
      readOnly: true,
      replica: true,
      afterLsn: lsn,
      replicaWaitMs: 10_000,
    });
    expect(seen).toEqual({ inRecovery: true, rows: 1 });
    expect(stats().replicaReads).toBe(before + 1);
    // A write whose COMMIT goes with its only query (one round trip) carries its LSN back too.
    const pipelined = await router.withKey(2n, (client) =>
      client.query<{ id: string }>(`insert into photos (user_id, image_url) values ($1, 'y') returning id`, ['2']),
    );
    const later = router.lastWriteLsn(shard)!;
    expect(parseLsn(later.lsn)! > parseLsn(lsn!.lsn)!).toBe(true);
    expect(
      await router.withKey(2n, readBack(pipelined.rows[0]!.id), {
        readOnly: true,
        replica: true,
        afterLsn: later,
        replicaWaitMs: 10_000,
      }),
    ).toEqual({ inRecovery: true, rows: 1 });
    // A text without parameters (BEGIN, the text and COMMIT in one round trip) too; its result is the text's.
    const script = await router.queryEachShard(`insert into photos (user_id, image_url) values (2, 'z')`, {
      shards: [shard],
    });
    expect(script[0]!.value.command).toBe('INSERT');
    expect(parseLsn(router.lastWriteLsn(shard)!.lsn)! > parseLsn(later.lsn)!).toBe(true);
    // The fan-out and a page read there too.
    const fan = await router.queryEachShard<{ r: boolean }>('SELECT pg_catalog.pg_is_in_recovery() AS r', {
      readOnly: true,
      replica: true,
      afterLsn: lsn,
      replicaWaitMs: 10_000,
      shardsPerQuery: 4,
    });
    expect(fan.map((r) => r.value.rows[0]!.r)).toEqual([true, true, true, true]);
    const page = await router.queryPage<{ id: bigint }>('SELECT id FROM photos', {
      limit: 10,
      replica: true,
      afterLsn: lsn,
      replicaWaitMs: 10_000,
    });
    expect(page.rows.map((r) => r.id.toString())).toContain(id);
  });

  it('a round trip of several shards says where it ran: on the standby, or on the primary in round trips still when the host has no standby, its shards counted as fallbacks', async () => {
    const events: RouterCallEvent[] = [];
    const listener = (event: unknown): void => void events.push(event as RouterCallEvent);
    diagnosticsChannel.subscribe(CALL_CHANNEL, listener);
    // The same host by its primary's address alone: no standby known to that router.
    const loaded = await loadConfig(configFile);
    const primaryOnly = ShardRouter.fromConfig(
      { ...loaded, hosts: [{ ...loaded.hosts[0]!, url: host.primary.url.replace(/\/postgres$/, '/fleet') }] },
      { poolSize: 2 },
    );
    try {
      const read = { readOnly: true, replica: true, shardsPerQuery: 4, maxLagMs: 60_000 } as const;
      const onStandby = await router.queryEachShard<{ r: boolean }>('SELECT pg_catalog.pg_is_in_recovery() AS r', read);
      expect(onStandby.map((r) => r.value.rows[0]!.r)).toEqual([true, true, true, true]);
      // The first shard alone (what the query gives), then the others in round trips of several.
      expect(events.map((e) => e.replica)).toEqual(events.map(() => 'standby'));
      expect(events.flatMap((e) => e.shards ?? [e.shard]).sort()).toEqual([0, 1, 2, 3]);
      const trip = events.find((e) => (e.shards?.length ?? 0) > 1);
      expect(trip).toMatchObject({ host: 'pg1', ok: true });
      expect(typeof trip!.poolWaitMs).toBe('number');
      events.length = 0;
      const fallbacks = primaryOnly.stats()[0]?.replicaFallbacks ?? 0;
      const onPrimary = await primaryOnly.queryEachShard<{ r: boolean }>(
        'SELECT pg_catalog.pg_is_in_recovery() AS r',
        read,
      );
      expect(onPrimary.map((r) => r.value.rows[0]!.r)).toEqual([false, false, false, false]);
      expect(events.map((e) => e.replica)).toEqual(events.map(() => 'no-standby'));
      expect(events.flatMap((e) => e.shards ?? [e.shard]).sort()).toEqual([0, 1, 2, 3]);
      expect(events.some((e) => (e.shards?.length ?? 0) > 1)).toBe(true);
      const after = primaryOnly.stats()[0]!;
      expect(after.replicaFallbacks - fallbacks).toBe(4);
      expect(after.replicaFallbackReasons['no-standby']).toBe(4);
    } finally {
      diagnosticsChannel.unsubscribe(CALL_CHANNEL, listener);
      await primaryOnly.close();
    }
  });

  it('a standby whose replay is paused: the call falls back to the primary, or waits for the LSN within its bound', async () => {
    await withClient(standbyUrl(), (c) => c.query('SELECT pg_catalog.pg_wal_replay_pause()'));
    try {
      const id = await insert(3n);
      const lsn = router.lastWriteLsn(router.shardForKey(3n))!;
      // Received but not replayed: the standby knows it is behind.
      for (let i = 0; i < 300; i += 1) {
        const received = await withClient(
          standbyUrl(),
          async (c) =>
            (await c.query<{ ok: boolean }>('SELECT pg_last_wal_receive_lsn() >= $1::pg_lsn AS ok', [lsn.lsn])).rows[0]!
              .ok,
        );
        if (received) break;
        await new Promise((resolve) => setTimeout(resolve, 20));
      }
      const before = stats();
      const behind = await router.withKey(3n, readBack(id), {
        readOnly: true,
        replica: true,
        afterLsn: lsn,
        replicaWaitMs: 50,
      });
      expect(behind).toEqual({ inRecovery: false, rows: 1 });
      const lagging = await router.withKey(3n, readBack(id), { readOnly: true, replica: true, maxLagMs: 0 });
      expect(lagging).toEqual({ inRecovery: false, rows: 1 });
      const after = stats();
      expect(after.replicaFallbackReasons.behind ?? 0).toBe((before.replicaFallbackReasons.behind ?? 0) + 1);
      expect(after.replicaFallbackReasons.lagging ?? 0).toBe((before.replicaFallbackReasons.lagging ?? 0) + 1);
      expect(after.replicaReads).toBe(before.replicaReads);

      // Waiting: the call polls the standby until it has replayed the LSN (resumed meanwhile).
      const waiting = router.withKey(3n, readBack(id), {
        readOnly: true,
        replica: true,
        afterLsn: lsn,
        replicaWaitMs: 60_000,
      });
      await new Promise((resolve) => setTimeout(resolve, 300));
      await withClient(standbyUrl(), (c) => c.query('SELECT pg_catalog.pg_wal_replay_resume()'));
      expect(await waiting).toEqual({ inRecovery: true, rows: 1 });
      expect(stats().replicaReads).toBe(after.replicaReads + 1);
    } finally {
      await withClient(standbyUrl(), (c) => c.query('SELECT pg_catalog.pg_wal_replay_resume()'));
    }
  });

  it('a shard the standby does not hold active (a move fenced it) is read from the primary, which serves it until the switch', async () => {
    const id = await insert(4n);
    const shard = router.shardForKey(4n);
    // What a move's fence writes on its source, replicated to the source's standby.
    await withClient(host.primary.url.replace(/\/postgres$/, '/fleet'), (c) =>
      c.query(`UPDATE shardctl.shards SET state = 'fenced' WHERE shard = $1`, [shard]),
    );
    try {
      await host.caughtUp();
      const before = stats();
      const seen = await router.withKey(4n, readBack(id), { readOnly: true, replica: true });
      expect(seen).toEqual({ inRecovery: false, rows: 1 });
      expect(stats().replicaFallbackReasons['not-active'] ?? 0).toBe(
        (before.replicaFallbackReasons['not-active'] ?? 0) + 1,
      );
      // Another shard of the same host still reads from the standby.
      const other = (shard + 1) % 4;
      const elsewhere = await router.withShard(
        other,
        async (client) => (await client.query('SELECT pg_catalog.pg_is_in_recovery() AS r')).rows[0].r as boolean,
        { readOnly: true, replica: true },
      );
      expect(elsewhere).toBe(true);
    } finally {
      await withClient(host.primary.url.replace(/\/postgres$/, '/fleet'), (c) =>
        c.query(`UPDATE shardctl.shards SET state = 'active' WHERE shard = $1`, [shard]),
      );
    }
  });

  it('a write LSN of another host (the shard moved since) sends the read to the primary', async () => {
    const id = await insert(5n);
    const before = stats();
    const seen = await router.withKey(5n, readBack(id), {
      readOnly: true,
      replica: true,
      afterLsn: { host: 'elsewhere', lsn: '0/1' },
    });
    expect(seen).toEqual({ inRecovery: false, rows: 1 });
    expect(stats().replicaFallbackReasons.moved ?? 0).toBe((before.replicaFallbackReasons.moved ?? 0) + 1);
  });

  it(
    'a standby connection that stops passing bytes (the host fine, the flow lost) makes the read fall back to the primary within the host timeout',
    { timeout: 60_000 },
    async () => {
      // The standby behind a proxy that can stall the connections open at a moment, new ones still passing.
      const proxy = await startTcpProxy(standbyUrl());
      const url = `postgres://postgres:${host.password}@127.0.0.1:${host.primary.port},127.0.0.1:${proxy.port}/fleet`;
      const proxied = ShardRouter.fromConfig(
        { ...router.map, hosts: router.map.hosts.map((h) => ({ ...h, url, timeoutMs: BOUND_MS })) },
        { poolSize: 1 },
      );
      const onStandby = (client: pg.PoolClient) =>
        client.query<{ r: boolean }>('SELECT pg_catalog.pg_is_in_recovery() AS r').then((r) => r.rows[0]!.r);
      try {
        expect(await proxied.withKey(6n, onStandby, { readOnly: true, replica: true })).toBe(true);
        const before = proxied.stats().find((s) => s.host === 'pg1')!;
        // The pooled standby connection is the one stalled: the next read waits on it.
        proxy.stallEstablished();
        const { value, ms } = await timed(() => proxied.withKey(6n, onStandby, { readOnly: true, replica: true }));
        expect(value).toBe(false);
        // One bound of silence, a probe and the standby's pg_stat_activity asked, slack for a loaded machine.
        expect(ms).toBeLessThan(3 * BOUND_MS + 4000);
        const after = proxied.stats().find((s) => s.host === 'pg1')!;
        expect(after.replicaFallbackReasons.unreachable ?? 0).toBe(
          (before.replicaFallbackReasons.unreachable ?? 0) + 1,
        );
      } finally {
        await proxied.close();
        await proxy.close();
      }
    },
  );

  it.each([
    [{ replica: true }, 'replica true: needs readOnly: true'],
    [{ readOnly: true, replica: 'yes' }, 'replica "yes": must be true or false'],
    [{ readOnly: true, replica: true, maxLagMs: -1 }, 'maxLagMs -1: must be a whole number of milliseconds'],
    [{ readOnly: true, replica: true, maxLagMs: 1.5 }, 'maxLagMs 1.5: must be a whole number of milliseconds'],
    [{ readOnly: true, replica: true, replicaWaitMs: 'soon' }, 'replicaWaitMs "soon": must be a whole number'],
    [{ readOnly: true, replica: true, afterLsn: { host: 'pg1', lsn: 'nope' } }, 'afterLsn {"host":"pg1","lsn":"nope"}'],
    [{ readOnly: true, maxLagMs: 10 }, 'maxLagMs 10: applies only with replica: true'],
  ])('refuses bad replica options %j, naming the field and the value', async (options, message) => {
    const error = await router
      .withKey(1n, async () => 1, options as Parameters<ShardRouter['withKey']>[2])
      .catch((e: unknown) => e as Error & { code?: string; exitCode?: number });
    expect(error).toBeInstanceOf(Error);
    expect((error as Error).message).toContain(message);
    expect((error as { code?: string }).code).toBe('USAGE');
    expect((error as { exitCode?: number }).exitCode).toBe(2);
    const fan = await router
      .forEachShard(async () => 1, options as Parameters<ShardRouter['forEachShard']>[1])
      .catch((e: unknown) => e as Error);
    expect((fan as Error).message).toContain(message);
  });

  it("a standby behind a pooler the config does not declare (PgBouncer, transaction mode): fn's named statements go unnamed there, no read fails and none is left on the pooler's server connections", async () => {
    const pooler = await startPgBouncer(host.standby.url, { poolSize: 2 });
    const standbyPort = new URL(host.standby.url).port;
    const poolerPort = new URL(pooler.url(host.standby.url)).port;
    const pooledFile = join(dirname(configFile), 'standby-pooled.yaml');
    const text = readFileSync(configFile, 'utf8');
    writeFileSync(pooledFile, text.replace(`127.0.0.1:${standbyPort}/`, `127.0.0.1:${poolerPort}/`));
    expect(readFileSync(pooledFile, 'utf8')).not.toBe(text);
    const reader = await ShardRouter.open(pooledFile, { poolSize: 4 });
    try {
      const errors: string[] = [];
      const seen = await Promise.all(
        Array.from({ length: 40 }, (_, i) =>
          reader
            .withShard(
              i % 4,
              async (client) =>
                (
                  await client.query<{ r: boolean }>({
                    name: 'rr_in_recovery',
                    text: 'SELECT pg_catalog.pg_is_in_recovery() AS r, count(*) FROM photos WHERE user_id = $1',
                    values: [i],
                  })
                ).rows[0]!.r,
              { readOnly: true, replica: true },
            )
            .catch((error: unknown) => {
              errors.push(String(error));
              return null;
            }),
        ),
      );
      expect(errors).toEqual([]);
      expect(seen.every((r) => r === true)).toBe(true);
    } finally {
      await reader.close();
    }
    try {
      expect(await statementsLeft(pooler.url(host.standby.url.replace(/\/postgres$/, '/fleet')), pooler.poolSize)).toBe(
        0,
      );
    } finally {
      await pooler.stop();
    }
  });

  it('lastWriteLsn needs trackWriteLsn, and says so', async () => {
    const plain = ShardRouter.fromConfig(router.map);
    try {
      expect(() => plain.lastWriteLsn(0)).toThrow(/trackWriteLsn: true/);
    } finally {
      await plain.close();
    }
  });
});

describe('replica reads of a shard moved away from a host with a standby', () => {
  const db = useTestDatabases(1);
  let host: ReplicatedHost;

  beforeAll(async () => {
    host = await startReplicatedHost();
    await withClient(host.primary.url, (c) => c.query('create database rm'));
    await host.caughtUp();
  }, 120_000);

  afterAll(async () => {
    await host?.dispose();
  });

  it("a router on the old map is not served the old host's standby copy: it reads the new holder, writes made there included", async () => {
    const url = host.multiHostUrl('rm');
    const fleet = makeFleet({
      urls: [url, db.urls[0]!],
      replicationUrls: [url, undefined],
      shards: 2,
      split: ['0-1', ''],
      schemaPrefix: 'rm',
      migrations: PHOTOS_ONLY,
    });
    expect((await init(await fleet.config())).ok).toBe(true);
    await withClient(host.primary.url.replace(/\/postgres$/, '/rm'), (c) =>
      c.query(`insert into rm0.photos (user_id, image_url) select g * 2, 'x' from generate_series(1, 100) g`),
    );
    await host.caughtUp();
    // Trusts the file (pg1 holds shard 0) until a call meets the move.
    const stale = ShardRouter.fromConfig(await fleet.config());
    const count = (client: pg.PoolClient) =>
      client
        .query<{ n: number; r: boolean }>('SELECT count(*)::int AS n, pg_catalog.pg_is_in_recovery() AS r FROM photos')
        .then((r) => r.rows[0]!);
    try {
      expect(await stale.withShard(0, count, { readOnly: true, replica: true })).toEqual({ n: 100, r: true });
      const result = await moveShard(await fleet.config(), 0, 'pg2', { configFile: fleet.configFile });
      expect(result.outcome).toBe('moved');
      await withClient(db.urls[0]!, (c) => c.query(`insert into rm0.photos (user_id, image_url) values (0, 'new')`));
      // The old host's standby has replayed the move's end on the old host.
      await host.caughtUp();
      const before = stale.stats().find((s) => s.host === 'pg1')!;
      expect(await stale.withShard(0, count, { readOnly: true, replica: true })).toEqual({ n: 101, r: false });
      const after = stale.stats();
      expect(after.find((s) => s.host === 'pg1')!.replicaFallbackReasons['not-active'] ?? 0).toBe(
        (before.replicaFallbackReasons['not-active'] ?? 0) + 1,
      );
      // pg2 has no standby: read on its primary, and said so.
      expect(after.find((s) => s.host === 'pg2')!.replicaFallbackReasons['no-standby']).toBe(1);
      expect(stale.hostForShard(0).name).toBe('pg2');
    } finally {
      await stale.close();
    }
  }, 120_000);
});
