import { randomBytes } from 'node:crypto';
import { copyFileSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { init } from '../../src/commands/init.js';
import { moveShards } from '../../src/commands/move-shard.js';
import { loadConfig } from '../../src/config/load.js';
import { ShardRouter } from '../../src/router/router.js';
import { makeFleet, runCli, sharedHostReplicationUrl } from '../helpers/fleet.js';
import { stillRunningAfter, useTestDatabases, withClient } from '../helpers/hosts.js';
import { startApp, waitForCalls } from '../helpers/app.js';
import { BASELINE, buildArticleFleet } from '../fixtures/article-fleet.js';
import { shardForKey } from '../../src/id/routing.js';
import { hostForShard } from '../../src/config/types.js';
import { onEveryServerConnection, startPgBouncer, type PgBouncer } from '../helpers/pgbouncer.js';

const PHOTOS_ONLY = {
  '0001_photos.sql': `CREATE SEQUENCE photos_id_seq;
CREATE TABLE photos (id bigint PRIMARY KEY DEFAULT next_id('photos_id_seq'), user_id bigint NOT NULL, image_url text NOT NULL);
ALTER SEQUENCE photos_id_seq OWNED BY photos.id;`,
};

/** The settings a transaction could leave behind on a server connection, and the server's defaults. */
const WATCHED = [
  'synchronous_commit',
  'statement_timeout',
  'idle_in_transaction_session_timeout',
  'search_path',
  'lock_timeout',
  'client_connection_check_interval',
  'check_function_bodies',
  'session_replication_role',
];

/**
 * What else a session could keep for the next client: prepared statements, LISTEN channels, temporary
 * tables, advisory locks, an open cursor. Read on the server connection itself; all must be 0.
 */
const LEFTOVERS_SQL = `SELECT (SELECT count(*) FROM pg_prepared_statements)::int AS prepared,
  (SELECT count(*) FROM pg_listening_channels())::int AS listening,
  (SELECT count(*) FROM pg_class WHERE relnamespace = pg_my_temp_schema())::int AS temp_relations,
  (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid())::int AS advisory_locks,
  (SELECT count(*) FROM pg_cursors)::int AS cursors`;

/**
 * What every server connection of the pooler's pool for `url` holds: `poolSize` transactions held
 * open at once through the pooler each run on a server connection of their own, so together they
 * see every connection the pool has (and new ones, which hold the defaults anyway).
 */
async function serverConnections(url: string, poolSize: number): Promise<Record<string, string>[]> {
  return onEveryServerConnection(url, poolSize, async (client) => {
    const r = await client.query<{ name: string; setting: string }>(
      `SELECT name, current_setting(name) AS setting FROM unnest($1::text[]) AS name`,
      [WATCHED],
    );
    const left = (await client.query<Record<string, number>>(LEFTOVERS_SQL)).rows[0]!;
    return Object.fromEntries([
      ['pid', String((await client.query<{ pid: number }>('SELECT pg_backend_pid() AS pid')).rows[0]!.pid)],
      ...r.rows.map((row) => [row.name, row.setting]),
      ...Object.entries(left).map(([name, count]) => [name, String(count)]),
    ]) as Record<string, string>;
  });
}

/**
 * The test hosts run with synchronous_commit off (speed); a database of a test here gets the
 * production default back, so that a leaked `off` shows. Before any pooled connection to it.
 */
async function durableCommits(url: string): Promise<void> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    await client.query(
      `ALTER DATABASE ${client.escapeIdentifier(new URL(url).pathname.slice(1))} SET synchronous_commit = on`,
    );
  } finally {
    await client.end();
  }
}

/** The server's defaults for WATCHED, read on a direct connection. */
async function defaults(url: string): Promise<Record<string, string>> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    const r = await client.query<{ name: string; setting: string }>(
      `SELECT name, current_setting(name) AS setting FROM unnest($1::text[]) AS name`,
      [WATCHED],
    );
    return {
      ...Object.fromEntries(r.rows.map((row) => [row.name, row.setting])),
      prepared: '0',
      listening: '0',
      temp_relations: '0',
      advisory_locks: '0',
      cursors: '0',
    };
  } finally {
    await client.end();
  }
}

