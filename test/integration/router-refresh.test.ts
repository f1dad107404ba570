/**
 * The router's background refresh of the map: a short query per host on its own pools while
 * nothing changed (no new connection), and the whole map read again once a host's placement
 * changed (a move's switch) or the router's file names its hosts differently.
 */
import { readFileSync, writeFileSync } from 'node:fs';
import type pg from 'pg';
import { describe, expect, it } from 'vitest';
import { init, loadConfig, ShardRouter, type ShardctlConfig } from '../../src/index.js';
import { makeFleet, runCli } from '../helpers/fleet.js';
import { adminClient, useTestDatabases } from '../helpers/hosts.js';
import { waitFor } from '../helpers/migrations.js';
import { useProxiedFleet } from '../helpers/tcp-proxy.js';

const db = useTestDatabases(2);

/** Sessions ever opened to the test databases (pg_stat_database.sessions, PostgreSQL 14 and later), both hosts. */
async function sessionsOpened(clients: readonly pg.Client[]): Promise<number> {
  let total = 0;
  for (const c of clients) {
    await c.query('select pg_stat_clear_snapshot()');
    const r = await c.query<{ n: string }>(
      `select sessions::text as n from pg_stat_database where datname = current_database()`,
    );
    total += Number(r.rows[0]!.n);
  }
  return total;
}

/**
 * About 20 refreshes (at 100 ms) open no session on either host. First every session opened so far
 * (the discovery's, these clients', the pools') is reported: a backend reports its own start at its
 * first transaction end a second after the last report. A full read of the map would open a
 * connection to each host every time.
 */
async function expectQuietRefreshes(admins: readonly pg.Client[]): Promise<void> {
  await new Promise((resolve) => setTimeout(resolve, 1_200));
  for (const c of admins) await c.query('select pg_stat_force_next_flush()');
  const before = await sessionsOpened(admins);
  await new Promise((resolve) => setTimeout(resolve, 2_000));
  for (const c of admins) await c.query('select pg_stat_force_next_flush()');
  expect(await sessionsOpened(admins)).toBe(before);
}

/** Sessions of the test database (but `admin`'s own) whose last query was the refresh's question. */
async function askedOn(admin: pg.Client): Promise<number> {
  const asked = await admin.query<{ n: number }>(
    `select count(*)::int as n from pg_stat_activity
      where datname = current_database() and query like '%placement_version%' and pid <> pg_backend_pid()`,
  );
  return asked.rows[0]!.n;
}

describe('the background refresh of a router', () => {
  it('opens no connection while the map is unchanged, and reads the map again after a move and after an edit of its file', async () => {
    const fleet = makeFleet({ urls: db.urls, shards: 4, split: ['0-1', '2-3'] });
    expect((await init(await fleet.config())).ok).toBe(true);
    const admins = await Promise.all(db.urls.map((url) => adminClient(url)));
    const router = await ShardRouter.open(fleet.configFile, { mapRefreshMs: 100 });
    try {
      const insert = (shard: number) =>
        router.withShard(shard, (client) =>
          client.query(`insert into photos (user_id, image_url) values ($1, 'x')`, [shard]),
        );
      // One call on each host: each has a pool (one connection, or two when a refresh overlapped the call).
      await insert(0);
      await insert(2);
      await expectQuietRefreshes(admins);
      // The refresh asked on the pool's own connections (a query stays in pg_stat_activity while its
      // connection is idle): at least one of them asked last, and no other session did.
      const pg1 = router.stats().find((h) => h.host === 'pg1')!;
      const asked = await askedOn(admins[0]!);
      expect(asked).toBeGreaterThanOrEqual(1);
      expect(asked).toBeLessThanOrEqual(pg1.poolSize);

      // A move switches shard 1 to pg2: the version changes there, and the refresh reads the map.
      const moved = await runCli(['move-shard', '1', '--to', 'pg2', '--yes', '-c', fleet.configFile]);
      expect(moved.code, moved.stderr).toBe(0);
      await waitFor('the router to place shard 1 on pg2', async () => router.hostForShard(1).name === 'pg2', 10_000);

      // The file names pg2 at another url (the same server): the refresh reads the map again.
      const text = readFileSync(fleet.configFile, 'utf8');
      const url = db.urls[1]!;
      const edited = `${url}${url.includes('?') ? '&' : '?'}application_name=edited`;
      expect(text).toContain(url);
      writeFileSync(fleet.configFile, text.replace(url, edited));
      await waitFor('the router to take the edited url', async () => router.hostForShard(3).url === edited, 10_000);
      await insert(3);
    } finally {
      await router.close();
      await Promise.all(admins.map((c) => c.end()));
    }
  });
});

