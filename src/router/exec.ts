import type pg from 'pg';
import { ShardFanOutError, type FanOutFailure, type ShardResult } from './errors.js';
import type { ShardRouter } from './router.js';

export interface ExecOptions {
  /** Default: every shard of the map. */
  shards?: readonly number[];
  /** Shards running at once over all hosts (default: the router's poolSize × hosts). */
  concurrency?: number;
  /** Allow writes; without it each shard's transaction is READ ONLY. */
  write?: boolean;
  /**
   * Read-only runs: up to this many shards of a host per round trip and READ ONLY transaction
   * (see ShardRouter.queryEachShard; a failing chunk runs again shard by shard). Default 256;
   * 1 runs every shard in its own transaction. Writes always run one shard per transaction.
   */
  shardsPerQuery?: number;
  onShardDone?: (event: { shard: number; host: string; ok: boolean; done: number; total: number }) => void;
}

/** A value as exec prints it: JSON-safe, bigints and numerics as decimal strings. */
export type ExecValue = string | number | boolean | null | object;

export interface ExecResult {
  /** Column names of the statement's result (the first shard that answered); `shard` is not among them. */
  readonly columns: string[];
  /** Every row of every shard that succeeded, in shard order. */
  readonly rows: { shard: number; host: string; values: ExecValue[] }[];
  readonly failures: readonly FanOutFailure[];
  readonly shards: number;
}

const DEFAULT_SHARDS_PER_QUERY = 256;

/**
 * Runs one SQL text in every listed shard's schema through the router's fan-out (read-only unless
 * `write`), and collects the last statement's rows. Values keep the type a script can rely on:
 * smallint/integer/real/double as numbers, boolean, json/jsonb parsed, and everything else —
 * bigint and numeric included — as the text PostgreSQL prints, never a lossy JavaScript number.
 */
export async function execSql(router: ShardRouter, sql: string, options: ExecOptions = {}): Promise<ExecResult> {
  const fanOut = {
    ...(options.shards ? { shards: options.shards } : {}),
    ...(options.concurrency ? { concurrency: options.concurrency } : {}),
    ...(options.onShardDone ? { onShardDone: options.onShardDone } : {}),
    readOnly: !options.write,
    shardsPerQuery: options.write ? 1 : (options.shardsPerQuery ?? DEFAULT_SHARDS_PER_QUERY),
    query: { rowMode: 'array', types: EXEC_TYPES },
  };
  let results: readonly ShardResult<pg.QueryResult>[];
  let failures: readonly FanOutFailure[] = [];
  try {
    results = await router.queryEachShard(sql, fanOut);
  } catch (error) {
    if (!(error instanceof ShardFanOutError)) throw error;
    results = error.results as ShardResult<pg.QueryResult>[];
    failures = error.failures;
  }
  const columns = results.find((r) => (r.value.fields ?? []).length > 0)?.value.fields.map((f) => f.name) ?? [];
  return {
    columns,
    rows: results.flatMap((r) => (r.value.rows as unknown as ExecValue[][]).map((values) => ({ shard: r.shard, host: r.host, values }))),
    failures,
    shards: results.length + failures.length,
  };
}

const NUMBER_TYPES = new Set([21, 23, 26, 700, 701]); // int2, int4, oid, float4, float8
const JSON_TYPES = new Set([114, 3802]);
const BOOL_TYPE = 16;

const EXEC_TYPES = {
  getTypeParser: (oid: number, format?: string) => {
    if (format === 'binary') return (value: unknown) => value;
    if (NUMBER_TYPES.has(oid)) return (text: string) => (Number.isFinite(Number(text)) ? Number(text) : text);
    if (JSON_TYPES.has(oid)) return (text: string) => JSON.parse(text) as unknown;
    if (oid === BOOL_TYPE) return (text: string) => text === 't';
    return (text: string) => text;
  },
} as unknown as pg.CustomTypesConfig;
