import type pg from 'pg';
import type { HostConfig } from '../config/types.js';
import { UsageError } from '../errors.js';
import { firstEscape, splitSql } from '../pg/statements.js';
import { framedPerShard, pipelining } from './begin.js';
import type { CallTrace } from './diagnostics.js';
import type { ShardResult } from './errors.js';
import { runShardsQuery, ShardsQuery } from './pipeline.js';
import type { ReplicaRead } from './replicas.js';
import type { ForEachShardOptions, RouterInternals, Via } from './types.js';

export interface ParamsQueryOptions extends ForEachShardOptions {
  query?: Omit<pg.QueryConfig, 'text' | 'values'>;
  shardsPerQuery?: number;
}

/**
 * queryEachShard with bind parameters: one statement, run on each shard with the same values.
 * A shard alone is one round trip (BEGIN, search_path, the statement and COMMIT go together, as in
 * withShard). Read-only with `shardsPerQuery` > 1, up to that many shards of one host share a
 * round trip (ShardsQuery, src/router/pipeline.ts), each in its own READ ONLY transaction; a chunk
 * that fails runs again shard by shard, following a move and naming the failing shard.
 */
export function queryEachShardWithParams<R extends pg.QueryResultRow>(
  router: RouterInternals,
  sql: string,
  params: readonly unknown[],
  options: ParamsQueryOptions,
  replica?: ReplicaRead,
): Promise<ShardResult<pg.QueryResult<R>>[]> {
  let text: string;
  try {
    text = oneStatement(sql);
    if (!Array.isArray(params as unknown))
      throw new UsageError('must be an array of bind parameters', { input: 'params' });
  } catch (error) {
    return Promise.reject(error as Error);
  }
  const readOnly = options.readOnly ?? false;
  const query = options.query ?? {};
  // Checked with the call's options (checkCallOptions).
  const shardsPerQuery = options.shardsPerQuery ?? 1;
  const values = [...params];
  const once = (host: HostConfig, shard: number, trace: CallTrace | undefined, via?: Via) =>
    router.attempt(host, shard, (client) => client.query<R>({ ...query, text, values }), { readOnly }, trace, via);
  const single = (shard: number) =>
    router.run(
      shard,
      (host, trace) =>
        replica
          ? router.onReplica(host, shard, replica, trace, (via) => once(host, shard, trace, via))
          : once(host, shard, trace),
      readOnly,
    );
  if (!readOnly || shardsPerQuery === 1 || !pipelining() || 'rowMode' in query || query.name)
    return router.fanOut(single, options);
  return router.fanOut(single, options, {
    maxShards: shardsPerQuery,
    statements: 1,
    probe: async (shard) => ({ ...(await single(shard)), statements: 1 }),
    runChunk: (host, shards, _statements, trace) =>
      replica
        ? router.chunkOnReplica(host, shards, replica, trace, (via) =>
            attemptParamsChunk<R>(router, host, shards, text, values, query.types, via, trace),
          )
        : attemptParamsChunk<R>(router, host, shards, text, values, query.types, undefined, trace),
  });
}

/**
 * The text of a one-statement sql, without a trailing `;`; a UsageError naming `sql` for several
 * statements, none, or one that would end the transaction or change the session.
 */
export function oneStatement(sql: string): string {
  if (typeof sql !== 'string') throw new UsageError('must be a string of SQL', { input: 'sql' });
  const statements = splitSql(sql).statements.filter((s) => s.tokens.length > 0);
  if (statements.length !== 1)
    throw new UsageError(
      `must be exactly one statement when it has bind parameters (found ${statements.length}); run several with forEachShard`,
      { input: 'sql', value: sql.slice(0, 60) },
    );
  const escape = firstEscape(sql);
  if (escape) throw new UsageError(escape, { input: 'sql' });
  return sql.replace(/[\s;]+$/, '');
}

/**
 * Shards of one host in one round trip with bind parameters; each shard's result, or undefined
 * when the round trip failed or its results are not BEGIN, the SETs, one statement and COMMIT per
 * shard (the caller then runs the shards one by one).
 */
async function attemptParamsChunk<R extends pg.QueryResultRow>(
  router: RouterInternals,
  host: HostConfig,
  shards: readonly number[],
  text: string,
  values: readonly unknown[],
  types: pg.QueryConfig['types'] | undefined,
  via?: Via,
  trace?: CallTrace,
): Promise<pg.QueryResult<R>[] | undefined> {
  return router.withConnection(
    host,
    shards[0]!,
    async (lease) => {
      const starts = shards.map((shard) => (via ? via.start(shard) : router.transactionStart(shard, true)));
      let results: pg.QueryResult[];
      try {
        results = await runShardsQuery(lease.client, new ShardsQuery(text, values, starts, types));
      } catch {
        // The failing shard's transaction is open and aborted; those before it committed (read-only).
        await lease.rollback();
        return undefined;
      }
      const framing = starts[0]!.statements;
      const group = framing + 2;
      if (!framedPerShard(results, shards.length, framing, 1)) {
        await lease.rollback();
        return undefined;
      }
      router.counted(host.name, true);
      return shards.map((_, i) => results[i * group + framing] as pg.QueryResult<R>);
    },
    via,
    trace,
  );
}