// An application that loads the file and changes the hosts' addresses in code (a password from a
// secret store, a pooler's address) before it opens the router: the router must not take the file's
// addresses back at its next reading of the map (a refresh, a move followed). Found in a benchmark
// whose pooler side went around the pooler after 30 s that way.
describe('a router over a config whose addresses were changed in code', () => {
  const own = useTestDatabases(2);

  it('keeps the addresses it was given through a move and an edit of the file; one over the file as loaded follows the edit', async () => {
    const fleet = makeFleet({ urls: own.urls, shards: 4, split: ['0-1', '2-3'] });
    expect((await init(await fleet.config())).ok).toBe(true);
    const config = await loadConfig(fleet.configFile);
    const mark = (url: string, name: string) => `${url}${url.includes('?') ? '&' : '?'}application_name=${name}`;
    const given: ShardctlConfig = {
      ...config,
      hosts: config.hosts.map((h) => ({ ...h, url: mark(h.url, 'given'), directUrl: mark(h.directUrl, 'given') })),
    };
    const changed = await ShardRouter.openConfig(given, { mapRefreshMs: 100 });
    const asLoaded = await ShardRouter.openConfig(config, { mapRefreshMs: 100 });
    try {
      const insert = (router: ShardRouter, shard: number) =>
        router.withShard(shard, (client) =>
          client.query(`insert into photos (user_id, image_url) values ($1, 'x')`, [shard]),
        );
      await insert(changed, 0);
      await insert(asLoaded, 2);
      // A move rewrites the file's shard lists: both routers learn it, the changed one at its own addresses.
      const moved = await runCli(['move-shard', '1', '--to', 'pg2', '--yes', '-c', fleet.configFile]);
      expect(moved.code, moved.stderr).toBe(0);
      for (const router of [changed, asLoaded])
        await waitFor('the routers to place shard 1 on pg2', async () => router.hostForShard(1).name === 'pg2', 10_000);
      // An edit of pg1's url in the file: the router over the file as loaded takes it.
      const text = readFileSync(fleet.configFile, 'utf8');
      const url = own.urls[0]!;
      expect(text).toContain(url);
      writeFileSync(fleet.configFile, text.replace(url, mark(url, 'edited')));
      await waitFor(
        'the router over the file to take the edited url',
        async () => asLoaded.hostForShard(0).url === mark(url, 'edited'),
        10_000,
      );
      // Several refreshes later the other still uses what it was given, and its calls work there.
      await new Promise((resolve) => setTimeout(resolve, 500));
      expect([0, 1, 2, 3].map((shard) => changed.hostForShard(shard).url)).toEqual([
        given.hosts[0]!.url,
        given.hosts[1]!.url,
        given.hosts[1]!.url,
        given.hosts[1]!.url,
      ]);
      await insert(changed, 0);
      await insert(changed, 1);
    } finally {
      await changed.close();
      await asLoaded.close();
    }
  });
});

describe('the background refresh of a router that has called one host only', () => {
  const own = useTestDatabases(2);

  it('makes a pool on the other host once and asks it there: no connection opened at each refresh', async () => {
    const fleet = makeFleet({ urls: own.urls, shards: 4, split: ['0-1', '2-3'] });
    expect((await init(await fleet.config())).ok).toBe(true);
    const admins = await Promise.all(own.urls.map((url) => adminClient(url)));
    // The pools' idle connections outlive the test's window.
    const router = await ShardRouter.open(fleet.configFile, { mapRefreshMs: 100, idleTimeoutMs: 60_000 });
    try {
      // Calls on pg1 only: before the refresh made a pool on pg2, each refresh read the whole map.
      await router.withShard(0, (client) => client.query('select 1'));
      await expectQuietRefreshes(admins);
      // pg2 is asked on the router's one connection there.
      expect(await askedOn(admins[1]!)).toBe(1);
    } finally {
      await router.close();
      await Promise.all(admins.map((c) => c.end()));
    }
  });
});

