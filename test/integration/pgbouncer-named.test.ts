/**
 * fn's named statements (node-postgres's `{ name, text }`, as Drizzle's prepared queries send them)
 * through PgBouncer 1.18 in transaction mode, which keeps no prepared statement per client: each
 * transaction may get another server connection, where the name is missing (26000) or another
 * client's (42P05), or, worse, another client's statement of that name runs with these values. The
 * router sends them unnamed on a host whose url goes through a pooler (directUrl set), on one whose
 * connections are not given the server session's own pid (an undeclared pooler, found when a
 * connection is made), and once a named statement failed so (the call then runs again).
 * A plain pg.Pool through the same pooler shows the failure the router spares its callers.
 */
import diagnosticsChannel from 'node:diagnostics_channel';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { init } from '../../src/commands/init.js';
import { CALL_CHANNEL, type RouterCallEvent } from '../../src/router/diagnostics.js';
import { ShardRouter } from '../../src/router/router.js';
import { makeFleet } from '../helpers/fleet.js';
import { useTestDatabases, withClient } from '../helpers/hosts.js';
import { onEveryServerConnection, startPgBouncer, statementsLeft, type PgBouncer } from '../helpers/pgbouncer.js';

/** pg's own query method, which the router's hook on a routed client does not see. */
const pgQuery = pg.Client.prototype.query as (this: pg.ClientBase, text: string) => Promise<pg.QueryResult>;

const CALLS = 120;
const SHARDS = 4;

/** CALLS routed calls, 8 at a time, each two named statements in its transaction; the errors they met. */
async function namedCalls(router: ShardRouter, offset: number): Promise<string[]> {
  const errors: string[] = [];
  let next = 0;
  await Promise.all(
    Array.from({ length: 8 }, async () => {
      while (next < CALLS) {
        const i = next++;
        await router
          .withShard(i % SHARDS, async (client) => {
            await client.query({ name: 'ins', text: 'INSERT INTO t VALUES ($1)', values: [offset + i] });
            return client.query(new pg.Query({ name: 'cnt', text: 'SELECT count(*) FROM t' }));
          })
          .catch((error: unknown) => errors.push(String(error)));
      }
    }),
  );
  return errors;
}

/** A fleet of SHARDS shards, each with a table t (x int), made on `urls`. */
async function initFleet(urls: readonly string[], schemaPrefix: string) {
  const fleet = makeFleet({
    urls,
    shards: SHARDS,
    schemaPrefix,
    migrations: { '0001_t.sql': 'CREATE TABLE t (x int);' },
  });
  expect((await init(await fleet.config())).ok).toBe(true);
  return fleet;
}

