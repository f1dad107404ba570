import pg from 'pg';
import { describe, expect, it } from 'vitest';
import { init } from '../../src/commands/init.js';
import { ShardRouter } from '../../src/router/router.js';
import { ID_LOCK_TABLES } from '../../src/id/sql.js';
import { makeFleet } from '../helpers/fleet.js';
import { useTestDatabases } from '../helpers/hosts.js';

const PHOTOS_ONLY = {
  '0001_photos.sql': `CREATE SEQUENCE photos_id_seq;
CREATE TABLE photos (id bigint PRIMARY KEY DEFAULT next_id('photos_id_seq'), user_id bigint NOT NULL, image_url text NOT NULL);
ALTER SEQUENCE photos_id_seq OWNED BY photos.id;`,
};

const CONTEXTS_SQL = `
  SELECT sum(total_bytes)::bigint AS bytes,
         count(*) FILTER (WHERE name = 'CachedPlanSource')::int AS plan_sources,
         count(*) FILTER (WHERE name = 'PL/pgSQL function')::int AS plpgsql
    FROM pg_backend_memory_contexts`;

async function contexts(client: pg.Client): Promise<{ bytes: number; planSources: number; plpgsql: number }> {
  const row = (await client.query<{ bytes: string; plan_sources: number; plpgsql: number }>(CONTEXTS_SQL)).rows[0]!;
  return { bytes: Number(row.bytes), planSources: row.plan_sources, plpgsql: row.plpgsql };
}

describe('what a connection holds for the shards it serves', () => {
  const db = useTestDatabases(1);
  /** A database of its own for the router's fleet. */
  const dbRouter = useTestDatabases(1);

  it("caches no plan and no PL/pgSQL function per shard: one connection through 64 shards' slow paths", async () => {
    const shards = 64;
    const fleet = makeFleet({ urls: db.urls, shards, schemaPrefix: 'cc', migrations: PHOTOS_ONLY });
    expect((await init(await fleet.config())).ok).toBe(true);
    const client = new pg.Client({ connectionString: db.urls[0]! });
    await client.connect();
    try {
      // One shard first, so that what is cached once per connection (the host's slow path, the
      // catalogs the insert reads) is in the baseline.
      const insert = (shard: number) =>
        client.query(
          `BEGIN; SET LOCAL search_path TO cc${shard}; INSERT INTO photos (user_id, image_url) VALUES (${shard}, 'x'); COMMIT`,
        );
      await insert(0);
      // And the slow path's branch of every lock table (one statement each, cached on first use: at
      // most ID_LOCK_TABLES of them, whatever the shards), through sequences of shard 0 in every slot.
      await client.query(
        `DO $$ BEGIN FOR i IN 1..64 LOOP EXECUTE format('CREATE SEQUENCE cc0.warm_%s', i); END LOOP; END $$`,
      );
      const warm = await client.query<{ seq: string; slot: number }>(
        `SELECT c.oid::regclass::text AS seq, (c.oid::bigint % ${ID_LOCK_TABLES})::int AS slot
           FROM pg_catalog.pg_class c WHERE c.relnamespace = 'cc0'::regnamespace AND c.relname LIKE 'warm\\_%'`,
      );
      expect(new Set(warm.rows.map((r) => r.slot)).size).toBe(ID_LOCK_TABLES);
      for (const { seq } of warm.rows)
        await client.query(`SELECT nextval($1), shardctl.next_id_locked($1::regclass, 0)`, [seq]);
      const before = await contexts(client);
      for (let shard = 1; shard < shards; shard++) await insert(shard);
      const after = await contexts(client);
      // Every shard's first insert took the slow path (a fresh sequence is behind the clock).
      const slow = await client.query<{ n: string }>(
        `SELECT count(*) AS n FROM (SELECT 1 FROM pg_catalog.pg_sequences WHERE schemaname LIKE 'cc%' AND sequencename = 'photos_id_seq' AND last_value IS NOT NULL) s`,
      );
      expect(Number(slow.rows[0]!.n)).toBe(shards);
      expect(after.planSources - before.planSources).toBe(0);
      expect(after.plpgsql).toBe(1);
      // The relation and catalog caches of each shard's table, index and sequence remain: tens of
      // KB a shard (the per-shard slow path held about 210 KB).
      expect((after.bytes - before.bytes) / (shards - 1)).toBeLessThan(64 * 1024);
    } finally {
      await client.end();
    }
  });

  it('the router retires a pooled connection after maxConnectionUses calls and past maxConnectionLifetimeMs', async () => {
    const fleet = makeFleet({ urls: dbRouter.urls, shards: 2, schemaPrefix: 'cl', migrations: PHOTOS_ONLY });
    expect((await init(await fleet.config())).ok).toBe(true);
    const pid = (router: ShardRouter) =>
      router.withShard(
        0,
        async (client) => (await client.query<{ pid: number }>('select pg_backend_pid() as pid')).rows[0]!.pid,
      );

    const byUses = await ShardRouter.open(fleet.configFile, { poolSize: 1, maxConnectionUses: 5 });
    try {
      const pids: number[] = [];
      for (let i = 0; i < 12; i++) pids.push(await pid(byUses));
      // Calls 1-5 on one connection, 6-10 on a second, 11-12 on a third.
      expect(new Set(pids.slice(0, 5)).size).toBe(1);
      expect(new Set(pids.slice(5, 10)).size).toBe(1);
      expect(new Set(pids).size).toBe(3);
    } finally {
      await byUses.close();
    }

    const byAge = await ShardRouter.open(fleet.configFile, { poolSize: 1, maxConnectionLifetimeMs: 1000 });
    try {
      const first = await pid(byAge);
      expect(await pid(byAge)).toBe(first);
      await new Promise((resolve) => setTimeout(resolve, 1500));
      expect(await pid(byAge)).not.toBe(first);
    } finally {
      await byAge.close();
    }

    // The default keeps a connection for an hour, not for ever; both are checked up front.
    await expect(ShardRouter.open(fleet.configFile, { maxConnectionLifetimeMs: -1 })).rejects.toThrow(
      /maxConnectionLifetimeMs -1: must be/,
    );
    await expect(ShardRouter.open(fleet.configFile, { maxConnectionUses: 1.5 })).rejects.toThrow(
      /maxConnectionUses 1.5: must be/,
    );
  });
});
