import type pg from 'pg';
import type { HostConfig } from '../config/types.js';
import type { TransactionStart } from './begin.js';
import type { ReplicaReadOptions } from './replicas.js';

/**
 * The router's option and callback types that its call paths share (router.ts, shard-query.ts,
 * pages.ts): here, below all of them, so that no call path imports router.ts back.
 */

export interface TransactionOptions extends ReplicaReadOptions {
  /** BEGIN READ ONLY: any write in fn fails (SQLSTATE 25006). */
  readOnly?: boolean;
}

/**
 * Where an attempt runs when not on the host's primary: a standby's connection, and the statements
 * that start the transaction there (with the standby's check, replicas.ts).
 */
export interface Via {
  checkout(): Promise<pg.PoolClient>;
  start(shard: number): TransactionStart;
}

export interface ForEachShardOptions extends TransactionOptions {
  /** The shards to run on, default every shard of the map; run and returned in ascending order. */
  shards?: readonly number[];
  /** Shards running at once over all hosts. Default: poolSize × hosts. */
  concurrency?: number;
  /** Shards running at once on one host. Default (and at most): poolSize. */
  perHost?: number;
  /** Called after each shard, for progress. */
  onShardDone?: (event: { shard: number; host: string; ok: boolean; done: number; total: number }) => void;
}

/** What fn receives: a client inside the shard's transaction, and the shard number. */
export type ShardFn<T> = (client: pg.PoolClient, shard: number) => Promise<T>;

export type Attempt<T> = { ok: true; value: T } | { ok: false; error: unknown };

export interface Chunking<T> {
  /** At most this many shards per chunk. */
  maxShards: number;
  /** The first shard, alone: its value and how many results the text gives per shard. */
  probe: (shard: number) => Promise<{ value: T; host: string; statements: number }>;
  /** How many results the text gives per shard, when known without a probe (one statement). */
  statements?: number;
  /** A chunk of one host's shards; undefined (or a rejection) sends them one by one. */
  runChunk: (host: HostConfig, shards: number[], statements: number) => Promise<T[] | undefined>;
}
