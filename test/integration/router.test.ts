import { readFileSync, writeFileSync } from 'node:fs';
import { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { describe, expect, it } from 'vitest';
import pg from 'pg';
import { from as copyFrom } from 'pg-copy-streams';
import { decodeId } from '../../src/id/layout.js';
import { moveShard } from '../../src/commands/move-shard.js';
import { init } from '../../src/commands/init.js';
import {
  addSchema,
  adopt,
  checkMigrations,
  devAddHost,
  devDown,
  devUp,
  discoverFleet,
  execSql,
  gc,
  grant,
  mapPull,
  mapSetAddress,
  migrate,
  moveShards,
  newMigration,
  readMigrations,
  rebalance,
  shardLoad,
  shardSizes,
} from '../../src/index.js';
import { HostError } from '../../src/errors.js';
import { ShardFanOutError } from '../../src/router/errors.js';
import { setBeginPipelining } from '../../src/router/begin.js';
import { ShardRouter } from '../../src/router/router.js';
import { makeFleet } from '../helpers/fleet.js';
import { errorOf, stillRunningAfter, useTestDatabases, withClient } from '../helpers/hosts.js';

const PHOTOS_ONLY = {
  '0001_photos.sql': `CREATE SEQUENCE photos_id_seq;
CREATE TABLE photos (id bigint PRIMARY KEY DEFAULT next_id('photos_id_seq'), user_id bigint NOT NULL, image_url text NOT NULL);
ALTER SEQUENCE photos_id_seq OWNED BY photos.id;`,
};

/** Connections to this database with this application name, on one host. */
async function connectionsOf(url: string, applicationName: string): Promise<number> {
  return withClient(url, async (c) => {
    const r = await c.query<{ n: string }>(
      `select count(*) as n from pg_stat_activity where datname = current_database() and application_name = $1`,
      [applicationName],
    );
    return Number(r.rows[0]!.n);
  });
}

/**
 * connectionsOf once none is left, or after 10 s: a closed connection's server process exits after
 * the client has gone, not before close() returns.
 */
async function connectionsLeft(url: string, applicationName: string): Promise<number> {
  let left = await connectionsOf(url, applicationName);
  for (const started = Date.now(); left > 0 && Date.now() - started < 10_000;) {
    await new Promise((resolve) => setTimeout(resolve, 50));
    left = await connectionsOf(url, applicationName);
  }
  return left;
}

describe('ShardRouter', () => {
  const db = useTestDatabases(2);

  it('writes by key into the shard of key mod shards, with ids carrying it, and reads them back by id', async () => {
    const fleet = makeFleet({
      urls: db.urls,
      shards: 8,
      split: ['0-3', '4-7'],
      schemaPrefix: 'rk',
      migrations: PHOTOS_ONLY,
    });
    const config = await fleet.config();
    expect((await init(config)).ok).toBe(true);
    const router = await ShardRouter.open(fleet.configFile);
    try {
      const keys = [0n, 1n, 5n, 12n, 31341n, 2n ** 62n + 3n];
      const written: { key: bigint; shard: number; id: bigint }[] = [];
      for (const key of keys) {
        const { shard, id } = await router.withKey(key, async (client, shard) => {
          const r = await client.query<{ id: string }>(
            `insert into photos (user_id, image_url) values ($1, 'x') returning id`,
            [key.toString()],
          );
          return { shard, id: BigInt(r.rows[0]!.id) };
        });
        expect(shard).toBe(Number(key % 8n));
        expect(decodeId(id, config.idLayout).shard).toBe(shard);
        written.push({ key, shard, id });
      }
      // Independently: each row is in that shard's schema, on the host the map gives it.
      for (const { key, shard, id } of written) {
        const url = shard < 4 ? db.urls[0]! : db.urls[1]!;
        const r = await withClient(url, (c) =>
          c.query<{ user_id: string }>(`select user_id from rk${shard}.photos where id = $1`, [id.toString()]),
        );
        expect(r.rows).toEqual([{ user_id: key.toString() }]);
      }
      // Reads by id (bigint or decimal string) find the row without being told the shard.
      for (const { key, id } of written) {
        for (const form of [id, id.toString()]) {
          const userId = await router.withId(form, async (client) => {
            const r = await client.query<{ user_id: string }>('select user_id from photos where id = $1', [
              id.toString(),
            ]);
            return r.rows[0]?.user_id;
          });
          expect(userId).toBe(key.toString());
        }
      }
      await expect(router.withId('12abc', async () => 1)).rejects.toThrow(/not a decimal 64-bit id/);
      await expect(router.withShard(8, async () => 1)).rejects.toThrow(/shard 8: is not in the map \(0-7\)/);
    } finally {
      await router.close();
    }
  });
});

describe('ShardRouter', () => {
  const db = useTestDatabases(2);

  it('rolls back when fn throws, and the search_path does not outlive the transaction', async () => {
    const fleet = makeFleet({
      urls: db.urls,
      shards: 4,
      split: ['0-3', ''],
      schemaPrefix: 'rb',
      migrations: PHOTOS_ONLY,
    });
    expect((await init(await fleet.config())).ok).toBe(true);
    // One connection: every call below reuses it.
    const router = await ShardRouter.open(fleet.configFile, {
      poolSize: 1,
      statementTimeoutMs: 1234,
      applicationName: 'router-rb-test',
    });
    try {
      await expect(
        router.withShard(2, async (client) => {
          await client.query(`insert into photos (user_id, image_url) values (7, 'rolled back')`);
          throw new Error('changed my mind');
        }),
      ).rejects.toThrow('changed my mind');
      const seen = await router.withShard(3, async (client) => {
        const r = await client.query<{ path: string; app: string; timeout: string; source: string }>(
          `select current_setting('search_path') as path, current_setting('application_name') as app, current_setting('statement_timeout') as timeout,
             (select source from pg_settings where name = 'statement_timeout') as source`,
        );
        return r.rows[0];
      });
      // Straight to the server (no directUrl beside url): the timeout is the connection's startup
      // parameter (source 'client'), not a statement of each transaction.
      expect(seen).toEqual({ path: 'rb3, pg_temp', app: 'router-rb-test', timeout: '1234ms', source: 'client' });
      // And it is enforced.
      const cancelled = await router
        .withShard(1, (client) => client.query('select pg_sleep(3)'))
        .then(
          () => null,
          (e: { code?: string }) => e.code,
        );
      expect(cancelled).toBe('57014');
      // The same connection, next call, another shard: its own schema, not the previous one's.
      await router.withShard(0, (client) => client.query(`insert into photos (user_id, image_url) values (0, 'zero')`));
      await withClient(db.urls[0]!, async (c) => {
        const r = await c.query(
          `select (select count(*) from rb0.photos) as rb0, (select count(*) from rb2.photos) as rb2, (select count(*) from rb3.photos) as rb3`,
        );
        expect(r.rows).toEqual([{ rb0: '1', rb2: '0', rb3: '0' }]);
      });
      const readOnly = await router
        .withShard(1, (client) => client.query(`insert into photos (user_id, image_url) values (1, 'x')`), {
          readOnly: true,
        })
        .then(
          () => null,
          (e: { code?: string }) => e.code,
        );
      expect(readOnly).toBe('25006');
    } finally {
      await router.close();
    }
    expect(await connectionsLeft(db.urls[0]!, 'router-rb-test')).toBe(0);
  });
});

describe('ShardRouter: what fn throws, and a connection the server ends', () => {
  const db = useTestDatabases(2);

  it('passes on whatever fn throws (undefined and null too), and a transaction the server ends for its idle timeout fails once, naming host and shard, not retried as a failover', async () => {
    const fleet = makeFleet({
      urls: db.urls,
      shards: 4,
      split: ['0-3', ''],
      schemaPrefix: 'ri',
      migrations: PHOTOS_ONLY,
    });
    expect((await init(await fleet.config())).ok).toBe(true);
    const router = await ShardRouter.open(fleet.configFile, { poolSize: 2, idleInTransactionTimeoutMs: 300 });
    try {
      for (const thrown of [undefined, null, 'text', 0]) {
        const seen = await router
          .withShard(2, async (client) => {
            await client.query(`insert into photos (user_id, image_url) values (2, 'rolled back')`);
            // What an application may throw, however odd: the router must pass it on unchanged.
            // eslint-disable-next-line @typescript-eslint/only-throw-error
            throw thrown;
          })
          .then(
            () => ({ resolved: true }),
            (error: unknown) => ({ error }),
          );
        expect(seen).toEqual({ error: thrown });
      }
      // fn idle in its transaction past the timeout: the server ends the connection (FATAL 25P03).
      let runs = 0;
      const started = Date.now();
      const error = await router
        .withShard(2, async (client) => {
          runs += 1;
          await client.query(`insert into photos (user_id, image_url) values (2, 'idle')`);
          await new Promise((resolve) => setTimeout(resolve, 900));
          return client.query('select 1');
        })
        .then(
          () => null,
          (e: unknown) => e as HostError,
        );
      expect(error).toBeInstanceOf(HostError);
      expect({ code: error?.code, host: error?.host, shard: error?.shard }).toEqual({
        code: '25P03',
        host: 'pg1',
        shard: 2,
      });
      expect(error?.message).toMatch(
        /^host pg1, shard 2: the server ended the transaction: fn left it idle longer than idleInTransactionTimeoutMs/,
      );
      // Once, not again and again until failoverTimeoutMs (it was 6 runs over 18 s).
      expect(runs).toBe(1);
      expect(Date.now() - started).toBeLessThan(5000);
      // Nothing of those calls was committed, and the next call gets a working connection.
      const count = await router.withShard(2, (client) =>
        client.query<{ n: string }>('select count(*)::text as n from photos'),
      );
      expect(count.rows[0]!.n).toBe('0');
    } finally {
      await router.close();
    }
    // The statement timeout names host and shard too, and keeps its SQLSTATE; so does fn's end().
    const timed = await ShardRouter.open(fleet.configFile, { poolSize: 1, statementTimeoutMs: 200 });
    try {
      for (const fn of [
        (client: pg.PoolClient) => client.query('select pg_sleep($1)', [5]),
        async (client: pg.PoolClient) => {
          await client.query('select 1');
          return client.query('select pg_sleep(5)');
        },
      ]) {
        const error = await timed.withShard(1, fn).then(
          () => null,
          (e: unknown) => e as HostError,
        );
        expect(error).toBeInstanceOf(HostError);
        expect({ code: error?.code, host: error?.host, shard: error?.shard }).toEqual({
          code: '57014',
          host: 'pg1',
          shard: 1,
        });
        expect(error?.message).toMatch(
          /^host pg1, shard 1: a statement ran past its statement_timeout \(statementTimeoutMs: 200 ms\): canceling statement due to statement timeout/,
        );
      }
      await expect(
        timed.withShard(1, async (client) => {
          await client.query('select 1');
          await client.end();
        }),
      ).rejects.toMatchObject({ code: 'USAGE', message: /must not release or end the client/ });
      expect((await timed.withShard(1, (client) => client.query('select 1 as x'))).rows).toEqual([{ x: 1 }]);
    } finally {
      await timed.close();
    }
    // A call after close() is the application's mistake, said as such (not a host that is down).
    await expect(router.withShard(0, (client) => client.query('select 1'))).rejects.toMatchObject({
      code: 'ROUTER_CLOSED',
      message: 'the ShardRouter is closed: a call made after close() does not run',
    });
  });
});

describe('ShardRouter.close() with calls in flight', () => {
  const db = useTestDatabases(1);

  it('lets the running calls finish and fails those still waiting for a pooled connection with ROUTER_CLOSED, at once', async () => {
    const fleet = makeFleet({ urls: db.urls, shards: 4, split: ['0-3'], schemaPrefix: 'rq', migrations: PHOTOS_ONLY });
    expect((await init(await fleet.config())).ok).toBe(true);
    const router = await ShardRouter.open(fleet.configFile, { poolSize: 2, mapRefreshMs: 0 });
    const outcomes = Array.from({ length: 10 }, (_, i) =>
      router
        .withKey(BigInt(i), async (client) => {
          await client.query(`insert into photos (user_id, image_url) values ($1, 'x')`, [i]);
          await client.query('select pg_sleep(0.3)');
        })
        .then(
          () => 'ok',
          (e: unknown) => (e as { code?: string }).code ?? String(e),
        ),
    );
    await new Promise((resolve) => setTimeout(resolve, 100));
    const started = Date.now();
    await router.close();
    // Every call settles: none left waiting for ever (pg-pool's end() answers no waiter).
    const settled = await Promise.race([
      Promise.all(outcomes),
      new Promise<'hung'>((resolve) => setTimeout(() => resolve('hung'), 5_000)),
    ]);
    expect(settled).not.toBe('hung');
    const results = settled as string[];
    expect(results.filter((r) => r === 'ok')).toHaveLength(2);
    expect(results.filter((r) => r === 'ROUTER_CLOSED')).toHaveLength(8);
    expect(Date.now() - started).toBeLessThan(3_000);
    // The rows of the two that ran are there; the others wrote nothing.
    const rows = await withClient(db.urls[0]!, (c) =>
      c.query<{ n: string }>(
        `select ((select count(*) from rq0.photos) + (select count(*) from rq1.photos) + (select count(*) from rq2.photos) + (select count(*) from rq3.photos))::text as n`,
      ),
    );
    expect(rows.rows[0]!.n).toBe('2');
  });
});

describe("ShardRouter: fn's queries that would leave the transaction", () => {
  const db = useTestDatabases(1);

  it('are refused before anything is sent, the call rolled back and the connection kept; SET LOCAL and savepoints run', async () => {
    const fleet = makeFleet({ urls: db.urls, shards: 2, split: ['0-1'], schemaPrefix: 'rk', migrations: PHOTOS_ONLY });
    expect((await init(await fleet.config())).ok).toBe(true);
    const router = await ShardRouter.open(fleet.configFile, { poolSize: 1 });
    try {
      const insert = `insert into photos (user_id, image_url) values (1, 'x')`;
      for (const text of [
        'COMMIT',
        `${insert}; commit; ${insert}`,
        'set search_path to rk0',
        'SET LOCAL search_path TO public',
        'listen everyone',
        'prepare p as select 1',
        'select pg_advisory_lock(1)',
        'discard all',
        'DO $$BEGIN CREATE TEMP TABLE photos (LIKE photos INCLUDING ALL); END$$',
        "DO $$BEGIN EXECUTE 'SET ROLE pg_monitor'; END$$",
      ]) {
        const error = await router
          .withShard(1, async (client) => {
            await client.query(insert);
            await client.query(text);
          })
          .then(
            () => null,
            (e: unknown) => e as Error & { code?: string },
          );
        expect({ text, code: error?.code }).toEqual({ text, code: 'USAGE' });
        expect(error?.message).toMatch(/^fn's query: line 1 .*nothing was sent\)$/);
        // The same text as fn's first query (the one that carries BEGIN), through a query config.
        await expect(router.withShard(1, (client) => client.query({ text }))).rejects.toMatchObject({ code: 'USAGE' });
      }
      // Nothing of those calls was committed; the one connection is still the shard's, in its schema.
      const state = await router.withShard(1, async (client) => {
        await client.query('SET LOCAL statement_timeout = 5000');
        await client.query('SAVEPOINT s');
        await client.query(insert);
        await client.query('ROLLBACK TO SAVEPOINT s');
        await client.query('RELEASE SAVEPOINT s');
        return client.query<{ n: string; path: string; timeout: string }>(
          `select (select count(*) from photos)::text as n, current_setting('search_path') as path, current_setting('statement_timeout') as timeout`,
        );
      });
      expect(state.rows[0]).toEqual({ n: '0', path: 'rk1, pg_temp', timeout: '5s' });
      const after = await router.withShard(1, (client) =>
        client.query<{ timeout: string; listening: string }>(
          `select current_setting('statement_timeout') as timeout, (select count(*) from pg_listening_channels())::text as listening`,
        ),
      );
      expect(after.rows[0]).toEqual({ timeout: '0', listening: '0' });
    } finally {
      await router.close();
    }
  });
});

describe('ShardRouter: a connection exception the server sends as a plain error', () => {
  const db = useTestDatabases(1);

  it('a Bind with the wrong number of parameters (08P01, severity ERROR) fails the call once, as a plain pool would: not retried as a lost connection, not a commit of unknown outcome', async () => {
    const fleet = makeFleet({ urls: db.urls, shards: 2, split: ['0-1'], schemaPrefix: 'rp', migrations: PHOTOS_ONLY });
    expect((await init(await fleet.config())).ok).toBe(true);
    const router = await ShardRouter.open(fleet.configFile, { poolSize: 1 });
    try {
      let runs = 0;
      const started = Date.now();
      const error = await router
        .withShard(1, async (client) => {
          runs++;
          await client.query(`insert into photos (user_id, image_url) values (1, 'rolled back')`);
          return client.query('select 1', [1]);
        })
        .then(
          () => null,
          (e: unknown) => e as Error & { code?: string },
        );
      expect({ runs, code: error?.code, retriedFor: Date.now() - started < 5_000 }).toEqual({
        runs: 1,
        code: '08P01',
        retriedFor: true,
      });
      // The call that is one statement (BEGIN and COMMIT sent with it): the statement failed at
      // Bind, so nothing ran, and that is what the caller hears.
      await expect(
        router.withShard(1, (client) => client.query('select count(*) from photos where user_id = $1', ['1', 'extra'])),
      ).rejects.toMatchObject({ code: '08P01' });
      // Nothing was committed, and the connection still serves the shard.
      const n = await router.withShard(1, (client) =>
        client.query<{ n: string }>('select count(*)::text as n from photos'),
      );
      expect(n.rows[0]!.n).toBe('0');
    } finally {
      await router.close();
    }
  });
});

describe('ShardRouter: a temporary table left on a pooled connection', () => {
  const db = useTestDatabases(1);

  it("never stands in for another shard's table: a write and a read of a later call reach the shard's own", async () => {
    const fleet = makeFleet({ urls: db.urls, shards: 2, split: ['0-1'], schemaPrefix: 'rt', migrations: PHOTOS_ONLY });
    expect((await init(await fleet.config())).ok).toBe(true);
    // What the statement check cannot see: a function that makes a temporary table of a shard's
    // table's name (the same would come of any code the server runs on the caller's behalf).
    await withClient(db.urls[0]!, (c) =>
      c.query(
        `create function public.make_temp() returns void language plpgsql as $$ begin create temp table photos (like rt0.photos including all); end $$`,
      ),
    );
    const router = await ShardRouter.open(fleet.configFile, { poolSize: 1 });
    try {
      await router.withShard(0, (client) => client.query('select public.make_temp()'));
      const id = await router.withShard(1, async (client) => {
        const row = await client.query<{ id: bigint }>(
          `insert into photos (user_id, image_url) values ($1, 'kept') returning id`,
          ['7'],
        );
        return BigInt(row.rows[0]!.id);
      });
      expect(router.shardForId(id)).toBe(1);
      const seen = await router.withShard(1, (client) =>
        client.query<{ n: string; temp: string }>(
          `select (select count(*) from photos)::text as n, (select count(*) from pg_temp.photos)::text as temp`,
        ),
      );
      // The temporary table is still on the one connection, empty; the row is the shard's.
      expect(seen.rows[0]).toEqual({ n: '1', temp: '0' });
    } finally {
      await router.close();
    }
    const kept = await withClient(db.urls[0]!, (c) =>
      c.query<{ n: string }>(`select count(*)::text as n from rt1.photos where image_url = 'kept'`),
    );
    expect(kept.rows[0]!.n).toBe('1');
  });
});

describe('ShardRouter: options it does not know', () => {
  const db = useTestDatabases(1);

  it('refuses a misspelt or ill-typed option when opening and on every kind of call, naming it and the key it most likely meant, and runs nothing', async () => {
    const fleet = makeFleet({ urls: db.urls, shards: 2, split: ['0-1'], schemaPrefix: 'ro', migrations: PHOTOS_ONLY });
    expect((await init(await fleet.config())).ok).toBe(true);
    const open = (options: Record<string, unknown>) =>
      ShardRouter.open(fleet.configFile, options as Parameters<typeof ShardRouter.open>[1]);
    await expect(open({ statementTimeout: 1000 })).rejects.toThrow(
      'router options: unknown key "statementTimeout" (did you mean "statementTimeoutMs"?)',
    );
    await expect(open({ poolsize: 2 })).rejects.toThrow(
      'router options: unknown key "poolsize" (did you mean "poolSize"?)',
    );
    await expect(open({ connectTimeoutMs: '5s' })).rejects.toThrow(
      'connectTimeoutMs "5s": must be a whole number of milliseconds',
    );
    await expect(open({ fencedTimeoutMs: -1 })).rejects.toThrow(
      'fencedTimeoutMs -1: must be a whole number of milliseconds',
    );
    await expect(open({ applicationName: 7 })).rejects.toThrow('applicationName 7: must be a string');
    // A string is shown as one (not as the number it reads like), and every refusal is a UsageError naming the option.
    await expect(open({ poolSize: '10' })).rejects.toMatchObject({
      code: 'USAGE',
      input: 'poolSize',
      message: 'poolSize "10": must be a positive integer',
    });
    await expect(open({ slowCallMs: Number.NaN })).rejects.toThrow('slowCallMs NaN: must be a whole number');
    await expect(open({ statementTimeoutMs: 5000n })).rejects.toThrow(
      "statementTimeoutMs 5000n: must be a whole number of milliseconds (0: the server's setting)",
    );
    await expect(
      ShardRouter.open(fleet.configFile, null as unknown as Parameters<typeof ShardRouter.open>[1]),
    ).rejects.toThrow('router options: must be an object of options, not null');
    type Source = Parameters<typeof ShardRouter.open>[0];
    await expect(ShardRouter.open({ seed: [db.urls[0]!] } as unknown as Source)).rejects.toThrow(
      'router source: unknown key "seed" (did you mean "seeds"?)',
    );
    await expect(ShardRouter.open({ seeds: db.urls[0]! } as unknown as Source)).rejects.toThrow(
      'seeds: must be a list of URLs',
    );
    await expect(ShardRouter.open(42 as unknown as Source)).rejects.toThrow(
      'router source: must be a config file path or { seeds: [URL, …] }',
    );

    const router = await ShardRouter.open(fleet.configFile, { poolSize: 1 });
    try {
      const insert = (client: pg.PoolClient) => client.query(`insert into photos (user_id, image_url) values (1, 'x')`);
      const misspelt = { readonly: true } as unknown as { readOnly: boolean };
      for (const error of [
        await errorOf(router.withKey(1n, insert, misspelt)),
        await errorOf(router.withShard(1, insert, misspelt)),
        await errorOf(router.forEachShard(insert, misspelt)),
        await errorOf(router.queryEachShard(`select 1`, misspelt)),
      ]) {
        expect(error.message).toMatch(/options: unknown key "readonly" \(did you mean "readOnly"\?\)$/);
        expect(error.code).toBe('USAGE');
      }
      // Parameters where the options go: refused, not run on every shard without them.
      const array = await errorOf(
        router.queryEachShard(`select $1::int`, [1] as unknown as Parameters<ShardRouter['queryEachShard']>[1]),
      );
      expect(array.message).toBe('queryEachShard options: must be an object of options, not an array');
      const page = await errorOf(
        router.queryPage(`select id from photos`, { limit: 5, ordr: 'oldest' } as unknown as { limit: number }),
      );
      expect(page.message).toBe('queryPage options: unknown key "ordr" (did you mean "order"?)');
      // Known keys of the wrong type: from JavaScript, readOnly 'false' would read as true and
      // perHost '2' as a number. Each refused naming the option and its value, as a rejection.
      const ill = (o: Record<string, unknown>) => o as unknown as { readOnly: boolean };
      const typed: [Promise<unknown>, string][] = [
        [router.withShard(1, insert, ill({ readOnly: 'false' })), 'readOnly "false": must be true or false'],
        [router.forEachShard(insert, ill({ perHost: '2' })), 'perHost "2": must be a positive integer'],
        [router.forEachShard(insert, ill({ concurrency: 0 })), 'concurrency 0: must be a positive integer'],
        [
          router.queryEachShard('select $1::int', ill({ params: [1], shardsPerQuery: -1 })),
          'shardsPerQuery -1: must be a positive integer',
        ],
        [router.queryEachShard('select 1', ill({ shards: '1' })), 'shards "1": must be an array of shard numbers'],
        [router.queryEachShard('select 1', ill({ shards: ['1'] })), 'shard "1": must be a shard number'],
        [router.withShard('1' as unknown as number, insert), 'shard "1": must be a shard number'],
        [router.withKey(1 as unknown as bigint, insert), 'key 1: must be a bigint'],
        [router.withId('12x' as unknown as bigint, insert), 'id "12x": is not a decimal 64-bit id'],
        [
          router.queryPage('select id from photos', { limit: 5n as unknown as number }),
          'limit 5n: must be a whole number',
        ],
      ];
      for (const [call, message] of typed) {
        const error = await errorOf(call);
        expect({ message: error.message, code: error.code }).toEqual({
          message: expect.stringContaining(message) as string,
          code: 'USAGE',
        });
      }
      const rows = await withClient(db.urls[0]!, async (c) =>
        Number(
          (
            await c.query<{ n: string }>(
              `select (select count(*) from ro0.photos) + (select count(*) from ro1.photos) as n`,
            )
          ).rows[0]!.n,
        ),
      );
      expect(rows).toBe(0);
    } finally {
      await router.close();
    }
  });
});

describe("the commands' library functions: options they do not know", () => {
  const db = useTestDatabases(1);

  it('refuse a misspelt option (dryrun for dryRun) naming it, before anything is read or written', async () => {
    const fleet = makeFleet({ urls: db.urls, shards: 2, split: ['0-1'], schemaPrefix: 'rc', migrations: PHOTOS_ONLY });
    const config = await fleet.config();
    const typo = { dryrun: true } as unknown as { dryRun: boolean };
    const calls: [string, () => Promise<unknown>][] = [
      ['init options', () => init(config, typo)],
      ['migrate options', () => migrate(config, typo)],
      ['move options', () => moveShards(config, [1], 'pg1', typo)],
      ['rebalance options', () => rebalance(config, typo)],
      ['adopt options', () => adopt(config, typo)],
      ['gc options', () => gc(config, typo)],
      ['map pull options', () => mapPull(config, typo)],
      ['add-schema options', () => addSchema(config, [1], typo)],
      ['grant options', () => grant(config, 'nobody', 'app', typo)],
      ['map set-address options', () => mapSetAddress(config, 'pg1', typo)],
    ];
    for (const [what, call] of calls) {
      const error = await errorOf(call());
      expect(error.message).toBe(`${what}: unknown key "dryrun" (did you mean "dryRun"?)`);
      expect(error.code).toBe('USAGE');
    }
    // The reading calls and the files' and dev hosts' ones, each with a typo of its own option.
    const misspelt: [string, () => Promise<unknown>][] = [
      [
        'shardLoad options: unknown key "partal" (did you mean "partial"?)',
        () => shardLoad(config, { partal: true } as never),
      ],
      [
        'shardSizes options: unknown key "Partial" (did you mean "partial"?)',
        () => shardSizes(config, { Partial: true } as never),
      ],
      [
        'migrate check options: unknown key "toversion" (did you mean "toVersion"?)',
        () => checkMigrations(config, { toversion: 1 } as never),
      ],
      [
        'migration new options: unknown key "notransaction" (did you mean "noTransaction"?)',
        () => newMigration(config, 'x', { notransaction: true } as never),
      ],
      [
        'dev down options: unknown key "destory" (did you mean "destroy"?)',
        () => devDown({ cwd: fleet.dir, destory: true } as never),
      ],
      [
        'dev up options: unknown key "shard" (did you mean "shards"?)',
        () => devUp({ cwd: fleet.dir, shard: 8 } as never),
      ],
      [
        'dev add-host options: unknown key "Name" (did you mean "name"?)',
        () => devAddHost({ cwd: fleet.dir, Name: 'pg9' } as never),
      ],
      [
        'discoverFleet options: unknown key "applicationname" (did you mean "applicationName"?)',
        () => discoverFleet([], { applicationname: 'x' } as never),
      ],
    ];
    for (const [message, call] of misspelt) expect((await errorOf(call())).message).toBe(message);
    // No migration file was written.
    expect((await readMigrations(config.migrationsDir)).length).toBe(Object.keys(PHOTOS_ONLY).length);
    // Nothing was made: the init above was refused before it connected.
    const schemas = await withClient(db.urls[0]!, async (c) =>
      Number(
        (await c.query<{ n: string }>(`select count(*) as n from pg_namespace where nspname like 'rc%'`)).rows[0]!.n,
      ),
    );
    expect(schemas).toBe(0);
    // exec: `shard` for `shards` would have run the text on every shard.
    const router = await ShardRouter.open(fleet.configFile);
    try {
      const misspelt = { shard: [1], write: true } as unknown as { shards: number[] };
      await expect(execSql(router, `select 1`, misspelt)).rejects.toThrow(
        'exec options: unknown key "shard" (did you mean "shards"?)',
      );
    } finally {
      await router.close();
    }
  });
});

describe('ShardRouter: fn gives up on a query that still runs', () => {
  const db = useTestDatabases(1);
  const kept = useTestDatabases(1);

  /** A router of one pooled connection over a new 4-shard fleet of `urls`. */
  async function openRouter(urls: string[], schemaPrefix: string): Promise<ShardRouter> {
    const fleet = makeFleet({ urls, shards: 4, split: ['0-3'], schemaPrefix, migrations: PHOTOS_ONLY });
    expect((await init(await fleet.config())).ok).toBe(true);
    return ShardRouter.open(fleet.configFile, { poolSize: 1 });
  }

  /** The server process of the pool's one connection. */
  async function backendPid(router: ShardRouter): Promise<number> {
    return (await router.withShard(0, (c) => c.query<{ p: number }>('select pg_backend_pid() as p'))).rows[0]!.p;
  }

  it("the query is cancelled on the server and the connection dropped: the call ends with fn's error without waiting for it, and the next call gets a clean connection", async () => {
    const router = await openRouter(db.urls, 'gu');
    try {
      const before = await backendPid(router);
      const started = performance.now();
      const call = router.withShard(1, async (client) => {
        await client.query(`insert into photos (user_id, image_url) values (1, 'given up')`);
        // fn's own timeout, as an application sets one around a slow query.
        await Promise.race([
          client.query('select pg_sleep(60)'),
          new Promise((_, reject) => setTimeout(() => reject(new Error('app timeout')), 200)),
        ]);
      });
      await expect(call).rejects.toThrow('app timeout');
      // Not after the 60 s query: it was cancelled, not waited for.
      expect(performance.now() - started).toBeLessThan(20_000);
      expect(await stillRunningAfter(db.urls[0]!, 'select pg_sleep(60)')).toBe(0);
      // Nothing of the call was committed, and the pool's one connection is a new, clean one.
      expect((await withClient(db.urls[0]!, (c) => c.query('select 1 from gu1.photos'))).rowCount).toBe(0);
      const state = await router.withShard(2, (client) =>
        client.query<{ s: string; x: string | null; p: number }>(
          'select current_schema() as s, pg_current_xact_id_if_assigned()::text as x, pg_backend_pid() as p',
        ),
      );
      expect(state.rows[0]).toMatchObject({ s: 'gu2', x: null });
      expect(state.rows[0]!.p).not.toBe(before);
    } finally {
      await router.close();
    }
  });

  it('a query queued behind the one that failed is let finish: the connection is rolled back and kept', async () => {
    const router = await openRouter(kept.urls, 'gk');
    try {
      const before = await backendPid(router);
      const call = router.withShard(1, async (client) => {
        await client.query('select 1');
        await Promise.all([client.query('select 1/0'), client.query('select pg_sleep(0.01)')]);
      });
      await expect(call).rejects.toMatchObject({ code: '22012' });
      expect(await backendPid(router)).toBe(before);
    } finally {
      await router.close();
    }
  });
});

describe("ShardRouter: fn's client.release()", () => {
  const db = useTestDatabases(1);

  it('is refused: the connection never goes back to the pool mid-call, so a concurrent call cannot share its transaction and write into the other shard', async () => {
    const fleet = makeFleet({ urls: db.urls, shards: 4, split: ['0-3'], schemaPrefix: 'rr', migrations: PHOTOS_ONLY });
    expect((await init(await fleet.config())).ok).toBe(true);
    const router = await ShardRouter.open(fleet.configFile, { poolSize: 1 });
    try {
      let release!: () => void;
      const held = new Promise<void>((resolve) => (release = resolve));
      // Shard 1's call opens its transaction, releases the client (a habit from pool.connect()),
      // and goes on writing once shard 2's call has taken the one connection.
      const first = router.withShard(1, async (client) => {
        await client.query('select $1::int', [1]);
        client.release();
        await Promise.race([held, new Promise((resolve) => setTimeout(resolve, 1000))]);
        await client.query(`insert into photos (user_id, image_url) values (1, 'released')`);
      });
      const second = router.withShard(2, async (client) => {
        release();
        await client.query(`insert into photos (user_id, image_url) values (2, 'other')`);
        return (await client.query<{ s: string }>('select current_schema() as s')).rows[0]!.s;
      });
      await expect(first).rejects.toMatchObject({ code: 'USAGE', message: /must not release or end the client/ });
      await expect(second).resolves.toBe('rr2');
      const rows = await withClient(db.urls[0]!, (c) =>
        c.query<{ s: string; image_url: string }>(
          `select 'rr1' as s, image_url from rr1.photos union all select 'rr2', image_url from rr2.photos order by 1, 2`,
        ),
      );
      // Nothing of shard 1's call was written anywhere; shard 2 holds only its own row.
      expect(rows.rows).toEqual([{ s: 'rr2', image_url: 'other' }]);
      // The pool's one connection is still good, outside any transaction.
      const state = await router.withShard(3, (client) =>
        client.query<{ s: string; x: string | null }>(
          'select current_schema() as s, pg_current_xact_id_if_assigned()::text as x',
        ),
      );
      expect(state.rows[0]).toEqual({ s: 'rr3', x: null });
    } finally {
      await router.close();
    }
  });
});

describe('ShardRouter', () => {
  const db = useTestDatabases(2);

  it('follows an online move: a writer looping through withKey sees no error and every committed row is on the target', async () => {
    const fleet = makeFleet({
      urls: db.urls,
      shards: 8,
      split: ['0-3', '4-7'],
      schemaPrefix: 'mv',
      migrations: PHOTOS_ONLY,
    });
    const config = await fleet.config();
    expect((await init(config)).ok).toBe(true);
    await withClient(db.urls[0]!, (c) =>
      c.query(`insert into mv1.photos (user_id, image_url) select 1, 'seed' from generate_series(1, 2000)`),
    );
    const router = await ShardRouter.open(fleet.configFile);
    // Two more application processes, opened before the move and idle until after it.
    const idle = await ShardRouter.open(fleet.configFile);
    const idleTruncating = await ShardRouter.open(fleet.configFile);
    const committed: bigint[] = [];
    const errors: unknown[] = [];
    const calls = { awaited: 0, returned: 0 };
    const commits = { awaited: 0, returned: 0 };
    let stop = false;
    // Keys 1, 9, 17, ... all route to shard 1, the one that moves. Two writers: one awaits its
    // insert inside fn (BEGIN goes with the insert, COMMIT after fn), the other returns the
    // insert's promise (BEGIN, insert and COMMIT in one round trip).
    const write = async (form: 'awaited' | 'returned', first: bigint): Promise<void> => {
      for (let i = first; !stop; i += 2n) {
        const key = 1n + 8n * i;
        const insert = (client: import('pg').PoolClient) =>
          client.query<{ id: string }>(`insert into photos (user_id, image_url) values ($1, 'w') returning id`, [
            key.toString(),
          ]);
        try {
          const r =
            form === 'awaited'
              ? await router.withKey(key, async (client) => {
                  calls.awaited += 1;
                  return await insert(client);
                })
              : await router.withKey(key, (client) => {
                  calls.returned += 1;
                  return insert(client);
                });
          committed.push(BigInt(r.rows[0]!.id));
          commits[form] += 1;
        } catch (error) {
          errors.push(error);
        }
      }
    };
    const writer = Promise.all([write('awaited', 0n), write('returned', 1n)]);
    try {
      // Counts of commits, not fixed sleeps: on a loaded machine 300 ms may hold only a few commits.
      await expect.poll(() => committed.length, { timeout: 15_000, interval: 20 }).toBeGreaterThan(10);
      const result = await moveShard(config, 1, 'pg2', { configFile: fleet.configFile });
      expect(result.outcome).toBe('moved');
      const afterMove = committed.length;
      await expect.poll(() => committed.length - afterMove, { timeout: 15_000, interval: 20 }).toBeGreaterThan(10);
      stop = true;
      await writer;
      expect(errors).toEqual([]);
      // The fence made some attempts of each writer fail and run again: fn ran more often than it committed.
      expect(calls.awaited).toBeGreaterThan(commits.awaited);
      expect(calls.returned).toBeGreaterThan(commits.returned);
      expect(router.hostForShard(1).name).toBe('pg2');
      await withClient(db.urls[1]!, async (c) => {
        const ids = new Set((await c.query<{ id: string }>('select id from mv1.photos')).rows.map((r) => BigInt(r.id)));
        expect(committed.filter((id) => !ids.has(id))).toEqual([]);
        expect(ids.size).toBe(2000 + committed.length);
      });

      // A next_id() call that the clean-up's rename of the old copy catches midway fails with
      // SC003 (its sequence resolves in the renamed schema): on a host that no longer holds the
      // shard, that is a stale map, followed like SC100; on the holder it is the application's.
      const moved = await withClient(db.urls[0]!, async (c) => {
        const r = await c.query<{ nspname: string }>(
          `select nspname from pg_namespace where nspname like 'mv1\\_moved\\_%'`,
        );
        return r.rows[0]!.nspname;
      });
      const old = idle;
      {
        expect(old.hostForShard(1).name).toBe('pg1');
        let attempts = 0;
        const id = await old.withKey(1n, async (client) => {
          attempts += 1;
          if (attempts === 1) await client.query(`select "${moved}".next_id('"${moved}".photos_id_seq'::regclass)`);
          return (await client.query<{ id: string }>(`select next_id('photos_id_seq') as id`)).rows[0]!.id;
        });
        expect(attempts).toBe(2);
        expect(old.hostForShard(1).name).toBe('pg2');
        expect(BigInt(id)).toBeGreaterThan(committed.at(-1)!);
        // On the holder (shard 4's sequence, also on pg2, given to shard 1's next_id): the application's error.
        await expect(
          old.withKey(1n, (client) => client.query(`select next_id('mv4.photos_id_seq'::regclass)`)),
        ).rejects.toMatchObject({ code: 'SC003' });
      }

      // A TRUNCATE sent to the old name, now views (which take no TRUNCATE: 42809, before any
      // trigger of theirs can say SC100): on a host that no longer holds the shard, a stale map,
      // followed; on the holder, the application's error.
      {
        expect(idleTruncating.hostForShard(1).name).toBe('pg1');
        let attempts = 0;
        await idleTruncating.withKey(1n, (client) => {
          attempts += 1;
          return client.query('truncate photos');
        });
        expect(attempts).toBe(2);
        expect(idleTruncating.hostForShard(1).name).toBe('pg2');
        const left = await withClient(db.urls[1]!, (c) =>
          c.query<{ n: number }>('select count(*)::int as n from mv1.photos'),
        );
        expect(left.rows[0]!.n).toBe(0);
        await withClient(db.urls[1]!, (c) => c.query('create view mv4.not_a_table as select 1 as one'));
        await expect(
          idleTruncating.withKey(4n, (client) => client.query('truncate not_a_table')),
        ).rejects.toMatchObject({ code: '42809' });
      }
    } finally {
      stop = true;
      await writer;
      await router.close();
      await idle.close();
      await idleTruncating.close();
    }
  });
});

describe('ShardRouter', () => {
  const db = useTestDatabases(2);

  it('fans out over 1024 shards on 2 hosts in shard order, bounded per host and overall, and names a failing shard', async () => {
    const fleet = makeFleet({
      urls: db.urls,
      shards: 1024,
      split: ['0-511', '512-1023'],
      schemaPrefix: 'fo',
      migrations: PHOTOS_ONLY,
    });
    expect((await init(await fleet.config())).ok).toBe(true);
    const router = await ShardRouter.open(fleet.configFile, { poolSize: 4 });
    try {
      const running = new Map<string, number>();
      let overall = 0;
      let maxOverall = 0;
      const maxPerHost = new Map<string, number>();
      const count = async (client: import('pg').PoolClient, shard: number) => {
        const host = shard < 512 ? 'pg1' : 'pg2';
        running.set(host, (running.get(host) ?? 0) + 1);
        overall += 1;
        maxOverall = Math.max(maxOverall, overall);
        maxPerHost.set(host, Math.max(maxPerHost.get(host) ?? 0, running.get(host)!));
        try {
          const r = await client.query<{ n: string; schema: string }>(
            'select count(*) as n, current_schema() as schema from photos',
          );
          return r.rows[0]!;
        } finally {
          running.set(host, running.get(host)! - 1);
          overall -= 1;
        }
      };
      const results = await router.forEachShard(count, { concurrency: 6 });
      expect(results).toHaveLength(1024);
      expect(results.map((r) => r.shard)).toEqual(Array.from({ length: 1024 }, (_, i) => i));
      expect(results.every((r) => r.value.schema === `fo${r.shard}` && r.value.n === '0')).toBe(true);
      expect(results[0]!.host).toBe('pg1');
      expect(results[1023]!.host).toBe('pg2');
      expect(maxOverall).toBeLessThanOrEqual(6);
      expect(maxPerHost.get('pg1')).toBeLessThanOrEqual(4);
      expect(maxPerHost.get('pg2')).toBeLessThanOrEqual(4);
      // Both hosts were busy at once: the fan-out is parallel, not host after host.
      expect(maxOverall).toBeGreaterThan(4);

      await withClient(db.urls[1]!, (c) => c.query('drop table fo700.photos'));
      const failed = await router.forEachShard(count).then(
        () => null,
        (e: unknown) => e,
      );
      expect(failed).toBeInstanceOf(ShardFanOutError);
      const error = failed as ShardFanOutError<{ n: string }>;
      expect(error.failures.map((f) => [f.shard, f.host])).toEqual([[700, 'pg2']]);
      expect(error.results).toHaveLength(1023);
      expect(error.message).toContain('1 of 1024 shards failed: shard 700 on pg2: relation "photos" does not exist');
      expect(error.exitCode).toBe(1);
      // A subset, in shard order whatever order it was asked in.
      const some = await router.forEachShard(count, { shards: [900, 3, 511, 512] });
      expect(some.map((r) => [r.shard, r.host])).toEqual([
        [3, 'pg1'],
        [511, 'pg1'],
        [512, 'pg2'],
        [900, 'pg2'],
      ]);
    } finally {
      await router.close();
    }
  });
});

describe('ShardRouter', () => {
  const db = useTestDatabases(2);

  it("ends the pool of a host whose URL a reload changes, keeps the fleet's placement over the file's, and close() ends the rest", async () => {
    const fleet = makeFleet({
      urls: db.urls,
      shards: 4,
      split: ['0-1', '2-3'],
      schemaPrefix: 'rl',
      migrations: PHOTOS_ONLY,
    });
    expect((await init(await fleet.config())).ok).toBe(true);
    const router = await ShardRouter.open(fleet.configFile, { applicationName: 'router-reload-test' });
    try {
      await router.forEachShard(async (client) => (await client.query('select 1')).rowCount);
      expect(router.openPools().sort()).toEqual(['pg1', 'pg2']);
      expect(await connectionsOf(db.urls[1]!, 'router-reload-test')).toBeGreaterThan(0);
      // The file now gives pg1 every shard and reaches pg2 by another name: the fleet still says
      // pg2 holds 2-3, so the router keeps routing there, through a new pool for the new URL.
      const yaml = readFileSync(fleet.configFile, 'utf8');
      const pg2Url = db.urls[1]!;
      const otherUrl = `${pg2Url}${pg2Url.includes('?') ? '&' : '?'}connect_timeout=9`;
      writeFileSync(
        fleet.configFile,
        yaml
          .replace('shards: "0-1"', 'shards: "0-3"')
          .replace('shards: "2-3"', 'shards: ""')
          .replace(`url: ${pg2Url}\n`, `url: ${otherUrl}\n`),
      );
      expect(readFileSync(fleet.configFile, 'utf8')).toContain('connect_timeout=9');
      await router.reload();
      expect(router.openPools()).toEqual(['pg1']);
      await expect.poll(() => connectionsOf(db.urls[1]!, 'router-reload-test')).toBe(0);
      expect(router.hostForShard(3).name).toBe('pg2');
      expect(router.hostForShard(3).url).toBe(otherUrl);
    } finally {
      await router.close();
    }
    expect(await connectionsLeft(db.urls[0]!, 'router-reload-test')).toBe(0);
    expect(router.openPools()).toEqual([]);
  });
});

describe('ShardRouter', () => {
  const db = useTestDatabases(2);

  it('queryEachShard read-only with shardsPerQuery: chunks share a connection, each shard its own transaction and schema; a failing chunk runs shard by shard', async () => {
    const fleet = makeFleet({
      urls: db.urls,
      shards: 16,
      split: ['0-7', '8-15'],
      schemaPrefix: 'ch',
      migrations: PHOTOS_ONLY,
    });
    expect((await init(await fleet.config())).ok).toBe(true);
    const router = await ShardRouter.open(fleet.configFile, { poolSize: 2 });
    const sql = `select 1 as a; select current_schema() as s, count(*)::int as n, (select virtualxid from pg_locks where pid = pg_backend_pid() and locktype = 'virtualxid') as t, pg_backend_pid() as pid from photos -- last\n;`;
    type Row = { s: string; n: number; t: string; pid: number };
    try {
      await withClient(db.urls[1]!, (c) =>
        c.query(`insert into ch9.photos (user_id, image_url) values (9, 'x'), (9, 'y')`),
      );
      const results = await router.queryEachShard<Row>(sql, { readOnly: true, shardsPerQuery: 4, perHost: 1 });
      expect(results.map((r) => [r.shard, r.host, r.value.rows[0]!.s, r.value.rows[0]!.n])).toEqual(
        Array.from({ length: 16 }, (_, i) => [i, i < 8 ? 'pg1' : 'pg2', `ch${i}`, i === 9 ? 2 : 0]),
      );
      // One connection per host; every shard in a transaction of its own (its virtual transaction id,
      // unique per host: two servers can hand out the same one).
      const pid = (shard: number) => results[shard]!.value.rows[0]!.pid;
      expect(new Set(results.map((r) => `${r.host} ${r.value.rows[0]!.t}`)).size).toBe(16);
      expect(new Set([1, 2, 3, 4, 5, 6, 7].map(pid)).size).toBe(1);
      expect(new Set([8, 9, 10, 11, 12, 13, 14, 15].map(pid)).size).toBe(1);

      // Shard 10 fails (division by zero there only): its chunk runs again shard by shard.
      await withClient(db.urls[1]!, (c) =>
        c.query(`insert into ch10.photos (id, user_id, image_url) values (0, 0, 'zero')`),
      );
      const failed = await router
        .queryEachShard<Row>(`select current_schema() as s, count(*) filter (where 1 / id > 0) as n from photos`, {
          readOnly: true,
          shardsPerQuery: 4,
        })
        .then(
          () => null,
          (e: unknown) => e,
        );
      expect(failed).toBeInstanceOf(ShardFanOutError);
      const error = failed as ShardFanOutError<import('pg').QueryResult<Row>>;
      expect(error.failures.map((f) => [f.shard, f.host, (f.error as { code?: string }).code])).toEqual([
        [10, 'pg2', '22012'],
      ]);
      expect(error.results.map((r) => [r.shard, r.value.rows[0]!.s])).toEqual(
        Array.from({ length: 16 }, (_, i) => i)
          .filter((i) => i !== 10)
          .map((i) => [i, `ch${i}`]),
      );
      // The connections are still usable, outside any transaction.
      const after = await router.queryEachShard<Row>('select current_schema() as s', {
        readOnly: true,
        shardsPerQuery: 8,
      });
      expect(after.map((r) => r.value.rows[0]!.s)).toEqual(Array.from({ length: 16 }, (_, i) => `ch${i}`));
      // A text that leaves a quote open fails alone, and so everywhere: never swallowed into one chunk.
      const open = await router
        .queryEachShard(`select 'open`, { readOnly: true, shardsPerQuery: 8 })
        .catch((e: unknown) => e);
      expect((open as ShardFanOutError).failures).toHaveLength(16);
    } finally {
      await router.close();
    }
  });
});

describe('ShardRouter: BEGIN sent with fn’s first query', () => {
  const db = useTestDatabases(1);

  /**
   * What the connection receives while `run` runs: ReadyForQuery messages (one per round trip) and
   * CommandComplete messages (one per statement run; BEGIN and SET LOCAL included when they are
   * sent with the query, none of them when the transaction had started before).
   */
  async function roundTrips<T>(
    client: unknown,
    run: () => Promise<T>,
  ): Promise<{ value: T; trips: number; statements: number }> {
    const connection = (
      client as { connection: { on(e: string, f: () => void): void; off(e: string, f: () => void): void } }
    ).connection;
    let trips = 0;
    let statements = 0;
    const trip = (): void => void (trips += 1);
    const statement = (): void => void (statements += 1);
    connection.on('readyForQuery', trip);
    connection.on('commandComplete', statement);
    try {
      return { value: await run(), trips, statements };
    } finally {
      connection.off('readyForQuery', trip);
      connection.off('commandComplete', statement);
    }
  }

  it('one round trip for BEGIN, search_path and a first query with parameters; any other first query still runs inside the transaction', async () => {
    const fleet = makeFleet({ urls: db.urls, shards: 4, split: ['0-3'], schemaPrefix: 'pb', migrations: PHOTOS_ONLY });
    expect((await init(await fleet.config())).ok).toBe(true);
    // One connection: every call reuses it, so a transaction left open would show in the next one.
    const router = await ShardRouter.open(fleet.configFile, { poolSize: 1 });
    const txid = `select pg_catalog.txid_current()::text as tx, current_setting('search_path') as path`;
    try {
      // With parameters: BEGIN and SET LOCAL travel with it; fn sees only its own result.
      const first = await router.withShard(1, async (client) => {
        const insert = await roundTrips(client, () =>
          client.query<{ id: string }>(`insert into photos (user_id, image_url) values ($1, $2) returning id`, [
            '11',
            'a',
          ]),
        );
        const same = await client.query<{ tx: string; path: string }>(txid);
        const again = await client.query<{ tx: string; path: string }>(`${txid} where $1::int = 1`, [1]);
        return { insert, same: same.rows[0]!, again: again.rows[0]! };
      });
      // BEGIN, SET and the insert ran in that one round trip.
      expect(first.insert.trips).toBe(1);
      expect(first.insert.statements).toBe(3);
      expect(first.insert.value.command).toBe('INSERT');
      expect(first.insert.value.rows).toHaveLength(1);
      expect(first.insert.value.fields.map((f) => f.name)).toEqual(['id']);
      expect(first.same.path).toBe('pb1, pg_temp');
      expect(first.again).toEqual(first.same);

      // Without parameters (a simple query, possibly several statements): BEGIN goes first on its own.
      const simple = await router.withShard(2, async (client) => {
        const both = await roundTrips(client, () => client.query(`select 1 as a; select 2 as b`));
        const tx = await client.query<{ tx: string; path: string }>(txid);
        const tx2 = await client.query<{ tx: string; path: string }>(txid);
        return { both, tx: tx.rows[0]!, tx2: tx2.rows[0]! };
      });
      expect(simple.both.trips).toBe(2);
      expect(simple.both.statements).toBe(4);
      expect((simple.both.value as unknown as unknown[]).length).toBe(2);
      expect(simple.tx).toEqual(simple.tx2);
      expect(simple.tx.path).toBe('pb2, pg_temp');

      // A config object with rowMode and parameters is carried too, and keeps its options.
      const arrays = await router.withShard(3, async (client) =>
        roundTrips(client, () =>
          client.query({
            text: `select $1::int as n, current_setting('search_path') as p`,
            values: [7],
            rowMode: 'array',
          }),
        ),
      );
      expect([arrays.trips, arrays.statements]).toEqual([1, 3]);
      expect(arrays.value.rows).toEqual([[7, 'pb3, pg_temp']]);

      // A named (prepared) statement is not carried: BEGIN first, then it, in the transaction.
      const named = await router.withShard(0, async (client) => {
        const r = await roundTrips(client, () =>
          client.query({
            name: 'pb-named',
            text: `select current_setting('search_path') as p, $1::int as n`,
            values: [1],
          }),
        );
        const tx = await client.query<{ tx: string }>(txid);
        const tx2 = await client.query<{ tx: string }>(txid);
        return {
          trips: r.trips,
          statements: r.statements,
          p: r.value.rows[0].p as string,
          same: tx.rows[0]!.tx === tx2.rows[0]!.tx,
        };
      });
      expect(named).toEqual({ trips: 2, statements: 3, p: 'pb0, pg_temp', same: true });

      // fn that runs no statement: nothing is sent, and the value comes back.
      expect(await router.withShard(1, async () => 'nothing')).toBe('nothing');

      // The carried first query fails: the transaction existed (BEGIN ran), so it is rolled back
      // and the insert before the failure in the same statement list is gone.
      await expect(
        router.withShard(1, (client) =>
          client.query(`insert into photos (user_id, image_url) values ($1, 1/$2::int)`, ['12', 0]),
        ),
      ).rejects.toMatchObject({ code: '22012' });
      // fn catches the failure of its carried first query and goes on: the commit is refused.
      await expect(
        router.withShard(1, async (client) => {
          await client.query(`select 1/$1::int`, [0]).catch(() => undefined);
          return 'caught';
        }),
      ).rejects.toMatchObject({ code: 'TRANSACTION_ABORTED' });
      // Read-only, carried: the write is refused inside the transaction.
      await expect(
        router.withShard(
          1,
          (client) => client.query(`insert into photos (user_id, image_url) values ($1, 'ro')`, ['13']),
          { readOnly: true },
        ),
      ).rejects.toMatchObject({ code: '25006' });

      // fn returns the promise of its only query: COMMIT goes in the same write, one round trip
      // for the whole call (BEGIN, SET, the insert, COMMIT), and the row is committed.
      let whole = { trips: 0, statements: 0 };
      const sole = await router.withShard(1, (client) => {
        const counting = roundTrips(client, () =>
          client.query<{ id: string }>(`insert into photos (user_id, image_url) values ($1, 'sole') returning id`, [
            '14',
          ]),
        );
        void counting.then((r) => (whole = { trips: r.trips, statements: r.statements }));
        return counting.then((r) => r.value);
      });
      // (roundTrips wraps the promise, so that call was not the sole form: BEGIN+SET+insert, then COMMIT.)
      expect(sole.rows).toHaveLength(1);
      expect(whole).toEqual({ trips: 1, statements: 3 });
      const soleTrips = await (async () => {
        let trips = 0;
        let statements = 0;
        let connection: { on(e: string, f: () => void): void; off(e: string, f: () => void): void } | undefined;
        const trip = (): void => void (trips += 1);
        const statement = (): void => void (statements += 1);
        const r = await router.withShard(1, (client) => {
          connection = (client as unknown as { connection: typeof connection }).connection!;
          connection.on('readyForQuery', trip);
          connection.on('commandComplete', statement);
          return client.query<{ user_id: string }>(
            `insert into photos (user_id, image_url) values ($1, 'sole') returning user_id`,
            ['15'],
          );
        });
        connection!.off('readyForQuery', trip);
        connection!.off('commandComplete', statement);
        return { trips, statements, rows: r.rows };
      })();
      // Straight to the server (no pooler), one INSERT: the session's search_path and the insert in
      // one implicit transaction, committed by the Sync: two statements, no BEGIN and no COMMIT.
      expect(soleTrips).toEqual({ trips: 1, statements: 2, rows: [{ user_id: '15' }] });
      await withClient(db.urls[0]!, async (c) => {
        const r = await c.query(`select user_id from pb1.photos where user_id in (14, 15) order by user_id`);
        expect(r.rows).toEqual([{ user_id: '14' }, { user_id: '15' }]);
      });
      // The sole query fails: nothing committed, nothing left open, and no ROLLBACK sent after it
      // (which would warn "there is no transaction in progress").
      const notices: string[] = [];
      const notice = (n: { message?: string }): void => void notices.push(n.message ?? '');
      let pooled: pg.PoolClient | undefined;
      await expect(
        router.withShard(1, (client) => {
          pooled = client;
          client.on('notice', notice);
          return client.query(`insert into photos (user_id, image_url) values ($1, 1/$2::int)`, ['16', 0]);
        }),
      ).rejects.toMatchObject({ code: '22012' });
      pooled!.off('notice', notice);
      expect(notices).toEqual([]);
      // A sole statement that needs a block (LOCK) still gets one; so does a CALL (a procedure could commit without one).
      const lock = await router.withShard(1, (client) =>
        client.query({ text: 'lock table photos in share mode', queryMode: 'extended' } as pg.QueryConfig),
      );
      expect(lock.command).toBe('LOCK');
      // The session's search_path left by a call without a block is not what the next call sees.
      const paths = await router.withShard(
        2,
        async (client) =>
          (await client.query<{ p: string }>(`select current_setting('search_path') as p, $1::int`, [1])).rows[0]!.p,
      );
      expect(paths).toBe('pb2, pg_temp');
      // The COMMIT sent with it fails (a deferred foreign key): the caller gets that error, nothing is committed.
      await withClient(db.urls[0]!, (c) =>
        c.query(
          `create table pb1.parent (id int primary key); create table pb1.child (id int primary key, parent int references pb1.parent deferrable initially deferred)`,
        ),
      );
      await expect(
        router.withShard(1, (client) => client.query(`insert into child values ($1, 999)`, [1])),
      ).rejects.toMatchObject({ code: '23503' });
      // A query started after fn returned its only query's promise would run after that COMMIT: refused.
      let late: unknown;
      await router.withShard(1, (client) => {
        const p = client.query(`insert into photos (user_id, image_url) values ($1, 'first')`, ['17']);
        void p.then(() =>
          client
            .query(`insert into photos (user_id, image_url) values ($1, 'late')`, ['18'])
            .catch((e: Error) => (late = e)),
        );
        return p;
      });
      expect(String(late)).toMatch(/started after the transaction committed/);
      // Two hops later the call is over and the connection back in the pool, with the search_path
      // its call without a block left; later still, it is the next call's (another shard's). A query
      // fn starts then is refused either way: it would run outside its call, in another shard.
      let afterEnd: Promise<unknown> | undefined;
      let whileOther: (() => Promise<unknown>) | undefined;
      await router.withShard(1, (client) => {
        const p = client.query(`insert into photos (user_id, image_url) values ($1, 'first')`, ['31']);
        afterEnd = p
          .then(() => undefined)
          .then(() => client.query(`insert into photos (user_id, image_url) values ($1, 'stray')`, ['32']));
        whileOther = () => client.query(`insert into photos (user_id, image_url) values ($1, 'stray')`, ['33']);
        return p;
      });
      await expect(afterEnd).rejects.toThrow(/started after its routed call ended/);
      await router.withShard(3, async (client) => {
        await client.query(`select $1::int`, [1]);
        await expect(whileOther!()).rejects.toThrow(/started after its routed call ended/);
        return client.query(`insert into photos (user_id, image_url) values ($1, 'third')`, ['34']);
      });
      const strays = await withClient(
        db.urls[0]!,
        async (c) =>
          (
            await c.query<{ n: string }>(
              `select (select count(*) from pb1.photos where image_url = 'stray') + (select count(*) from pb3.photos where image_url = 'stray') as n`,
            )
          ).rows[0]!.n,
      );
      expect(strays).toBe('0');
      // What fn gets is a pg client still: its class, and a COPY through it, inside the call's transaction.
      const copied = await router.withShard(3, async (client) => {
        expect(client).toBeInstanceOf(pg.Client);
        expect(client.constructor).toBe(pg.Client);
        await pipeline(
          Readable.from(['35\tcopied\n', '36\tcopied\n']),
          client.query(copyFrom('copy photos (user_id, image_url) from stdin')),
        );
        return (await client.query<{ n: string }>(`select count(*) as n from photos where image_url = $1`, ['copied']))
          .rows[0]!.n;
      });
      expect(copied).toBe('2');
      // fn starts a second query before returning the first one's promise: both run inside the
      // transaction, committed after fn (not with the first query).
      let second: Promise<unknown> | undefined;
      const both = await (async () => {
        let trips = 0;
        let connection: { on(e: string, f: () => void): void; off(e: string, f: () => void): void } | undefined;
        const trip = (): void => void (trips += 1);
        await router
          .withShard(1, (client) => {
            connection = (client as unknown as { connection: typeof connection }).connection!;
            connection.on('readyForQuery', trip);
            const p = client.query(`insert into photos (user_id, image_url) values ($1, 'a')`, ['19']);
            second = client
              .query(`insert into photos (user_id, image_url) values ($1, 1/$2::int)`, ['20', 0])
              .catch((e: { code?: string }) => e.code);
            return p;
          })
          .catch((e: { code?: string }) => e.code);
        connection!.off('readyForQuery', trip);
        return trips;
      })();
      // The second insert failed, so the transaction was rolled back (the first insert too): had
      // the COMMIT gone with the first, 19 would be committed.
      expect(await second).toBe('22012');
      expect(both).toBeGreaterThanOrEqual(2);
      await withClient(db.urls[0]!, async (c) => {
        const r = await c.query(
          `select user_id from pb1.photos where user_id in (16, 17, 18, 19, 20) union all select id::bigint from pb1.child order by 1`,
        );
        expect(r.rows).toEqual([{ user_id: '17' }]);
      });

      // The connection is clean after all of that: not in a transaction, default search_path,
      // and pb1 holds the rows of the calls that committed (the first, 14, 15, 17, 31).
      await router.withShard(1, async (client) => {
        const r = await client.query<{ n: string }>(`select count(*) as n from photos where $1::bool`, [true]);
        expect(r.rows[0]!.n).toBe('5');
      });
      const pool = await withClient(db.urls[0]!, (c) =>
        c.query<{ state: string }>(
          `select state from pg_stat_activity where datname = current_database() and application_name = 'shardctl-router'`,
        ),
      );
      expect(pool.rows.map((r) => r.state)).toEqual(['idle']);
    } finally {
      await router.close();
    }
  });
});

describe("ShardRouter: BEGIN without pg's internals", () => {
  const db = useTestDatabases(1);

  it("without pg's internals (the fallback): BEGIN and search_path go as a query of their own, one more round trip, same transaction and results", async () => {
    const fleet = makeFleet({ urls: db.urls, shards: 2, split: ['0-1'], schemaPrefix: 'pf', migrations: PHOTOS_ONLY });
    expect((await init(await fleet.config())).ok).toBe(true);
    const router = await ShardRouter.open(fleet.configFile, { poolSize: 1 });
    setBeginPipelining(false);
    try {
      const done = await router.withShard(1, async (client) => {
        const connection = (
          client as unknown as {
            connection: { on(e: string, f: () => void): void; off(e: string, f: () => void): void };
          }
        ).connection;
        let trips = 0;
        const trip = (): void => void (trips += 1);
        connection.on('readyForQuery', trip);
        const value = await client.query<{ id: string }>(
          `insert into photos (user_id, image_url) values ($1, $2) returning id`,
          ['1', 'f'],
        );
        connection.off('readyForQuery', trip);
        const insert = { trips, value };
        const where = await client.query<{ path: string; tx: string }>(
          `select current_setting('search_path') as path, pg_catalog.txid_current()::text as tx`,
        );
        return { insert, where: where.rows[0]! };
      });
      expect(done.insert.trips).toBe(2);
      expect(done.insert.value.rows).toHaveLength(1);
      expect(done.where.path).toBe('pf1, pg_temp');
      // A failing fn rolls back as on the usual path.
      await expect(
        router.withShard(1, async (client) => {
          await client.query(`insert into photos (user_id, image_url) values ($1, $2)`, ['2', 'rolled back']);
          throw new Error('fn failed');
        }),
      ).rejects.toThrow('fn failed');
      const rows = await router.withShard(1, (client) =>
        client.query<{ n: string }>(`select count(*)::text as n from photos where image_url = $1`, ['rolled back']),
      );
      expect(rows.rows[0]!.n).toBe('0');
    } finally {
      setBeginPipelining(true);
      await router.close();
    }
  });
});