describe('named statements of fn behind PgBouncer in transaction mode', () => {
  const db = useTestDatabases(1);
  /** For the fleet straight to the server. */
  const dbDirect = useTestDatabases(1);
  let pooler: PgBouncer;
  beforeAll(async () => {
    pooler = await startPgBouncer(db.urls[0]!, { poolSize: 3 });
  });
  afterAll(async () => {
    await pooler.stop();
  });

  it('go unnamed where the pooler is declared and where it is not: every call commits once, and no statement is left on the server connections', async () => {
    const fleet = await initFleet(db.urls, 'pn');
    const url = db.urls[0]!;
    const text = readFileSync(fleet.configFile, 'utf8');
    const pooledUrl = pooler.url(url);

    // Without the router: a plain pool's named statement fails on another server connection.
    const plain = new pg.Pool({ connectionString: pooledUrl, max: 8 });
    const plainErrors: string[] = [];
    try {
      await Promise.all(
        Array.from({ length: 40 }, (_, i) =>
          plain
            .query({ name: 'plain', text: 'SELECT $1::int AS n', values: [i] })
            .catch((error: unknown) => plainErrors.push(String(error))),
        ),
      );
    } finally {
      await plain.end();
    }
    expect(plainErrors.length).toBeGreaterThan(0);
    expect(plainErrors.join('\n')).toMatch(/prepared statement "plain" (already exists|does not exist)/);
    // What the plain pool left on the pooler's server connections: dropped, so that only the router's count below.
    await onEveryServerConnection(pooledUrl, pooler.poolSize, (c) => c.query('DEALLOCATE ALL'));
    expect(await statementsLeft(pooledUrl, pooler.poolSize)).toBe(0);

    const declared = join(fleet.dir, 'declared.yaml');
    writeFileSync(declared, text.replace(`    url: ${url}\n`, `    url: ${pooledUrl}\n    directUrl: ${url}\n`));
    const undeclared = join(fleet.dir, 'undeclared.yaml');
    writeFileSync(undeclared, text.replace(`    url: ${url}\n`, `    url: ${pooledUrl}\n`));

    // Declared (directUrl): unnamed from the first call, nothing left on the server connections.
    const first = await ShardRouter.open(declared, { poolSize: 6 });
    try {
      expect(await namedCalls(first, 0)).toEqual([]);
    } finally {
      await first.close();
    }
    expect(await statementsLeft(pooledUrl, pooler.poolSize)).toBe(0);
    // Undeclared (no router timeouts, so no startup parameter for PgBouncer to refuse): found when
    // the first connection is made, before any named statement.
    const second = await ShardRouter.open(undeclared, { poolSize: 6 });
    try {
      expect(await namedCalls(second, CALLS)).toEqual([]);
    } finally {
      await second.close();
    }
    expect(await statementsLeft(pooledUrl, pooler.poolSize)).toBe(0);

    // Every call committed its row once.
    const rows = await withClient(url, (c) =>
      c.query<{ n: string; d: string }>(
        `SELECT count(*)::text AS n, count(DISTINCT x)::text AS d FROM (${Array.from(
          { length: SHARDS },
          (_, s) => `SELECT x FROM pn${s}.t`,
        ).join(' UNION ALL ')}) r`,
      ),
    );
    expect(rows.rows[0]).toEqual({ n: String(2 * CALLS), d: String(2 * CALLS) });
  });
  it('straight to the server: stay named (planned once per connection), and one the session lost fails once, runs again unnamed, and the host sends them unnamed from then on', async () => {
    const fleet = await initFleet(dbDirect.urls, 'pd');
    const router = await ShardRouter.open(fleet.configFile, { poolSize: 1 });
    const calls: RouterCallEvent[] = [];
    const listen = (event: unknown) => calls.push(event as RouterCallEvent);
    diagnosticsChannel.subscribe(CALL_CHANNEL, listen);
    const named = (client: pg.PoolClient) =>
      client.query<{ n: number }>({ name: 'pd_count', text: 'SELECT count(*)::int AS n FROM t' });
    const prepared = (client: pg.PoolClient) =>
      client.query<{ name: string }>('SELECT name FROM pg_catalog.pg_prepared_statements');
    try {
      // A server session of its own: the name stays prepared on it.
      await router.withShard(0, named);
      expect((await router.withShard(0, prepared)).rows).toEqual([{ name: 'pd_count' }]);
      // The session loses it behind pg's back (pg's own query method, past the router's): pg still
      // believes it prepared, so the next call's Bind meets no statement (26000), and runs again unnamed.
      let runs = 0;
      const value = await router.withShard(1, async (client) => {
        runs += 1;
        if (runs === 1) await pgQuery.call(client, 'DEALLOCATE pd_count');
        return named(client);
      });
      expect({ runs, n: value.rows[0]!.n }).toEqual({ runs: 2, n: 0 });
      // Its subscribers see two attempts and the retried error.
      expect(calls.at(-1)).toMatchObject({
        shard: 1,
        ok: true,
        attempts: 2,
        retried: [{ host: 'pg1', code: '26000' }],
      });
      await router.withShard(2, named);
      expect((await router.withShard(2, prepared)).rows).toEqual([]);
    } finally {
      diagnosticsChannel.unsubscribe(CALL_CHANNEL, listen);
      await router.close();
    }
  });
});
