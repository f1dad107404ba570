/**
 * A rerun right after a killed run works: the runner lock waits (up to lockTimeout) for the sessions
 * of a run that is going away, directly and behind a TCP proxy that keeps the server side open a
 * moment after the client died; a worker killed in the middle of a statement is ended by the server
 * (client_connection_check_interval) instead of running on to the statement's end.
 */
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { connectHost, CLIENT_CONNECTION_CHECK_INTERVAL } from '../../src/fleet/connect.js';
import { ASYNC_COMMIT_SQL, WORKER_TRANSACTION_SQL } from '../../src/fleet/control.js';
import { openWorker } from '../../src/fleet/session.js';
import { init } from '../../src/commands/init.js';
import { type Fleet, makeFleet, runCli } from '../helpers/fleet.js';
import { useTestDatabases, withClient } from '../helpers/hosts.js';
import { range, shardsNotAt, spawnCli as spawnMigrate, waitFor } from '../helpers/migrations.js';
import { lastMove, removeCliSnapshot, schemaFingerprint, shardRow, spawnCli as spawnMove } from '../helpers/moves.js';
import { startTcpProxy, type TcpProxy } from '../helpers/tcp-proxy.js';

afterAll(removeCliSnapshot);

/** Sleeps for a minute on every shard while public.go_slow has a row, then adds a column. */
const SLOW_MIGRATION =
  'SELECT pg_sleep(CASE WHEN EXISTS (SELECT FROM public.go_slow) THEN 60 ELSE 0 END);\nALTER TABLE photos ADD COLUMN after_kill boolean;\n';

/** How long the proxy keeps the server side of a dead client's connection open. */
const PROXY_LINGER_MS = 2_000;

describe('a rerun right after a killed run', () => {
  const proxies: TcpProxy[] = [];
  afterEach(async () => {
    await Promise.all(proxies.splice(0).map((proxy) => proxy.close()));
  });

  it("a worker's transaction asks the server to check for a dead client during its statements, and leaves the session as it found it (a pooled server connection goes back clean); a move's worker session asks for its life once put to work", async () => {
    const config = await makeFleet({ urls: testDb.urls, shards: 1 }).config();
    expect((await init(config)).ok).toBe(true);
    const client = await connectHost(config.hosts[0]!);
    const show = async (c: typeof client): Promise<string> =>
      (await c.query<{ setting: string }>(`SELECT current_setting('client_connection_check_interval') AS setting`))
        .rows[0]!.setting;
    try {
      const before = await show(client);
      expect(before).toBe('0');
      await client.query(`BEGIN;\n${WORKER_TRANSACTION_SQL}`);
      expect(await show(client)).toBe(CLIENT_CONNECTION_CHECK_INTERVAL);
      await client.query('COMMIT');
      expect(await show(client)).toBe(before);
    } finally {
      await client.end();
    }
    // A move's worker, opened ahead, asks nothing until it is put to work (a refused move leaves nothing).
    const worker = await openWorker(config.hosts[0]!);
    try {
      expect(await show(worker)).toBe('0');
      await worker.query(ASYNC_COMMIT_SQL);
      expect(await show(worker)).toBe(CLIENT_CONNECTION_CHECK_INTERVAL);
    } finally {
      await worker.end();
    }
  });

  it.each([
    ['directly', undefined],
    ['through a TCP proxy', PROXY_LINGER_MS],
  ] as const)(
    'migrate killed with SIGKILL mid-statement, rerun at once %s: it waits for the dead run, then applies each migration once',
    async (_path, linger) => {
      const db = linger === undefined ? migrateDirect : migrateProxied;
      const urls =
        linger === undefined
          ? db.urls
          : await Promise.all(
              db.urls.map(async (url) => {
                const proxy = await startTcpProxy(url, { lingerMs: linger });
                proxies.push(proxy);
                return proxy.url;
              }),
            );
      const fleet = makeFleet({ urls, shards: 8, replicationUrls: db.replicationUrls, extra: 'lockTimeout: 10s' });
      expect((await init(await fleet.config())).ok).toBe(true);
      for (const url of db.urls)
        await withClient(url, (c) =>
          c.query('create table public.go_slow (); insert into public.go_slow default values'),
        );
      fleet.writeMigration('0004_slow.sql', SLOW_MIGRATION);

      const run = spawnMigrate(['migrate', '-c', fleet.configFile]);
      await waitFor(
        'workers of the first run to sleep in the migration',
        async () => (await sleepingWorkers(db.urls)) === 2 * 2,
      );
      run.child.kill('SIGKILL');
      expect((await run.exited).signal).toBe('SIGKILL');
      for (const url of db.urls) await withClient(url, (c) => c.query('delete from public.go_slow'));

      const started = Date.now();
      const rerun = await runCli(['migrate', '-c', fleet.configFile]);
      expect(rerun.stderr).toContain('migrate: 8 migrations applied, 0 shards already current, 0 failed; 2 hosts');
      expect(rerun.code).toBe(0);
      // Not the minute the killed statements would have slept.
      expect(Date.now() - started).toBeLessThan(8_000);
      expect(await shardsNotAt(db.urls[0]!, range(0, 3), [1, 2, 3, 4])).toEqual([]);
      expect(await shardsNotAt(db.urls[1]!, range(4, 7), [1, 2, 3, 4])).toEqual([]);
    },
  );

  it('a move killed after a step through a TCP proxy is resumed at once', async () => {
    const db = moveProxied;
    const urls = await Promise.all(
      db.urls.map(async (url) => {
        const proxy = await startTcpProxy(url, { lingerMs: PROXY_LINGER_MS });
        proxies.push(proxy);
        return proxy.url;
      }),
    );
    const fleet: Fleet = makeFleet({ urls, shards: 4, split: ['0-3', ''], replicationUrls: db.replicationUrls });
    expect((await init(await fleet.config())).ok).toBe(true);
    await withClient(db.urls[0]!, (c) =>
      c.query(`insert into insta1.photos (user_id, image_url) select g, 'x' from generate_series(1, 500) g`),
    );
    const rows = await withClient(db.urls[0]!, (c) => schemaFingerprint(c, 'insta1'));

    const killed = await spawnMove(['move-shard', '1', '--to', 'pg2', '--yes', '-c', fleet.configFile], {
      SHARDCTL_FAULT_AFTER_STEP: 'subscribed',
    });
    expect(killed.signal, killed.stderr).toBe('SIGKILL');
    const resumed = await runCli(['move-shard', '1', '--resume', '--yes', '-c', fleet.configFile]);
    expect(resumed.code, resumed.stderr).toBe(0);
    await withClient(db.urls[1]!, async (c) => {
      expect(await shardRow(c, 1)).toEqual({ state: 'active', schema: 'insta1' });
      expect(await schemaFingerprint(c, 'insta1')).toEqual(rows);
      expect(await lastMove(c, 1)).toMatchObject({ status: 'done' });
    });
  });
});

const testDb = useTestDatabases(1);
const migrateDirect = useTestDatabases(2);
const migrateProxied = useTestDatabases(2);
const moveProxied = useTestDatabases(2);

/** Backends of the test database sleeping in the slow migration. */
async function sleepingWorkers(urls: readonly string[]): Promise<number> {
  let n = 0;
  for (const url of urls) {
    n += await withClient(url, async (c) =>
      Number(
        (
          await c.query<{ n: string }>(
            `select count(*) as n from pg_stat_activity where datname = current_database() and state = 'active' and query like '%pg_sleep(CASE%' and pid <> pg_backend_pid()`,
          )
        ).rows[0]!.n,
      ),
    );
  }
  return n;
}
