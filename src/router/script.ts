import type pg from 'pg';
import type { HostConfig } from '../config/types.js';
import { HostError, UsageError } from '../errors.js';
import { firstEscape, ROUTER_ESCAPES, type EscapeOptions } from '../pg/statements.js';
import { framedPerShard, WRITE_LSN_SQL, type TransactionStart } from './begin.js';
import type { CallTrace } from './diagnostics.js';
import type { ShardResult } from './errors.js';
import { CommitUnknownError, isConnectionLoss } from './failover.js';
import type { ReplicaRead } from './replicas.js';
import type { Attempt, ForEachShardOptions, RouterInternals, Via } from './types.js';

/**
 * shardctl exec's mark on its queryEachShard options (a symbol: no key an application could pass):
 * its SQL is the operator's, who may run dynamic DDL per shard (a DO block's EXECUTE), as a
 * migration may. Everything else the router refuses, exec refuses too (its own check first).
 */
export const EXEC_SCRIPT: unique symbol = Symbol('shardctl exec');
const EXEC_ESCAPES: EscapeOptions = { ...ROUTER_ESCAPES, doExecute: false };

export interface ScriptQueryOptions extends ForEachShardOptions {
  query?: Omit<pg.QueryConfig, 'text' | 'values'>;
  shardsPerQuery?: number;
  [EXEC_SCRIPT]?: true;
}

/**
 * queryEachShard for a SQL text without parameters (router.queryEachShard says what it does):
 * each shard's BEGIN, settings, the text and COMMIT in one round trip; read-only with
 * `shardsPerQuery` > 1, a chunk of one host's shards per round trip, each shard in a transaction
 * of its own, after the first shard alone has shown how many results the text gives per shard.
 */
export function queryEachShardScript<R extends pg.QueryResultRow>(
  router: RouterInternals,
  sql: string,
  options: ScriptQueryOptions,
  replica: ReplicaRead | undefined,
): Promise<ShardResult<pg.QueryResult<R>>[]> {
  const escape = firstEscape(sql, options[EXEC_SCRIPT] ? EXEC_ESCAPES : ROUTER_ESCAPES);
  if (escape) return Promise.reject(new UsageError(escape, { input: 'sql' }));
  const body = sql.replace(/[\s;]+$/, '');
  const readOnly = options.readOnly ?? false;
  const query = options.query ?? {};
  // Checked with the call's options (checkCallOptions).
  const shardsPerQuery = options.shardsPerQuery ?? 1;
  const single = (shard: number) =>
    router.run(
      shard,
      (host, trace) =>
        replica
          ? router.onReplica(host, shard, replica, trace, (via) =>
              attemptScript<R>(router, host, shard, body, readOnly, query, trace, via),
            )
          : attemptScript<R>(router, host, shard, body, readOnly, query, trace),
      readOnly,
    );
  if (!readOnly || shardsPerQuery === 1)
    return router.fanOut(async (shard) => unwrapScript(await single(shard)), options);
  return router.fanOut(async (shard) => unwrapScript(await single(shard)), options, {
    maxShards: shardsPerQuery,
    probe: async (shard) => {
      const r = await single(shard);
      return { value: r.value.last, host: r.host, statements: r.value.statements };
    },
    runChunk: (host, shards, statements, trace) =>
      replica
        ? router.chunkOnReplica(host, shards, replica, trace, (via) =>
            attemptChunk<R>(router, host, shards, body, statements, query, via, trace),
          )
        : attemptChunk<R>(router, host, shards, body, statements, query, undefined, trace),
  });
}