describe('the background refresh of a router opened from seeds', () => {
  const seeded = useTestDatabases(2);

  it('opened from seeds one of which does not answer (an old address): the map is read whole once, not at each refresh', async () => {
    const fleet = makeFleet({ urls: seeded.urls, shards: 4, split: ['0-1', '2-3'], schemaPrefix: 'ds' });
    expect((await init(await fleet.config())).ok).toBe(true);
    const admins = await Promise.all(seeded.urls.map((url) => adminClient(url)));
    // Nothing listens on port 1: refused at once.
    const dead = new URL(seeded.urls[0]!);
    dead.port = '1';
    const router = await ShardRouter.open(
      { seeds: [dead.toString(), seeded.urls[1]!] },
      { mapRefreshMs: 100, idleTimeoutMs: 60_000 },
    );
    try {
      expect(router.unreachableHosts().map((u) => u.name)).toEqual(['seed 1']);
      await router.withShard(0, (client) => client.query('select 1'));
      await router.withShard(2, (client) => client.query('select 1'));
      await expectQuietRefreshes(admins);
    } finally {
      await router.close();
      await Promise.all(admins.map((c) => c.end()));
    }
  });
});

// pg2 behind a TCP proxy, hostTimeout 2s. The router's pooled connection to pg2 stops passing bytes
// (a NAT gateway or firewall that dropped the flow; new connections work): its background check of
// pg2 waits no longer than hostTimeout for the answer (the pools' silence watch, fleet/silence.ts),
// the connection is dropped, and the map is read again on new connections. Without that bound the
// check would wait for ever, and no refresh would run after it.
describe('the background refresh of a router whose pooled connection to a host stopped answering', () => {
  const proxied = useProxiedFleet();

  it('gives up on it after hostTimeout and reads the map again: a move made meanwhile is learned without a call', async () => {
    const fleet = proxied.fleet();
    const router = await ShardRouter.open(fleet.configFile, { mapRefreshMs: 100 });
    try {
      // A pool on each host, then the connections open to pg2 pass nothing any more.
      await router.withShard(0, (c) => c.query('select 1'));
      await router.withShard(4, (c) => c.query('select 1'));
      proxied.proxy().stallEstablished();
      const moved = await runCli(['move-shard', '1', '--to', 'pg2', '--yes', '-c', fleet.configFile]);
      expect(moved.code, moved.stderr).toBe(0);
      await waitFor('the router to place shard 1 on pg2', async () => router.hostForShard(1).name === 'pg2', 15_000);
      // Its calls to pg2 work, on a new connection.
      await router.withShard(1, (c) => c.query('select 1'));
    } finally {
      await router.close();
    }
  }, 60_000);

  it('close() gives the refresh up at once and nothing connects after; calls and reload() after it are refused, not counted against a host', async () => {
    const fleet = proxied.fleet();
    const proxy = proxied.proxy();
    const router = await ShardRouter.open(fleet.configFile, { mapRefreshMs: 100 });
    await router.withShard(0, (c) => c.query('select 1'));
    await router.withShard(4, (c) => c.query('select 1'));
    proxy.stallEstablished();
    // A few refreshes: one is now waiting on pg2's silent pooled connection (for up to hostTimeout, 2 s,
    // then a whole read of the map, new connections to both hosts).
    await new Promise((resolve) => setTimeout(resolve, 400));
    const started = performance.now();
    await router.close();
    const closing = performance.now() - started;
    const connections = proxy.connections;
    await new Promise((resolve) => setTimeout(resolve, 3_000));
    expect(proxy.connections).toBe(connections);
    // Not the 2 s and more the refresh would have gone on waiting for.
    expect(closing).toBeLessThan(1_500);
    await expect(router.reload()).rejects.toMatchObject({ code: 'ROUTER_CLOSED' });
    const after = await router.withShard(0, (c) => c.query('select 1')).catch((error: unknown) => error);
    expect(after).toMatchObject({
      code: 'ROUTER_CLOSED',
      message: expect.stringContaining('a call made after close() does not run'),
    });
    expect(proxy.connections).toBe(connections);
    expect(router.stats().map((h) => [h.host, h.errors])).toEqual([
      ['pg1', 0],
      ['pg2', 0],
    ]);
  }, 60_000);

  it('close() drops a connection still being made: the call waiting for it fails at once as not run', async () => {
    const fleet = proxied.fleet();
    const proxy = proxied.proxy();
    const router = await ShardRouter.open(fleet.configFile);
    await router.withShard(0, (c) => c.query('select 1'));
    // pg2 takes connections and never answers them.
    proxy.silence('all');
    const call = router.withShard(4, (c) => c.query('select 1')).catch((error: unknown) => error);
    await new Promise((resolve) => setTimeout(resolve, 300));
    const started = performance.now();
    await router.close();
    expect(performance.now() - started).toBeLessThan(1_500);
    expect(await call).toMatchObject({
      code: 'ROUTER_CLOSED',
      message: expect.stringContaining('was closed before the call had a connection: it did not run'),
    });
    expect(router.stats().find((h) => h.host === 'pg2')?.errors ?? 0).toBe(0);
  }, 60_000);
});
