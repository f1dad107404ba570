import { bigint, pgTable, text } from 'drizzle-orm/pg-core';
import { eq, sql } from 'drizzle-orm';
import type { ColumnType, Generated } from 'kysely';
import { describe, expect, it } from 'vitest';
import { ShardedDrizzle } from '../../src/adapters/drizzle.js';
import { ShardedKysely } from '../../src/adapters/kysely.js';
import { init } from '../../src/commands/init.js';
import { moveShard } from '../../src/commands/move-shard.js';
import { ShardRouter } from '../../src/router/router.js';
import { makeFleet } from '../helpers/fleet.js';
import { useTestDatabases } from '../helpers/hosts.js';

const PHOTOS_ONLY = {
  '0001_photos.sql': `CREATE SEQUENCE photos_id_seq;
CREATE TABLE photos (id bigint PRIMARY KEY DEFAULT next_id('photos_id_seq'), user_id bigint NOT NULL, image_url text NOT NULL);
ALTER SEQUENCE photos_id_seq OWNED BY photos.id;`,
};

interface KyselyDb {
  photos: { id: Generated<bigint>; user_id: ColumnType<bigint, bigint, bigint>; image_url: string };
}

const photos = pgTable('photos', {
  id: bigint('id', { mode: 'bigint' })
    .primaryKey()
    .default(sql`next_id('photos_id_seq')`),
  userId: bigint('user_id', { mode: 'bigint' }).notNull(),
  imageUrl: text('image_url').notNull(),
});

/** Round trips (ReadyForQuery messages) on the router's only connection to a host, counted from now on. */
async function countTrips(router: ShardRouter, shard: number): Promise<{ trips: number }> {
  const counter = { trips: 0 };
  await router.withShard(shard, async (client) => {
    const connection = (client as unknown as { connection: { on(e: string, f: () => void): void } }).connection;
    connection.on('readyForQuery', () => void (counter.trips += 1));
    await client.query('select 1');
  });
  counter.trips = 0;
  return counter;
}

describe('shardctl/kysely and shardctl/drizzle', () => {
  const db = useTestDatabases(2);

  it('insert and read through Kysely and Drizzle with bigint ids, one round trip for one statement, and through a move', async () => {
    const fleet = makeFleet({
      urls: db.urls,
      shards: 4,
      split: ['0-1', '2-3'],
      schemaPrefix: 'ad',
      migrations: PHOTOS_ONLY,
    });
    const config = await fleet.config();
    expect((await init(config)).ok).toBe(true);
    // One connection per host: every call below reuses it, so its round trips can be counted.
    const router = await ShardRouter.open(fleet.configFile, { poolSize: 1 });
    const kysely = new ShardedKysely<KyselyDb>(router);
    const drizzle = new ShardedDrizzle(router, { schema: { photos } });
    try {
      const trips = await countTrips(router, 1);
      const userId = 9n; // shard 1
      const [inserted] = await kysely.withKey(userId, (k) =>
        k.insertInto('photos').values({ user_id: userId, image_url: 'k1' }).returning(['id', 'user_id']),
      );
      expect(trips.trips).toBe(1);
      expect(typeof inserted!.id).toBe('bigint');
      expect(inserted!.user_id).toBe(9n);
      expect(router.shardForId(inserted!.id)).toBe(1);

      trips.trips = 0;
      const [viaDrizzle] = await drizzle.withKey(userId, (d) =>
        d.insert(photos).values({ userId, imageUrl: 'd1' }).returning({ id: photos.id, userId: photos.userId }),
      );
      expect(trips.trips).toBe(1);
      expect(typeof viaDrizzle!.id).toBe('bigint');
      expect(viaDrizzle!.userId).toBe(9n);
      expect(router.shardForId(viaDrizzle!.id)).toBe(1);

      // Reads by id, each through the other builder; ids past 2^53 stay exact.
      expect(inserted!.id > 2n ** 53n).toBe(true);
      const byDrizzle = await drizzle.withId(
        inserted!.id,
        (d) => d.select().from(photos).where(eq(photos.id, inserted!.id)),
        {
          readOnly: true,
        },
      );
      expect(byDrizzle).toEqual([{ id: inserted!.id, userId: 9n, imageUrl: 'k1' }]);
      const byKysely = await kysely.withId(viaDrizzle!.id, (k) =>
        k.selectFrom('photos').selectAll().where('id', '=', viaDrizzle!.id),
      );
      expect(byKysely).toEqual([{ id: viaDrizzle!.id, user_id: 9n, image_url: 'd1' }]);

      // Several statements: one transaction, rolled back as a whole when fn throws.
      await expect(
        kysely.withKey(userId, async (k) => {
          await k.insertInto('photos').values({ user_id: userId, image_url: 'gone' }).execute();
          throw new Error('undo');
        }),
      ).rejects.toThrow('undo');
      await expect(drizzle.withKey(userId, async (d) => d.transaction(async () => undefined))).rejects.toThrow(
        /already the shard's transaction/,
      );
      await expect(kysely.withKey(userId, async (k) => k.transaction().execute(async () => undefined))).rejects.toThrow(
        /already the shard's transaction/,
      );
      // Refusals of the adapters are usage errors, as the router's own are.
      for (const refused of [
        drizzle.withKey(userId, async (d) => d.transaction(async () => undefined)),
        kysely.withKey(userId, async (k) => k.transaction().execute(async () => undefined)),
        kysely.withKey(userId, async (k) => {
          for await (const row of k.selectFrom('photos').selectAll().stream()) void row;
        }),
      ])
        await expect(refused).rejects.toMatchObject({ code: 'USAGE', exitCode: 2 });

      // Through a move: the router's map still names pg1; both adapters follow to pg2.
      // Drizzle meets the moved shard first: its DrizzleQueryError carries the SC100 the router follows.
      expect((await moveShard(config, 1, 'pg2', { configFile: fleet.configFile })).outcome).toBe('moved');
      const [afterD] = await drizzle.withKey(userId, (d) =>
        d.insert(photos).values({ userId, imageUrl: 'd2' }).returning({ id: photos.id }),
      );
      const [afterK] = await kysely.withKey(userId, (k) =>
        k.insertInto('photos').values({ user_id: userId, image_url: 'k2' }).returning('id'),
      );
      expect(router.hostForShard(1).name).toBe('pg2');
      const all = await kysely.withShard(1, (k) => k.selectFrom('photos').select(['id', 'image_url']).orderBy('id'));
      expect(all).toEqual([
        { id: inserted!.id, image_url: 'k1' },
        { id: viaDrizzle!.id, image_url: 'd1' },
        { id: afterD!.id, image_url: 'd2' },
        { id: afterK!.id, image_url: 'k2' },
      ]);
      // forEachShard through an adapter: every shard, counts as bigint.
      const counts = await drizzle.forEachShard(async (d) => (await d.select({ id: photos.id }).from(photos)).length, {
        readOnly: true,
      });
      expect(counts.map((c) => [c.shard, c.host, c.value])).toEqual([
        [0, 'pg1', 0],
        [1, 'pg2', 4],
        [2, 'pg2', 0],
        [3, 'pg2', 0],
      ]);
    } finally {
      await router.close();
    }
  });
});