async function attemptScript<R extends pg.QueryResultRow>(
  router: RouterInternals,
  host: HostConfig,
  shard: number,
  sql: string,
  readOnly: boolean,
  query: Omit<pg.QueryConfig, 'text' | 'values'>,
  trace?: CallTrace,
  via?: Via,
): Promise<Attempt<ScriptValue<R>>> {
  const tracking = !readOnly && router.settings.trackWriteLsn === true;
  const start = via ? via.start(shard) : router.transactionStart(shard, readOnly);
  return router.withConnection(
    host,
    shard,
    async (lease) => {
      // The newline ends a trailing `--` comment in sql before COMMIT.
      const text = `${start.text};\n${sql}\n;COMMIT${tracking ? `;${WRITE_LSN_SQL}` : ''}`;
      let results: pg.QueryResult<R>[];
      try {
        results = (await lease.client.query<R>({ ...query, text })) as unknown as pg.QueryResult<R>[];
      } catch (error) {
        // The COMMIT went in the same round trip: a connection lost before the answer leaves it unknown.
        if (!readOnly && isConnectionLoss(error)) {
          lease.broken(error);
          throw new CommitUnknownError(host.name, shard, error);
        }
        // The statements after the failing one (COMMIT too) were skipped: end the transaction.
        await lease.rollback();
        return { ok: false, error };
      }
      if (tracking) router.wrote(host.name, (results.pop()?.rows[0] as { lsn?: string } | undefined)?.lsn);
      const commit = results.at(-1);
      if (commit?.command !== 'COMMIT') {
        throw new HostError(
          host.name,
          `the transaction did not commit (${commit?.command ?? 'no result'}): the SQL must not end it itself`,
          {
            shard,
            code: 'TRANSACTION_ABORTED',
          },
        );
      }
      // BEGIN and the SET LOCALs come first; empty statements give no result.
      const framing = start.statements;
      return {
        ok: true,
        value: {
          last: results.slice(framing, -1).at(-1) ?? emptyResult<R>(),
          statements: results.length - framing - 1,
        },
      };
    },
    via,
    trace,
  );
}

/**
 * Several shards of one host in one READ ONLY transaction and one round trip. Resolves with each
 * shard's last result, or undefined when the chunk failed or its results do not have the shape
 * of `statements` results per shard (the caller then runs the shards one by one).
 */
async function attemptChunk<R extends pg.QueryResultRow>(
  router: RouterInternals,
  host: HostConfig,
  shards: readonly number[],
  sql: string,
  statements: number,
  query: Omit<pg.QueryConfig, 'text' | 'values'>,
  via?: Via,
  trace?: CallTrace,
): Promise<pg.QueryResult<R>[] | undefined> {
  const start = (shard: number): TransactionStart => (via ? via.start(shard) : router.transactionStart(shard, true));
  return router.withConnection(
    host,
    shards[0]!,
    async (lease) => {
      // Each shard in a transaction of its own, framed exactly as in attemptScript: nothing one
      // shard's text sets (SET LOCAL, set_config(…, true)) reaches the next shard's.
      const text = shards.map((shard) => `${start(shard).text};\n${sql}\n;COMMIT`).join(';');
      let results: pg.QueryResult<R>[];
      try {
        results = (await lease.client.query<R>({ ...query, text })) as unknown as pg.QueryResult<R>[];
      } catch {
        await lease.rollback();
        return undefined;
      }
      // Per shard: BEGIN and the SET LOCALs, the statements, COMMIT.
      const framing = start(shards[0]!).statements;
      const group = framing + statements + 1;
      if (!framedPerShard(results, shards.length, framing, statements)) {
        // Whatever ran, it ran read-only, and ended with COMMIT or not at all: make sure it is over.
        await lease.rollback();
        return undefined;
      }
      router.counted(host.name, true);
      return shards.map((_, i) =>
        statements === 0 ? emptyResult<R>() : results[i * group + framing - 1 + statements]!,
      );
    },
    via,
    trace,
  );
}

/** One shard's script: its last result, and how many results the text gave. */
interface ScriptValue<R extends pg.QueryResultRow> {
  last: pg.QueryResult<R>;
  statements: number;
}

function unwrapScript<R extends pg.QueryResultRow>(r: {
  value: ScriptValue<R>;
  host: string;
}): { value: pg.QueryResult<R>; host: string } {
  return { value: r.value.last, host: r.host };
}

function emptyResult<R extends pg.QueryResultRow>(): pg.QueryResult<R> {
  return { command: '', rowCount: 0, rows: [], fields: [], oid: 0 } as unknown as pg.QueryResult<R>;
}
