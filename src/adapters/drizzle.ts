/**
 * shardctl/drizzle: Drizzle (node-postgres) on the router's calls. Loaded only by `import … from
 * 'shardctl/drizzle'`; drizzle-orm is an optional peer dependency (tested with ^0.45).
 *
 *   const photos = pgTable('photos', { id: bigint('id', { mode: 'bigint' }).primaryKey(), … });
 *   const sharded = new ShardedDrizzle(router, { schema: { photos } });
 *   // One statement: return the query (not awaited) and the call is one round trip.
 *   const [photo] = await sharded.withKey(userId, (db) =>
 *     db.insert(photos).values({ userId, imageUrl: url }).returning({ id: photos.id }));
 *   // Several: an async fn; they run in the shard's one transaction.
 *
 * Declare the tables without a pgSchema: the call's search_path is the shard's schema, so
 * `photos` is that shard's table. Declare ids `bigint(…, { mode: 'bigint' })`: they come back as
 * bigint and are bound as they are. db.transaction() is refused (the call is already the shard's
 * transaction).
 */
import { DrizzleQueryError, type DrizzleConfig } from 'drizzle-orm';
import { drizzle, type NodePgDatabase } from 'drizzle-orm/node-postgres';
import type pg from 'pg';
import { UsageError } from '../errors.js';
import { commitWithOnlyQuery } from '../router/begin.js';
import type { ShardResult } from '../router/errors.js';
import type { ForEachShardOptions, ShardRouter, TransactionOptions } from '../router/router.js';

/** A Drizzle query not yet run: executed by the adapter in the call's one round trip. */
export interface DrizzleExecutable<R> {
  toSQL(): unknown;
  execute(): Promise<R>;
}

export type DrizzleShardFn<TSchema extends Record<string, unknown>, R> = (
  db: NodePgDatabase<TSchema>,
  shard: number,
) => DrizzleExecutable<R> | Promise<R>;

export class ShardedDrizzle<TSchema extends Record<string, unknown> = Record<string, never>> {
  constructor(
    readonly router: ShardRouter,
    private readonly config: DrizzleConfig<TSchema> = {},
  ) {}

  withKey<R>(key: bigint, fn: DrizzleShardFn<TSchema, R>, options: TransactionOptions = {}): Promise<R> {
    return this.router.withKey(key, (client, shard) => this.run(client, shard, fn), options);
  }

  withId<R>(id: bigint | string, fn: DrizzleShardFn<TSchema, R>, options: TransactionOptions = {}): Promise<R> {
    return this.router.withId(id, (client, shard) => this.run(client, shard, fn), options);
  }

  withShard<R>(shard: number, fn: DrizzleShardFn<TSchema, R>, options: TransactionOptions = {}): Promise<R> {
    return this.router.withShard(shard, (client, s) => this.run(client, s, fn), options);
  }

  forEachShard<R>(fn: DrizzleShardFn<TSchema, R>, options: ForEachShardOptions = {}): Promise<ShardResult<R>[]> {
    return this.router.forEachShard((client, shard) => this.run(client, shard, fn), options);
  }

  /** A Drizzle database over one routed call's connection. */
  on(client: pg.PoolClient): NodePgDatabase<TSchema> {
    const db = drizzle<TSchema, pg.PoolClient>({ ...this.config, client });
    db.transaction = () => {
      throw new UsageError(
        "shardctl/drizzle: the call is already the shard's transaction; run the statements on db directly (no db.transaction())",
      );
    };
    return db;
  }

  private run<R>(client: pg.PoolClient, shard: number, fn: DrizzleShardFn<TSchema, R>): Promise<R> {
    const out = fn(this.on(client), shard);
    if (isExecutable(out)) {
      // The query is all of this call: its COMMIT goes with it (one round trip).
      commitWithOnlyQuery(client);
      return out.execute().catch(unwrap);
    }
    return Promise.resolve(out).catch(unwrap);
  }
}

/**
 * Drizzle wraps the driver's error in a DrizzleQueryError (its code on `cause`): the router decides
 * by the driver's error (SC100 of a moved shard, a lost connection, 25006 after a failover, the
 * statement timeout), so it is given that error, as the Kysely adapter and a plain client give it.
 */
function unwrap(error: unknown): never {
  if (error instanceof DrizzleQueryError && error.cause instanceof Error) throw error.cause;
  throw error;
}

function isExecutable<R>(value: DrizzleExecutable<R> | Promise<R>): value is DrizzleExecutable<R> {
  const v = value as Partial<DrizzleExecutable<R>> | null;
  return typeof v?.toSQL === 'function' && typeof v.execute === 'function';
}