/** Every server connection of the poolers in front of `urls` holds the server's defaults and nothing else. */
async function expectCleanPools(urls: readonly string[], poolers: readonly PgBouncer[], after: string): Promise<void> {
  for (const [i, url] of urls.entries()) {
    const expected = await defaults(url);
    for (const connection of await serverConnections(poolers[i]!.url(url), poolers[i]!.poolSize)) {
      const { pid, ...settings } = connection;
      expect({ after, host: i, pid, settings }).toEqual({ after, host: i, pid, settings: expected });
    }
  }
}

/** A config whose hosts' url goes through the poolers and directUrl to the servers themselves. */
function pooledWithDirect(configFile: string, direct: readonly string[], poolers: readonly PgBouncer[]): void {
  let text = readFileSync(configFile, 'utf8');
  for (const [i, url] of direct.entries()) {
    const pooled = poolers[i]!.url(url);
    text = text.replace(`    url: ${url}\n`, `    url: ${pooled}\n    directUrl: ${url}\n`);
    if (!text.includes(`directUrl: ${url}`)) throw new Error(`host ${i} not found in ${configFile}`);
  }
  writeFileSync(configFile, text);
}

describe('behind PgBouncer in transaction mode', () => {
  const db = useTestDatabases(2);
  /** Databases of their own for the router's fleet (another layout: 8 shards, prefix pr). */
  const dbRouter = useTestDatabases(2);
  /** And for the move's. */
  const dbMove = useTestDatabases(2);
  /** For every command in a row, for adopt's, and for the move under 20 writers. */
  const dbAll = useTestDatabases(2);
  const dbAdopt = useTestDatabases(2);
  const dbBusy = useTestDatabases(2);
  /** For a call that gives up on its query. */
  const dbGiveUp = useTestDatabases(1);
  const poolers: PgBouncer[] = [];

  beforeAll(async () => {
    for (const url of [
      ...db.urls,
      ...dbRouter.urls,
      ...dbMove.urls,
      ...dbAll.urls,
      ...dbAdopt.urls,
      ...dbBusy.urls,
      ...dbGiveUp.urls,
    ])
      await durableCommits(url);
    for (const url of db.urls) poolers.push(await startPgBouncer(url, { poolSize: 4 }));
  });
  afterAll(async () => {
    await Promise.all(poolers.map((p) => p.stop()));
  });

  it("a call whose fn gives up on a slow query ends at once: the cancel request reaches the server through the pooler, and the pooler's server connections are left clean", async () => {
    const pooler = await startPgBouncer(dbGiveUp.urls[0]!, { poolSize: 2 });
    poolers.push(pooler);
    const pooled = pooler.url(dbGiveUp.urls[0]!);
    const fleet = makeFleet({
      urls: [pooled],
      shards: 2,
      split: ['0-1'],
      schemaPrefix: 'gp',
      migrations: PHOTOS_ONLY,
    });
    expect((await init(await fleet.config())).ok).toBe(true);
    const router = await ShardRouter.open(fleet.configFile, { poolSize: 2 });
    try {
      const started = performance.now();
      const call = router.withShard(1, async (client) => {
        await client.query(`insert into photos (user_id, image_url) values (1, 'given up')`);
        await Promise.race([
          client.query('select pg_sleep(60)'),
          new Promise((_, reject) => setTimeout(() => reject(new Error('app timeout')), 200)),
        ]);
      });
      await expect(call).rejects.toThrow('app timeout');
      expect(performance.now() - started).toBeLessThan(20_000);
      // On the server itself: the query was cancelled, and nothing of the call committed.
      expect(await stillRunningAfter(dbGiveUp.urls[0]!, 'select pg_sleep(60)')).toBe(0);
      expect((await withClient(dbGiveUp.urls[0]!, (c) => c.query('select 1 from gp1.photos'))).rowCount).toBe(0);
      expect((await router.withShard(0, (client) => client.query('select current_schema() as s'))).rows).toEqual([
        { s: 'gp0' },
      ]);
    } finally {
      await router.close();
    }
    for (const connection of await serverConnections(pooled, 2))
      expect(connection).toMatchObject({ search_path: '"$user", public', temp_relations: '0', cursors: '0' });
  });

  it('init, migrate, status, exec and migrate again run back to back through the pooler, and leave every server connection with the server defaults (no asynchronous commit left for the next client)', async () => {
    const pooled = db.urls.map((url, i) => poolers[i]!.url(url));
    const fleet = makeFleet({ urls: pooled, shards: 64, schemaPrefix: 'pb', migrations: PHOTOS_ONLY });
    const result = await init(await fleet.config());
    expect(result.ok).toBe(true);
    fleet.writeMigration('0002_tags.sql', 'CREATE TABLE tags (photo_id bigint NOT NULL, tag text NOT NULL);\n');
    const runs = [
      ['migrate', '-c', fleet.configFile],
      ['status', '-c', fleet.configFile],
      ['exec', '-c', fleet.configFile, '--json', 'select count(*) from tags'],
      ['migrate', '-c', fleet.configFile],
      ['init', '-c', fleet.configFile],
    ];
    for (const args of runs) {
      const run = await runCli(args);
      expect({ args, code: run.code, stderr: run.stderr }).toEqual({ args, code: 0, stderr: expect.any(String) });
    }
    for (const [i, url] of db.urls.entries()) {
      const expected = await defaults(url);
      const seen = await serverConnections(pooled[i]!, poolers[i]!.poolSize);
      for (const connection of seen) {
        const { pid, ...settings } = connection;
        expect({ host: i, pid, settings }).toEqual({ host: i, pid, settings: expected });
      }
      expect(expected.synchronous_commit).toBe('on');
    }
  });

  it("the router's statementTimeoutMs and idleInTransactionTimeoutMs hold per transaction through a pooler the config does not declare (one that refuses them as startup parameters, one that drops them), and leave nothing behind", async () => {
    // init directly, then the application's config through the poolers (same hosts, same fleet),
    // without directUrl: the router asks for the timeouts as startup parameters, as for a server.
    const fleet = makeFleet({ urls: dbRouter.urls, shards: 8, schemaPrefix: 'pr', migrations: PHOTOS_ONLY });
    expect((await init(await fleet.config())).ok).toBe(true);
    const configText = readFileSync(fleet.configFile, 'utf8');
    // PgBouncer 1.18 refuses a startup statement_timeout ("unsupported startup parameter"); with
    // ignore_startup_parameters it drops it silently.
    const dropping = await Promise.all(
      dbRouter.urls.map((url) =>
        startPgBouncer(url, {
          poolSize: 4,
          ignoreStartupParameters: ['statement_timeout', 'idle_in_transaction_session_timeout'],
        }),
      ),
    );
    try {
      for (const [kind, front] of [
        ['refusing', poolers],
        ['dropping', dropping],
      ] as const) {
        const pooled = dbRouter.urls.map((url, i) => front[i]!.url(url));
        const pooledFile = join(fleet.dir, `pooled-${kind}.yaml`);
        writeFileSync(
          pooledFile,
          dbRouter.urls.reduce((text, url, i) => text.replace(url, pooled[i]!), configText),
        );
        expect((await loadConfig(pooledFile)).hosts.map((h) => [h.url, h.directUrl])).toEqual(
          pooled.map((url) => [url, url]),
        );
        const router = await ShardRouter.open(pooledFile, {
          statementTimeoutMs: 1000,
          idleInTransactionTimeoutMs: 5000,
          poolSize: 8,
        });
        try {
          let failed = 0;
          await Promise.all(
            Array.from({ length: 8 }, async (_, caller) => {
              for (let i = 0; i < 25; i++) {
                await router
                  .withKey(BigInt(caller * 100 + i), (client) =>
                    client.query(`INSERT INTO photos (user_id, image_url) VALUES ($1, 'x')`, [
                      String(caller * 100 + i),
                    ]),
                  )
                  .catch(() => (failed += 1));
              }
            }),
          );
          expect({ kind, failed }).toEqual({ kind, failed: 0 });
          // A statement past the timeout is cancelled by the server, as it is without the pooler.
          const started = Date.now();
          const error = await router
            .withShard(0, (client) => client.query('SELECT pg_sleep(3)'))
            .then(
              () => null,
              (e: unknown) => e as { code?: string },
            );
          expect({ kind, code: error?.code }).toEqual({ kind, code: '57014' });
          expect(Date.now() - started).toBeLessThan(2500);
          // Inside the transaction the settings are there, set by the transaction itself (source
          // 'session': SET LOCAL), not by the connection's startup (source 'client'); the fan-out's
          // framing counts them.
          const seen = await router.withShard(1, async (client) => {
            const r = await client.query<{ name: string; setting: string; source: string }>(
              `SELECT name, current_setting(name) AS setting, source FROM pg_settings
                WHERE name IN ('statement_timeout', 'idle_in_transaction_session_timeout') ORDER BY name`,
            );
            return r.rows;
          });
          expect({ kind, seen }).toEqual({
            kind,
            seen: [
              { name: 'idle_in_transaction_session_timeout', setting: '5s', source: 'session' },
              { name: 'statement_timeout', setting: '1s', source: 'session' },
            ],
          });
          // A call that is one round trip (fn's only query, with parameters, its COMMIT in the same
          // write) never waits inside its transaction: the idle timeout is not set for it, the
          // statement's is.
          const oneTrip = await router.withShard(1, (client) =>
            client.query<{ s: string; i: string }>('SELECT current_setting($1) AS s, current_setting($2) AS i', [
              'statement_timeout',
              'idle_in_transaction_session_timeout',
            ]),
          );
          expect({ kind, settings: oneTrip.rows[0] }).toEqual({ kind, settings: { s: '1s', i: '0' } });
          const counts = await router.queryEachShard<{ n: string }>('SELECT count(*) AS n FROM photos', {
            readOnly: true,
            shardsPerQuery: 4,
          });
          expect(counts.reduce((sum, r) => sum + Number(r.value.rows[0]!.n), 0)).toBe(kind === 'refusing' ? 200 : 400);
        } finally {
          await router.close();
        }
        await expectCleanPools(dbRouter.urls, front, `the router through the ${kind} pooler`);
      }
    } finally {
      await Promise.all(dropping.map((p) => p.stop()));
    }
  });

  it("an online move of a fleet whose url goes through the pooler connects to directUrl, and leaves the pooled connections clean; a router's background check of the map, through the pooler, finds the switch", async () => {
    const pooled = dbMove.urls.map((url, i) => poolers[i]!.url(url));
    const fleet = makeFleet({ urls: pooled, shards: 4, schemaPrefix: 'pm', migrations: PHOTOS_ONLY });
    // Each host: url through the pooler, directUrl the server itself, and the address the other
    // hosts reach it at (a container's alias on the test network; the same URL on embedded hosts).
    let text = readFileSync(fleet.configFile, 'utf8');
    for (const [i, url] of pooled.entries()) {
      const reach = sharedHostReplicationUrl(dbMove.urls[i]!);
      text = text.replace(
        `    url: ${url}\n`,
        `    url: ${url}\n    directUrl: ${dbMove.urls[i]}\n${reach && reach !== dbMove.urls[i] ? `    replicationUrl: ${reach}\n` : ''}`,
      );
    }
    writeFileSync(fleet.configFile, text);
    const config = await fleet.config();
    expect(config.hosts.map((h) => [h.url, h.directUrl])).toEqual(pooled.map((url, i) => [url, dbMove.urls[i]]));
    expect((await init(config)).ok).toBe(true);
    const writer = new pg.Client({ connectionString: pooled[0]! });
    await writer.connect();
    try {
      await writer.query(`INSERT INTO pm0.photos (user_id, image_url) SELECT g, 'x' FROM generate_series(1, 300) g`);
    } finally {
      await writer.end();
    }
    // A router with pools on both hosts through the pooler, refreshing its map in the background:
    // its check of each host's placement runs through the pooler too, and finds the switch.
    const router = await ShardRouter.open(fleet.configFile, { mapRefreshMs: 100 });
    for (const shard of [0, 3]) await router.withShard(shard, (c) => c.query('SELECT count(*) FROM photos'));
    expect(router.openPools().sort()).toEqual(['pg1', 'pg2']);
    const result = await moveShards(config, [0], 'pg2', { configFile: fleet.configFile });
    expect(result.moves.map((m) => m.outcome)).toEqual(['moved']);
    try {
      for (let i = 0; i < 100 && router.hostForShard(0).name !== 'pg2'; i++)
        await new Promise((resolve) => setTimeout(resolve, 100));
      expect(router.hostForShard(0).name).toBe('pg2');
      // The check itself ran on a server connection of the pooler (its text is its own).
      await new Promise((resolve) => setTimeout(resolve, 300));
      const checks = await withClient(dbMove.urls[1]!, (c) =>
        c.query<{ n: number }>(
          `SELECT count(*)::int AS n FROM pg_stat_activity
            WHERE datname = current_database() AND query LIKE '%coalesce(h.address%' AND pid <> pg_backend_pid()`,
        ),
      );
      expect(checks.rows[0]!.n).toBeGreaterThan(0);
    } finally {
      await router.close();
    }
    const reader = new pg.Client({ connectionString: pooled[1]! });
    await reader.connect();
    try {
      expect((await reader.query<{ n: number }>('SELECT count(*)::int AS n FROM pm0.photos')).rows[0]!.n).toBe(300);
    } finally {
      await reader.end();
    }
    await expectCleanPools(dbMove.urls, poolers, 'the move');
  });

  it('every command runs twice in a row through the pooler while an application writes through it in another process: no call fails, every acknowledged row is there once, and after each command every server connection holds the server defaults and nothing else', async () => {
    const fleet = makeFleet({
      urls: dbAll.urls,
      shards: 8,
      split: ['0-3', '4-7'],
      schemaPrefix: 'pa',
      migrations: PHOTOS_ONLY,
    });
    pooledWithDirect(fleet.configFile, dbAll.urls, poolers);
    const role = `pooled_app_${randomBytes(4).toString('hex')}`;
    for (const url of dbAll.urls) await withClient(url, (c) => c.query(`CREATE ROLE ${role}`));
    const cli = async (args: readonly string[]): Promise<string> => {
      const run = await runCli([...args, '-c', fleet.configFile]);
      expect({ args, code: run.code, stderr: run.stderr }).toEqual({ args, code: 0, stderr: expect.any(String) });
      await expectCleanPools(dbAll.urls, poolers, args.join(' '));
      return run.stdout;
    };
    await cli(['init']);
    // The application's copy of the file, taken now: its router goes through the poolers.
    const appFile = join(fleet.dir, 'app.yaml');
    copyFileSync(fleet.configFile, appFile);
    const otherHost = async (shard: number): Promise<string> =>
      hostForShard(await fleet.config(), shard)?.name === 'pg1' ? 'pg2' : 'pg1';
    const keyOn = (shard: number): number => {
      for (let key = 1; ; key++) if (shardForKey(BigInt(key), 8) === shard) return key;
    };
    // Shard 0 moves online and back, shard 1 offline and back; shard 5 stays.
    const apps = [startApp(appFile, keyOn(0)), startApp(appFile, keyOn(1)), startApp(appFile, keyOn(5))];
    try {
      for (const app of apps) await waitForCalls(app, 10);
      for (const round of [1, 2]) {
        fleet.writeMigration(
          `000${round * 2}_tags_${round}.sql`,
          `CREATE TABLE tags_${round} (photo_id bigint NOT NULL, tag text NOT NULL, PRIMARY KEY (photo_id, tag));\n`,
        );
        fleet.writeMigration(
          `000${round * 2 + 1}_photos_user_${round}.sql`,
          `-- shardctl:no-transaction\nCREATE INDEX CONCURRENTLY IF NOT EXISTS photos_user_${round} ON photos (user_id);\n`,
        );
        await cli(['init']);
        await cli(['add-schema', '0-7']);
        await cli(['migrate', '--canary', '2']);
        await cli(['migrate']);
        await cli(['status']);
        await cli(['exec', '--json', 'select count(*) from photos']);
        await cli(['grant', role, '--app']);
        // Each to the other host (an online and an offline move), then rebalance evens the hosts out.
        await cli(['move-shard', '0', '--to', await otherHost(0), '--yes']);
        await cli(['move-shard', '1', '--to', await otherHost(1), '--mode', 'offline', '--yes']);
        await cli(['gc', '--yes']);
        await cli(['map', 'pull']);
        await cli(['rebalance', '--yes']);
        await cli(['gc', '--yes']);
        for (const app of apps) await waitForCalls(app, app.calls.length + 5);
      }
    } finally {
      await Promise.all(apps.map((app) => app.stop()));
    }
    const calls = apps.flatMap((app) => app.calls);
    expect(calls.filter((c) => !c.ok)).toEqual([]);
    const ids = calls.map((c) => c.id!);
    // Every acknowledged row, read back where the fleet says each shard is: there once.
    const found = new Map<string, number>();
    const router = await ShardRouter.open(fleet.configFile);
    try {
      for (const shard of [0, 1, 5]) {
        const rows = await router.withShard(shard, (client) =>
          client.query<{ id: string }>('SELECT id::text AS id FROM photos WHERE id = ANY($1::bigint[])', [ids]),
        );
        for (const row of rows.rows) found.set(row.id, (found.get(row.id) ?? 0) + 1);
      }
    } finally {
      await router.close();
    }
    expect(ids.filter((id) => found.get(id) !== 1)).toEqual([]);
    expect(new Set(ids).size).toBe(ids.length);
    expect(ids.length).toBeGreaterThan(30);
    // About thirty commands, each followed by a look at every server connection: 30-40 s on a quiet
    // machine, three times that on a loaded one.
  }, 360_000);

  it('adopt takes over a fleet built as the article builds it, through the pooler, and leaves the pooled connections clean', async () => {
    await buildArticleFleet(dbAdopt.urls, 'pad', ['0-1', '2-3']);
    const fleet = makeFleet({
      urls: dbAdopt.urls,
      shards: 4,
      split: ['0-1', '2-3'],
      schemaPrefix: 'pad',
      migrations: { '0001_baseline.sql': BASELINE },
    });
    pooledWithDirect(fleet.configFile, dbAdopt.urls, poolers);
    for (let round = 1; round <= 2; round++) {
      const run = await runCli(['adopt', '--baseline', '1', '--yes', '-c', fleet.configFile]);
      expect({ round, code: run.code, stderr: run.stderr }).toEqual({ round, code: 0, stderr: expect.any(String) });
      await expectCleanPools(dbAdopt.urls, poolers, `adopt ${round}`);
    }
    const status = await runCli(['status', '-c', fleet.configFile]);
    expect({ code: status.code, stderr: status.stderr }).toEqual({ code: 0, stderr: expect.any(String) });
  });

  it('an online move through the pooler under 20 concurrent routed writers: 0 failed calls, every acknowledged row once on the final host', async () => {
    const fleet = makeFleet({
      urls: dbBusy.urls,
      shards: 4,
      split: ['0-1', '2-3'],
      schemaPrefix: 'pbw',
      migrations: PHOTOS_ONLY,
    });
    pooledWithDirect(fleet.configFile, dbBusy.urls, poolers);
    const config = await fleet.config();
    expect((await init(config)).ok).toBe(true);
    // The same file without directUrl: the move is refused before it changes anything, saying what to set.
    const noDirect = join(fleet.dir, 'no-direct.yaml');
    writeFileSync(noDirect, readFileSync(fleet.configFile, 'utf8').replace(/^ {4}directUrl: .*\n/gm, ''));
    const refused = await runCli(['move-shard', '0', '--to', 'pg2', '--yes', '-c', noDirect]);
    expect({ code: refused.code, stderr: refused.stderr }).toEqual({
      code: 1,
      stderr: expect.stringMatching(/nothing was changed[\s\S]*looks like a connection pooler's: set pg1's directUrl/),
    });
    const status = await runCli(['status', '-c', fleet.configFile]);
    expect({ code: status.code, stderr: status.stderr }).toEqual({ code: 0, stderr: expect.any(String) });
    const router = await ShardRouter.open(fleet.configFile, { poolSize: 20, fencedTimeoutMs: 30_000 });
    const acknowledged: string[] = [];
    const failures: string[] = [];
    let stop = false;
    const writers = Array.from({ length: 20 }, async (_, writer) => {
      while (!stop) {
        await router
          .withShard(0, async (client) => {
            const r = await client.query<{ id: string }>(
              'INSERT INTO photos (user_id, image_url) VALUES ($1, $2) RETURNING id',
              [String(writer), 'busy'],
            );
            return r.rows[0]!.id;
          })
          .then(
            (id) => void acknowledged.push(id),
            (error: unknown) => void failures.push((error as Error).message),
          );
      }
    });
    try {
      while (acknowledged.length < 200) await new Promise((resolve) => setTimeout(resolve, 20));
      const result = await moveShards(config, [0], 'pg2', { configFile: fleet.configFile });
      expect(result.moves.map((m) => m.outcome)).toEqual(['moved']);
      const after = acknowledged.length;
      while (acknowledged.length < after + 200) await new Promise((resolve) => setTimeout(resolve, 20));
    } finally {
      stop = true;
      await Promise.all(writers);
      await router.close();
    }
    expect(failures).toEqual([]);
    const rows = await withClient(dbBusy.urls[1]!, (c) =>
      c.query<{ id: string; n: number }>(
        'SELECT id::text AS id, count(*)::int AS n FROM pbw0.photos WHERE id = ANY($1::bigint[]) GROUP BY id',
        [acknowledged],
      ),
    );
    expect(rows.rows.filter((r) => r.n !== 1)).toEqual([]);
    expect(rows.rows.length).toBe(acknowledged.length);
    await expectCleanPools(dbBusy.urls, poolers, 'move under 20 writers');
  });
});
