import type pg from 'pg';
import type { HostConfig, ShardctlConfig } from '../config/types.js';
import type { HostError } from '../errors.js';
import type { TransactionStart } from './begin.js';
import type { Lease } from './connection.js';
import type { CallTrace } from './diagnostics.js';
import type { ShardResult } from './errors.js';
import type { RouterSettings } from './options.js';
import type { ReplicaRead, ReplicaReadOptions } from './replicas.js';

/**
 * The router's option and callback types that its call paths share (router.ts, transaction.ts,
 * script.ts, shard-query.ts, pages.ts, …): here, below all of them, so that no call path imports
 * router.ts back.
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
  runChunk: (host: HostConfig, shards: number[], statements: number, trace?: CallTrace) => Promise<T[] | undefined>;
}

/**
 * What src/router/router.ts lends the modules that build calls on its paths (not public API): one
 * shard's call following moves, one attempt, the replica paths, the fan-out, a connection.
 */
export interface RouterInternals {
  config(): ShardctlConfig;
  /** The router's options, defaults resolved (options.ts). */
  settings: RouterSettings;
  checkShard(shard: number): void;
  hostForShard(shard: number): HostConfig;
  run<T>(
    shard: number,
    attemptOn: (host: HostConfig, trace: CallTrace | undefined) => Promise<Attempt<T>>,
    readOnly?: boolean,
  ): Promise<{ value: T; host: string }>;
  attempt<T>(
    host: HostConfig,
    shard: number,
    fn: ShardFn<T>,
    options: TransactionOptions,
    trace?: CallTrace,
    via?: Via,
  ): Promise<Attempt<T>>;
  /** A replica read: `attempt` on a standby first, on the primary (no Via) when none will do. */
  onReplica<T>(
    host: HostConfig,
    shard: number,
    replica: ReplicaRead,
    trace: CallTrace | undefined,
    attempt: (via?: Via) => Promise<Attempt<T>>,
  ): Promise<Attempt<T>>;
  /** A chunk on a standby of the host; undefined sends its shards one by one. */
  chunkOnReplica<V>(
    host: HostConfig,
    shards: readonly number[],
    replica: ReplicaRead,
    trace: CallTrace | undefined,
    attempt: (via?: Via) => Promise<V[] | undefined>,
  ): Promise<V[] | undefined>;
  /** A host the last reading of the fleet found it could not connect to, just now: the error a call there meets. */
  foundDown(hostName: string): HostError | undefined;
  fanOut<T>(
    runShard: (shard: number) => Promise<{ value: T; host: string }>,
    options: ForEachShardOptions,
    chunks?: Chunking<T>,
  ): Promise<ShardResult<T>[]>;
  /** A pooled connection of the host (or `via`'s) for `work`, released or destroyed after it (connection.ts). */
  withConnection<T>(
    host: HostConfig,
    shard: number,
    work: (lease: Lease) => Promise<T>,
    via?: Via,
    trace?: CallTrace,
  ): Promise<T>;
  /** Counts a round trip of several shards in router.stats(). */
  counted(host: string, ok: boolean): void;
  /** The trace of a round trip of several shards (its event on the call channel), when observed. */
  beginRoundTrip(shards: readonly number[]): CallTrace | undefined;
  transactionStart(shard: number, readOnly: boolean, sessionTimeouts?: boolean): TransactionStart;
  /** Whether fn's named statements go unnamed on every connection of `host` (a transaction pooler in front: pools.ts). */
  statementsShared(host: HostConfig): boolean;
  /** A named statement of fn met another client's, or missed its own, on `host`: a pooler is in front. */
  learnStatementsShared(host: HostConfig): void;
  /** Keeps where the WAL ended after a committed write on the host (settings.trackWriteLsn). */
  wrote(host: string, lsn: string | undefined): void;
}
