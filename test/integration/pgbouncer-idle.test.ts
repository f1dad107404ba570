/**
 * A routed transaction that fn leaves idle past idleInTransactionTimeoutMs, through PgBouncer in
 * transaction mode: the server ends its connection (FATAL 25P03) and PgBouncer passes the reason
 * on, so the call fails once naming host and shard, as it does straight to the server
 * (router.test.ts), not run again as after a lost connection.
 */
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { init } from '../../src/commands/init.js';
import { HostError } from '../../src/errors.js';
import { ShardRouter } from '../../src/router/router.js';
import { makeFleet } from '../helpers/fleet.js';
import { useTestDatabases } from '../helpers/hosts.js';
import { startPgBouncer, type PgBouncer } from '../helpers/pgbouncer.js';

describe('behind PgBouncer, a transaction the server ends for its idle timeout', () => {
  const db = useTestDatabases(1);
  let pooler: PgBouncer;
  beforeAll(async () => {
    pooler = await startPgBouncer(db.urls[0]!, { poolSize: 2 });
  });
  afterAll(async () => {
    await pooler.stop();
  });

  it('fails once with a HostError naming host and shard, code 25P03, and the next call works', async () => {
    const fleet = makeFleet({
      urls: db.urls,
      shards: 2,
      schemaPrefix: 'pi',
      migrations: { '0001_t.sql': 'CREATE TABLE t (x int);' },
    });
    expect((await init(await fleet.config())).ok).toBe(true);
    const pooledFile = join(fleet.dir, 'pooled.yaml');
    writeFileSync(pooledFile, readFileSync(fleet.configFile, 'utf8').replace(db.urls[0]!, pooler.url(db.urls[0]!)));
    const router = await ShardRouter.open(pooledFile, { idleInTransactionTimeoutMs: 300, poolSize: 1 });
    try {
      let runs = 0;
      const error = await router
        .withShard(1, async (client) => {
          runs += 1;
          await client.query('INSERT INTO t VALUES (1)');
          await new Promise((resolve) => setTimeout(resolve, 900));
          return client.query('SELECT 1');
        })
        .then(
          () => null,
          (e: unknown) => e as HostError,
        );
      expect(error).toBeInstanceOf(HostError);
      expect({ code: error?.code, host: error?.host, shard: error?.shard, runs }).toEqual({
        code: '25P03',
        host: 'pg1',
        shard: 1,
        runs: 1,
      });
      const count = await router.withShard(1, (client) =>
        client.query<{ n: string }>('SELECT count(*)::text AS n FROM t'),
      );
      expect(count.rows[0]!.n).toBe('0');
    } finally {
      await router.close();
    }
  });
});
