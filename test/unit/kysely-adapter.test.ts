import type { Generated } from 'kysely';
import type pg from 'pg';
import { describe, expect, it } from 'vitest';
import { ShardedKysely } from '../../src/adapters/kysely.js';
import { UsageError } from '../../src/errors.js';
import type { ShardRouter } from '../../src/router/router.js';

interface Db {
  photos: { id: Generated<bigint>; user_id: bigint; image_url: string };
}

/** A router whose calls run fn on a client that records its queries (and answers none of them). */
function fakeRouter(sent: string[]): ShardRouter {
  const client = {
    query: (config: { text: string }) => {
      sent.push(config.text);
      return Promise.resolve({ rows: [], command: 'INSERT', rowCount: 1 });
    },
  } as unknown as pg.PoolClient;
  const call = <T>(_key: unknown, fn: (c: pg.PoolClient, shard: number) => Promise<T>): Promise<T> => fn(client, 0);
  return { withKey: call, withId: call, withShard: call } as unknown as ShardRouter;
}

describe('shardctl/kysely', () => {
  it('refuses an async fn that resolves to a builder it did not execute, instead of committing without its statement', async () => {
    const sent: string[] = [];
    const kysely = new ShardedKysely<Db>(fakeRouter(sent));
    const call = kysely.withKey(5n, async (db) => db.insertInto('photos').values({ user_id: 5n, image_url: 'x' }));
    await expect(call).rejects.toThrow(UsageError);
    await expect(call).rejects.toThrow(/did not execute/);
    expect(sent).toEqual([]);
  });

  it('still runs a returned builder, and an async fn’s own statements and value', async () => {
    const sent: string[] = [];
    const kysely = new ShardedKysely<Db>(fakeRouter(sent));
    await kysely.withKey(5n, (db) => db.insertInto('photos').values({ user_id: 5n, image_url: 'x' }));
    const value = await kysely.withShard(0, async (db) => {
      await db.insertInto('photos').values({ user_id: 5n, image_url: 'y' }).execute();
      return 42;
    });
    expect(value).toBe(42);
    expect(sent).toHaveLength(2);
  });
});
