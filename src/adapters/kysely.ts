/**
 * shardctl/kysely: Kysely on the router's calls. Loaded only by `import … from 'shardctl/kysely'`;
 * kysely is an optional peer dependency (tested with ^0.28, which runs on Node 20).
 *
 *   const sharded = new ShardedKysely<DB>(router);
 *   // One statement: return the builder (not its promise) and the call is one round trip.
 *   const [photo] = await sharded.withKey(userId, (db) =>
 *     db.insertInto('photos').values({ user_id: userId, image_url: url }).returning('id'));
 *   // Several: an async fn; they run in the shard's one transaction.
 *   await sharded.withId(photo.id, async (db) => { … await db.selectFrom('likes')….execute(); … });
 *
 * Each call gets a Kysely bound to the call's connection, inside its transaction with the shard's
 * search_path: `photos` is that shard's table. int8 columns (and int8[] elements) come back as bigint, and bigint values
 * are bound as they are: ids never pass through a JS number. db.transaction() is refused (the call
 * is already the shard's transaction), and so is streaming.
 */
import {
  Kysely,
  PostgresAdapter,
  PostgresIntrospector,
  PostgresQueryCompiler,
  type CompiledQuery,
  type DatabaseConnection,
  type Dialect,
  type Driver,
  type QueryResult,
} from 'kysely';
import type pg from 'pg';
import { UsageError } from '../errors.js';
import { commitWithOnlyQuery } from '../router/begin.js';
import type { ShardResult } from '../router/errors.js';
import { BIGINT_TYPES } from '../router/pages.js';
import type { ForEachShardOptions, ShardRouter, TransactionOptions } from '../router/router.js';

/** A Kysely builder: compiled and executed by the adapter in the call's one round trip. */
export interface KyselyExecutable<R> {
  compile(): CompiledQuery;
  execute(): Promise<R>;
}

/** What a call runs: a builder (one statement, one round trip) or an async function of the shard's Kysely. */
export type KyselyShardFn<DB, R> = (db: Kysely<DB>, shard: number) => KyselyExecutable<R> | Promise<R>;

export class ShardedKysely<DB> {
  constructor(readonly router: ShardRouter) {}

  withKey<R>(key: bigint, fn: KyselyShardFn<DB, R>, options: TransactionOptions = {}): Promise<R> {
    return this.router.withKey(key, (client, shard) => run(client, shard, fn), options);
  }

  withId<R>(id: bigint | string, fn: KyselyShardFn<DB, R>, options: TransactionOptions = {}): Promise<R> {
    return this.router.withId(id, (client, shard) => run(client, shard, fn), options);
  }

  withShard<R>(shard: number, fn: KyselyShardFn<DB, R>, options: TransactionOptions = {}): Promise<R> {
    return this.router.withShard(shard, (client, s) => run(client, s, fn), options);
  }

  forEachShard<R>(fn: KyselyShardFn<DB, R>, options: ForEachShardOptions = {}): Promise<ShardResult<R>[]> {
    return this.router.forEachShard((client, shard) => run(client, shard, fn), options);
  }
}

/** A Kysely over one routed call's connection (for code that builds its own calls on forEachShard etc.). */
export function kyselyOnClient<DB>(client: pg.PoolClient): Kysely<DB> {
  return new Kysely<DB>({ dialect: new ClientDialect(client) });
}

function run<DB, R>(client: pg.PoolClient, shard: number, fn: KyselyShardFn<DB, R>): Promise<R> {
  const out = fn(kyselyOnClient<DB>(client), shard);
  if (isExecutable(out)) {
    // The builder's statement is all of this call: its COMMIT goes with it (one round trip).
    commitWithOnlyQuery(client);
    return out.execute();
  }
  // An async fn that returns a builder resolves to the builder itself: Kysely's builders are not
  // thenables, so its statement would never run and the call would commit without it.
  return Promise.resolve(out).then((value) => {
    if (isExecutable<unknown>(value as KyselyExecutable<unknown>))
      throw new UsageError(UNEXECUTED, { input: "fn's value" });
    return value;
  });
}

const UNEXECUTED =
  'shardctl/kysely: fn resolved to a builder it did not execute (an async fn returning it), so its statement was never run; return the builder from a fn that is not async, or await its execute(). The call was rolled back';

function isExecutable<R>(value: KyselyExecutable<R> | Promise<R>): value is KyselyExecutable<R> {
  const v = value as Partial<KyselyExecutable<R>> | null;
  return typeof v?.compile === 'function' && typeof v.execute === 'function';
}

class ClientDialect implements Dialect {
  constructor(private readonly client: pg.PoolClient) {}
  createAdapter() {
    return new PostgresAdapter();
  }
  createDriver(): Driver {
    return new ClientDriver(this.client);
  }
  createIntrospector(db: Kysely<unknown>) {
    return new PostgresIntrospector(db);
  }
  createQueryCompiler() {
    return new PostgresQueryCompiler();
  }
}

const IN_TRANSACTION =
  "shardctl/kysely: the call is already the shard's transaction; run the statements on db directly (no db.transaction())";

class ClientDriver implements Driver {
  private readonly connection: ClientConnection;
  constructor(client: pg.PoolClient) {
    this.connection = new ClientConnection(client);
  }
  async init(): Promise<void> {}
  async acquireConnection(): Promise<DatabaseConnection> {
    return this.connection;
  }
  async beginTransaction(): Promise<void> {
    throw new UsageError(IN_TRANSACTION);
  }
  async commitTransaction(): Promise<void> {
    throw new UsageError(IN_TRANSACTION);
  }
  async rollbackTransaction(): Promise<void> {
    throw new UsageError(IN_TRANSACTION);
  }
  async releaseConnection(): Promise<void> {}
  async destroy(): Promise<void> {}
}

const AFFECTING = new Set(['INSERT', 'UPDATE', 'DELETE', 'MERGE']);

class ClientConnection implements DatabaseConnection {
  constructor(private readonly client: pg.PoolClient) {}

  async executeQuery<R>(compiled: CompiledQuery): Promise<QueryResult<R>> {
    const result = await this.client.query<R & pg.QueryResultRow>({
      text: compiled.sql,
      values: [...compiled.parameters],
      types: BIGINT_TYPES,
    });
    return {
      rows: result.rows ?? [],
      ...(AFFECTING.has(result.command) ? { numAffectedRows: BigInt(result.rowCount ?? 0) } : {}),
    };
  }

  // eslint-disable-next-line require-yield -- refuses before yielding anything
  async *streamQuery<R>(): AsyncIterableIterator<QueryResult<R>> {
    throw new UsageError(
      'shardctl/kysely: streaming is not supported inside a routed call (a page at a time: router.queryPage)',
    );
  }
}
