import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { init } from '../../src/commands/init.js';
import { moveShards } from '../../src/commands/move-shard.js';
import { loadConfig } from '../../src/config/load.js';
import { ShardRouter } from '../../src/router/router.js';
import { makeFleet, runCli } from '../helpers/fleet.js';
import { useTestDatabases } from '../helpers/hosts.js';
import { startPgBouncer, type PgBouncer } from '../helpers/pgbouncer.js';

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
];

/**
 * What every server connection of the pooler's pool for `url` holds: `poolSize` transactions held
 * open at once through the pooler each run on a server connection of their own, so together they
 * see every connection the pool has (and new ones, which hold the defaults anyway).
 */
async function serverConnections(url: string, poolSize: number): Promise<Record<string, string>[]> {
  const clients = await Promise.all(
    Array.from({ length: poolSize }, async () => {
      const client = new pg.Client({ connectionString: url });
      await client.connect();
      await client.query('BEGIN');
      return client;
    }),
  );
  try {
    return await Promise.all(
      clients.map(async (client) => {
        const r = await client.query<{ name: string; setting: string }>(
          `SELECT name, current_setting(name) AS setting FROM unnest($1::text[]) AS name`,
          [WATCHED],
        );
        return Object.fromEntries([
          ['pid', String((await client.query<{ pid: number }>('SELECT pg_backend_pid() AS pid')).rows[0]!.pid)],
          ...r.rows.map((row) => [row.name, row.setting]),
        ]) as Record<string, string>;
      }),
    );
  } finally {
    await Promise.all(clients.map((client) => client.query('COMMIT').then(() => client.end())));
  }
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
    return Object.fromEntries(r.rows.map((row) => [row.name, row.setting]));
  } finally {
    await client.end();
  }
}

describe('behind PgBouncer in transaction mode', () => {
  const db = useTestDatabases(2);
  /** Databases of their own for the router's fleet (another layout: 8 shards, prefix pr). */
  const dbRouter = useTestDatabases(2);
  /** And for the move's. */
  const dbMove = useTestDatabases(2);
  const poolers: PgBouncer[] = [];

  beforeAll(async () => {
    for (const url of [...db.urls, ...dbRouter.urls, ...dbMove.urls]) await durableCommits(url);
    for (const url of db.urls) poolers.push(await startPgBouncer(url, { poolSize: 4 }));
  });
  afterAll(async () => {
    await Promise.all(poolers.map((p) => p.stop()));
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

  it("the router's statementTimeoutMs and idleInTransactionTimeoutMs hold per transaction through the pooler, and leave nothing behind", async () => {
    const pooled = dbRouter.urls.map((url, i) => poolers[i]!.url(url));
    // init directly, then the application's config through the poolers (same hosts, same fleet).
    const fleet = makeFleet({ urls: dbRouter.urls, shards: 8, schemaPrefix: 'pr', migrations: PHOTOS_ONLY });
    expect((await init(await fleet.config())).ok).toBe(true);
    const configText = (await import('node:fs')).readFileSync(fleet.configFile, 'utf8');
    const pooledFile = join(fleet.dir, 'pooled.yaml');
    writeFileSync(
      pooledFile,
      dbRouter.urls.reduce((text, url, i) => text.replace(url, pooled[i]!), configText),
    );
    expect((await loadConfig(pooledFile)).hosts.map((h) => h.url)).toEqual(pooled);

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
                client.query(`INSERT INTO photos (user_id, image_url) VALUES ($1, 'x')`, [String(caller * 100 + i)]),
              )
              .catch(() => (failed += 1));
          }
        }),
      );
      expect(failed).toBe(0);
      // A statement past the timeout is cancelled by the server, as it is without the pooler.
      const started = Date.now();
      const error = await router
        .withShard(0, (client) => client.query('SELECT pg_sleep(3)'))
        .then(
          () => null,
          (e: unknown) => e as { code?: string },
        );
      expect(error?.code).toBe('57014');
      expect(Date.now() - started).toBeLessThan(2500);
      // Inside the transaction the settings are there; the fan-out's framing counts them.
      const seen = await router.withShard(1, async (client) => {
        const r = await client.query<{ s: string; i: string }>(
          `SELECT current_setting('statement_timeout') AS s, current_setting('idle_in_transaction_session_timeout') AS i`,
        );
        return r.rows[0]!;
      });
      expect(seen).toEqual({ s: '1s', i: '5s' });
      const counts = await router.queryEachShard<{ n: string }>('SELECT count(*) AS n FROM photos', {
        readOnly: true,
        shardsPerQuery: 4,
      });
      expect(counts.reduce((sum, r) => sum + Number(r.value.rows[0]!.n), 0)).toBe(200);
    } finally {
      await router.close();
    }
    for (const [i, url] of dbRouter.urls.entries()) {
      const expected = await defaults(url);
      for (const connection of await serverConnections(pooled[i]!, poolers[i]!.poolSize)) {
        const { pid, ...settings } = connection;
        expect({ host: i, pid, settings }).toEqual({ host: i, pid, settings: expected });
      }
    }
  });

  it('an online move of a fleet whose url goes through the pooler connects to directUrl, and leaves the pooled connections clean', async () => {
    const pooled = dbMove.urls.map((url, i) => poolers[i]!.url(url));
    const fleet = makeFleet({ urls: pooled, shards: 4, schemaPrefix: 'pm', migrations: PHOTOS_ONLY });
    // Each host: url through the pooler, directUrl the server itself.
    let text = readFileSync(fleet.configFile, 'utf8');
    for (const [i, url] of pooled.entries())
      text = text.replace(`    url: ${url}\n`, `    url: ${url}\n    directUrl: ${dbMove.urls[i]}\n`);
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
    const result = await moveShards(config, [0], 'pg2', { configFile: fleet.configFile });
    expect(result.moves.map((m) => m.outcome)).toEqual(['moved']);
    const reader = new pg.Client({ connectionString: pooled[1]! });
    await reader.connect();
    try {
      expect((await reader.query<{ n: number }>('SELECT count(*)::int AS n FROM pm0.photos')).rows[0]!.n).toBe(300);
    } finally {
      await reader.end();
    }
    for (const [i, url] of dbMove.urls.entries()) {
      const expected = await defaults(url);
      for (const connection of await serverConnections(pooled[i]!, poolers[i]!.poolSize)) {
        const { pid, ...settings } = connection;
        expect({ host: i, pid, settings }).toEqual({ host: i, pid, settings: expected });
      }
    }
  });
});
