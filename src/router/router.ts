import pg from 'pg';
import { loadConfig } from '../config/load.js';
import { shardMovedTo } from '../config/shard-map.js';
import type { Env } from '../config/env.js';
import { hostForShard, shardSchemaName, type HostConfig, type ShardctlConfig } from '../config/types.js';
import { HostError, UsageError } from '../errors.js';
import { decodeId, parseIdString } from '../id/layout.js';
import { shardForKey } from '../id/routing.js';
import { describePgError } from '../fleet/connect.js';
import { CONTROL, shardIsActive } from '../fleet/control.js';
import { discoverFleet, discoverFromConfig, emptyFleetConfig, fleetConfig } from '../fleet/placement.js';
import { hostClientSettings, watchSilence } from '../fleet/silence.js';
import { quoteIdent } from '../pg/quote.js';
import { splitSqlBothWays, transactionEscape } from '../pg/statements.js';
import { registerUrlSecret } from '../pg/redact.js';
import { ShardFanOutError, type FanOutFailure, type ShardResult } from './errors.js';
import { DeferredBegin, framedPerShard, TransactionStart, WRITE_LSN_SQL } from './begin.js';
import { Limit } from './limit.js';
import { withConnection, type Lease } from './connection.js';
import {
  formatLsn,
  isRecoveryConflict,
  parseLsn,
  replicaCheckSql,
  replicaRead,
  replicaRefusal,
  StandbyBook,
  type ReplicaFallback,
  type ReplicaRead,
  type Standby,
  type WriteLsn,
} from './replicas.js';
import { endQuietly } from '../pg/quiet.js';
import { queryEachShardWithParams, type RouterInternals } from './shard-query.js';
import type { Attempt, Chunking, ForEachShardOptions, ShardFn, TransactionOptions, Via } from './types.js';

export type { Attempt, Chunking, ForEachShardOptions, ShardFn, TransactionOptions, Via } from './types.js';
import { queryPage, type Page, type PageOptions } from './pages.js';
import { RouterDiagnostics, type CallTrace, type HostStats } from './diagnostics.js';
import { libpqCompatible } from '../pg/tls.js';
import {
  CommitUnknownError,
  FAILOVER_RETRY_MS,
  HostAddressBook,
  isConnectionLoss,
  isFailoverSymptom,
  isHostDown,
  isInDoubt,
} from './failover.js';

/** The default of ShardRouterOptions.maxConnectionLifetimeMs: one hour. */
export const DEFAULT_MAX_CONNECTION_LIFETIME_MS = 3_600_000;

export interface ShardRouterOptions {
  /** Connections per host (the pg.Pool's max). Default 10. */
  poolSize?: number;
  /**
   * statement_timeout of every routed statement, in ms; 0 or unset: the server's setting. Set per
   * transaction (`SET LOCAL`, in the same round trip as BEGIN), not as a connection's startup
   * parameter, so it holds through a transaction pooler (PgBouncer refuses a startup
   * statement_timeout, or drops it with ignore_startup_parameters) and never outlives the call.
   */
  statementTimeoutMs?: number;
  /** idle_in_transaction_session_timeout of every routed transaction, in ms (per transaction, as above); unset: the server's setting. */
  idleInTransactionTimeoutMs?: number;
  /**
   * Shown in pg_stat_activity. Default 'shardctl-router'. A startup parameter: PgBouncer passes it
   * on to the server connection a transaction runs on.
   */
  applicationName?: string;
  /** How long to wait for a connection (connecting, or a free one in the pool). Default 10 s. */
  connectTimeoutMs?: number;
  /** How long an idle pooled connection is kept. Default 30 s; 0 keeps them until close(). */
  idleTimeoutMs?: number;
  /**
   * A pooled connection is closed once it is this old (when idle, or when released after its call),
   * and the next call opens a new one: whatever a server connection accumulates per shard it serves
   * (relation and catalog caches, about 16-20 KB a shard touched; docs/ids.md) is bounded in time.
   * Default 1 hour; 0 turns it off. Whole seconds (rounded up).
   */
  maxConnectionLifetimeMs?: number;
  /** A pooled connection is closed after this many calls (checkouts). Default 0: no limit. */
  maxConnectionUses?: number;
  /**
   * How long a call keeps retrying a shard that answers SQLSTATE SC100 (a move between its fence and
   * its switch) before that error reaches the caller. Default 10 s.
   */
  fencedTimeoutMs?: number;
  /**
   * A call still running this long (waiting for a pooled connection, the server, a move's fence or
   * the placement) logs one warning naming its shard, host and what it waits for
   * (src/router/diagnostics.ts). Default 0: no warning.
   */
  slowCallMs?: number;
  /**
   * How long a call waits for a host whose primary went away (connection lost, server shut down,
   * read-only after a demotion) to have a primary again at one of its addresses (its URL's, or the
   * fleet registry's) before the error reaches the caller. Default 15 s. A host of one address and
   * no other registry address is tried again once, not waited for. See src/router/failover.ts.
   */
  failoverTimeoutMs?: number;
  /**
   * Read where the WAL ends after each committed read-write call (pg_current_wal_insert_lsn(), in
   * the same round trip as the COMMIT), for router.lastWriteLsn(shard) and read-your-writes on
   * replicas (src/router/replicas.ts). Default false: one more statement per write.
   */
  trackWriteLsn?: boolean;
  /** For ${VAR} in host URLs; default process.env. */
  env?: Env;
  /** Resolves a relative config path; default process.cwd(). */
  cwd?: string;
}

const FIRST_BACKOFF_MS = 5;
const MAX_BACKOFF_MS = 100;
/**
 * Stale-map symptoms other than SC100: the old copy dropped (--drop-source, gc), or the old name
 * now views (no functions there): a missing relation, schema or function, or a statement views do
 * not take (TRUNCATE, COPY FROM, ALTER TABLE: 42809, wrong object type, before any of the views'
 * triggers can raise SC100); or a next_id() call caught by the clean-up's rename of the old copy
 * (its sequence then resolves in the renamed schema: SC003). Taken as a move only when the host
 * says it no longer holds the shard.
 */
const MISSING_OBJECT_SQLSTATES = new Set(['42P01', '3F000', '42883', '42809', 'SC003']);

/** Where a router takes its map from. */
export type RouterSource =
  /** A config file (path; default $SHARDCTL_CONFIG, else ./shardctl.yaml), corrected by the fleet. */
  | string
  | undefined
  /** Seed URLs only: the layout, hosts and placement come from the fleet. */
  | { readonly seeds: readonly string[] };

/**
 * The application side of the map: one pg.Pool per host (created on first use), every call run in
 * a transaction on the shard's host with `search_path` set to the shard's schema, and moves
 * followed without the caller noticing.
 *
 * Following a move: when fn fails with SQLSTATE SC100 (the fence of a moved shard, or the view left
 * under the old name), the transaction is rolled back, the map file re-read, and fn run again on
 * the host the map names now — after a short backoff (5 ms doubling to 100 ms) while the map still
 * names the old host (the move is between its fence and its switch). The SC100 error reaches the
 * caller only when the shard is still fenced `fencedTimeoutMs` (default 10 s) after the first one.
 * So **fn may run more than once**; it commits at most once, because only a failed (rolled back)
 * attempt is retried. Keep side effects outside the database (emails, queues) out of fn.
 */
export class ShardRouter {
  private config: ShardctlConfig;
  /** The file's map (file and config routers): the fallback for shards no reachable host places. */
  private readonly fileConfig: ShardctlConfig | null;
  private readonly seeds: readonly string[];
  /** Hosts that could not be read at the last discovery: name → why. */
  private unreachable = new Map<string, string>();
  /** Shards whose new host answered that it holds them, ahead of the next discovery. */
  private readonly followed = new Map<number, string>();
  /** Per host: its pool, the host URL it was made for and the one address it connects to. */
  private readonly pools = new Map<string, { url: string; address: string; pool: pg.Pool }>();
  /** Which address of each host is its primary now; found again after a failover (failover.ts). */
  private readonly addresses: HostAddressBook;
  /** Per host, the search for its new primary that calls meeting a failover wait on. */
  private readonly recovering = new Map<string, Promise<boolean>>();
  /** Hosts whose writable registry was warned about (once each). */
  private readonly distrustWarned = new Set<string>();
  private readonly ending = new Set<Promise<void>>();
  private reloading: Promise<void> | undefined;
  /** Per shard, the statements that start its transaction (read-write, read-only); reset by reload(). */
  private starts: [Map<number, TransactionStart>, Map<number, TransactionStart>] = [
    new Map<number, TransactionStart>(),
    new Map<number, TransactionStart>(),
  ];
  private closed = false;
  /** Per host, its standbys for replica reads (replicas.ts). */
  private readonly standbys: StandbyBook;
  /** Per host name, where the WAL ended after this router's last committed write there (trackWriteLsn). */
  private readonly writeLsns = new Map<string, bigint>();
  private readonly diagnostics: RouterDiagnostics;
  private readonly options: Required<
    Omit<ShardRouterOptions, 'env' | 'cwd' | 'statementTimeoutMs' | 'idleInTransactionTimeoutMs' | 'trackWriteLsn'>
  > &
    Pick<ShardRouterOptions, 'env' | 'cwd' | 'statementTimeoutMs' | 'idleInTransactionTimeoutMs' | 'trackWriteLsn'>;

  private constructor(
    config: ShardctlConfig,
    options: ShardRouterOptions,
    source: { file: boolean; seeds?: readonly string[] },
  ) {
    this.config = config;
    this.fileConfig = source.file ? config : null;
    this.seeds = source.seeds ?? [];
    const poolSize = options.poolSize ?? 10;
    if (!Number.isSafeInteger(poolSize) || poolSize < 1)
      throw new RangeError(`poolSize ${poolSize} must be a positive integer`);
    for (const name of ['statementTimeoutMs', 'idleInTransactionTimeoutMs'] as const) {
      const value = options[name];
      if (value !== undefined && (!Number.isSafeInteger(value) || value < 0 || value > 2_147_483_647))
        throw new RangeError(`${name} ${value} must be a whole number of milliseconds (0: the server's setting)`);
    }
    const maxConnectionLifetimeMs = options.maxConnectionLifetimeMs ?? DEFAULT_MAX_CONNECTION_LIFETIME_MS;
    if (!Number.isSafeInteger(maxConnectionLifetimeMs) || maxConnectionLifetimeMs < 0)
      throw new RangeError(
        `maxConnectionLifetimeMs ${maxConnectionLifetimeMs} must be a whole number of milliseconds (0: no limit)`,
      );
    const maxConnectionUses = options.maxConnectionUses ?? 0;
    if (!Number.isSafeInteger(maxConnectionUses) || maxConnectionUses < 0)
      throw new RangeError(`maxConnectionUses ${maxConnectionUses} must be a whole number (0: no limit)`);
    this.options = {
      ...options,
      poolSize,
      applicationName: options.applicationName ?? 'shardctl-router',
      connectTimeoutMs: options.connectTimeoutMs ?? 10_000,
      idleTimeoutMs: options.idleTimeoutMs ?? 30_000,
      fencedTimeoutMs: options.fencedTimeoutMs ?? 10_000,
      failoverTimeoutMs: options.failoverTimeoutMs ?? 15_000,
      maxConnectionLifetimeMs,
      maxConnectionUses,
      slowCallMs: options.slowCallMs ?? 0,
    };
    if (!Number.isSafeInteger(this.options.slowCallMs) || this.options.slowCallMs < 0)
      throw new RangeError(
        `slowCallMs ${this.options.slowCallMs} must be a whole number of milliseconds (0: no warning)`,
      );
    if (options.trackWriteLsn !== undefined && typeof options.trackWriteLsn !== 'boolean')
      throw new RangeError(`trackWriteLsn ${JSON.stringify(options.trackWriteLsn)} must be true or false`);
    this.diagnostics = new RouterDiagnostics(this.options.slowCallMs);
    this.standbys = new StandbyBook({
      applicationName: this.options.applicationName,
      connectTimeoutMs: this.options.connectTimeoutMs,
      poolSize: this.options.poolSize,
      idleTimeoutMs: this.options.idleTimeoutMs,
    });
    this.addresses = new HostAddressBook({
      applicationName: this.options.applicationName,
      connectTimeoutMs: this.options.connectTimeoutMs,
    });
  }

  /**
   * Opens a router on the fleet. From a config file (the argument, else $SHARDCTL_CONFIG, else
   * ./shardctl.yaml), or from seed URLs alone (`{ seeds: ['postgres://app@db1/app'] }`): either way
   * the hosts are read once (their placement and registry) and the fleet's placement is used;
   * where the file disagrees, the fleet wins. Hosts the file does not list are reached at their
   * registry address with the credentials of the file's first host (or of the first seed), else
   * PGUSER/PGPASSWORD/~/.pgpass. A host that cannot be read is left out; calls for its shards fail
   * naming it. Pools connect lazily.
   */
  static async open(source?: RouterSource, options: ShardRouterOptions = {}): Promise<ShardRouter> {
    if (typeof source === 'object' && source !== null) {
      const seeds = [...source.seeds];
      if (seeds.length === 0) throw new RangeError('seeds: give at least one URL');
      seeds.forEach(registerUrlSecret);
      const router = new ShardRouter(emptyFleetConfig(), options, { file: false, seeds });
      await router.discover();
      return router;
    }
    const config = await loadConfig(source, {
      checkMigrationsDir: false,
      ...(options.env ? { env: options.env } : {}),
      ...(options.cwd ? { cwd: options.cwd } : {}),
    });
    return ShardRouter.openConfig(config, options);
  }

  /** A router over an already loaded config, corrected by the fleet's placement (read now). */
  static async openConfig(config: ShardctlConfig, options: ShardRouterOptions = {}): Promise<ShardRouter> {
    const router = new ShardRouter(config, options, { file: true });
    // Just loaded: the file is read again only by later discoveries.
    await router.discover({ rereadFile: false });
    return router;
  }

  /**
   * A router over an already loaded map, without reading the fleet first: the file is trusted until
   * a call meets a moved shard, which makes the router read the fleet. Prefer open()/openConfig().
   */
  static fromConfig(config: ShardctlConfig, options: ShardRouterOptions = {}): ShardRouter {
    return new ShardRouter(config, options, { file: true });
  }

  /** The map in use now (replaced by each reload). */
  get map(): ShardctlConfig {
    return this.config;
  }

  hostForShard(shard: number): HostConfig {
    this.checkShard(shard);
    const followed = this.followed.get(shard);
    const host =
      (followed !== undefined ? this.config.hosts.find((h) => h.name === followed) : undefined) ??
      hostForShard(this.config, shard);
    if (!host) {
      const down = [...this.unreachable.keys()];
      throw new HostError(
        down.join(', ') || '?',
        `no reachable host holds shard ${shard}${down.length > 0 ? `; not answering: ${down.join(', ')}` : ''}`,
        {
          shard,
          code: 'HOST_UNREACHABLE',
        },
      );
    }
    return host;
  }

  /** Hosts that could not be read at the last discovery, with the reason. */
  unreachableHosts(): { name: string; reason: string }[] {
    return [...this.unreachable].map(([name, reason]) => ({ name, reason }));
  }

  shardForKey(key: bigint): number {
    if (typeof key !== 'bigint') throw new TypeError(`key ${String(key)} must be a bigint`);
    return shardForKey(key, this.config.shards);
  }

  /** The shard an id was made in, decoded with the map's id layout. Accepts a decimal string. */
  shardForId(id: bigint | string): number {
    const value = typeof id === 'string' ? parseIdString(id) : id;
    if (typeof value !== 'bigint') throw new TypeError(`id ${JSON.stringify(id)} is not a decimal 64-bit id`);
    const { shard } = decodeId(value, this.config.idLayout);
    if (shard >= this.config.shards) {
      throw new RangeError(`id ${value} carries shard ${shard}, but the map has shards 0-${this.config.shards - 1}`);
    }
    return shard;
  }

  async withShard<T>(shard: number, fn: ShardFn<T>, options: TransactionOptions = {}): Promise<T> {
    const replica = replicaRead(options);
    return (await this.run(shard, this.attemptOn(shard, fn, options, replica), options.readOnly ?? false)).value;
  }

  /**
   * The LSN after this router's last committed write to the host of `shard` (any shard of that
   * host), to pass as `afterLsn` so that a replica read sees it; undefined before any. Needs the
   * router opened with `trackWriteLsn: true`.
   */
  lastWriteLsn(shard: number): WriteLsn | undefined {
    if (this.options.trackWriteLsn !== true)
      throw new UsageError('needs the router opened with trackWriteLsn: true', {
        input: 'lastWriteLsn',
        data: { next: 'open the router with { trackWriteLsn: true }' },
      });
    const host = this.hostForShard(shard).name;
    const lsn = this.writeLsns.get(host);
    return lsn === undefined ? undefined : { host, lsn: formatLsn(lsn) };
  }

  /** One attempt of fn on `shard`: on the host's primary, or first on a standby for a replica read. */
  private attemptOn<T>(
    shard: number,
    fn: ShardFn<T>,
    options: TransactionOptions,
    replica: ReplicaRead | undefined,
  ): (host: HostConfig, trace: CallTrace | undefined) => Promise<Attempt<T>> {
    if (!replica) return (host, trace) => this.attempt(host, shard, fn, options, trace);
    return (host, trace) =>
      this.onReplica(host, shard, replica, trace, (via) => this.attempt(host, shard, fn, options, trace, via));
  }

  /** Instagram routing: the shard of `key mod shards` (e.g. a user id). */
  async withKey<T>(key: bigint, fn: ShardFn<T>, options: TransactionOptions = {}): Promise<T> {
    return this.withShard(this.shardForKey(key), fn, options);
  }

  /** The shard an id carries (e.g. a photo id made by that shard's next_id()). */
  async withId<T>(id: bigint | string, fn: ShardFn<T>, options: TransactionOptions = {}): Promise<T> {
    return this.withShard(this.shardForId(id), fn, options);
  }

  /**
   * Runs fn on every shard (or `options.shards`), each in its own transaction as withShard does,
   * at most `perHost` at once on a host and `concurrency` at once overall. Resolves with the
   * results in shard order; when any shard failed, every other shard still ran and the call
   * rejects with a ShardFanOutError holding both the results and the failures.
   */
  forEachShard<T>(fn: ShardFn<T>, options: ForEachShardOptions = {}): Promise<ShardResult<T>[]> {
    const txOptions: TransactionOptions = options.readOnly ? { readOnly: true } : {};
    let replica: ReplicaRead | undefined;
    try {
      replica = replicaRead(options);
    } catch (error) {
      return Promise.reject(error as Error);
    }
    return this.fanOut(
      (shard) => this.run(shard, this.attemptOn(shard, fn, txOptions, replica), txOptions.readOnly ?? false),
      options,
    );
  }

  /**
   * forEachShard for one SQL text without parameters (one or more statements): each shard's
   * BEGIN, search_path, the text and COMMIT go in a single round trip. Each result is the last
   * statement's. A text that would end the transaction itself or change the session beyond it
   * (COMMIT, ROLLBACK, BEGIN, SET without LOCAL, SET LOCAL search_path/role, RESET, DISCARD,
   * set_config: see transactionEscape in src/pg/statements.ts) is refused with a UsageError before
   * anything is sent, since the shards after it would run outside their schema. READ ONLY guards
   * against accidents, it is not a permission (use a read-only role for that).
   *
   * `shardsPerQuery` (read-only runs only; default 1): up to that many shards of a host in one
   * round trip (`BEGIN READ ONLY; SET LOCAL search_path TO a; sql; COMMIT; BEGIN READ ONLY; SET
   * LOCAL search_path TO b; sql; COMMIT; …`), each shard in a READ ONLY transaction of its own, so
   * nothing one shard's text sets is seen by the next; the host's shards split evenly over its
   * connections. The first shard runs alone first: when it succeeds, the number of results the
   * text gives per shard is known, and every chunk's results must match it shard by shard
   * (otherwise, e.g. a text that leaves a quote open, the chunk is not trusted). A chunk that
   * fails (an error skips the rest of the round trip) runs again one shard per round trip, so the
   * failing shard is named and the others' results kept.
   */
  queryEachShard<R extends pg.QueryResultRow = pg.QueryResultRow>(
    sql: string,
    options: ForEachShardOptions & {
      query?: Omit<pg.QueryConfig, 'text' | 'values'>;
      shardsPerQuery?: number;
      /** Bind parameters ($1, $2, …) of a one-statement sql (src/router/shard-query.ts). */
      params?: readonly unknown[];
    } = {},
  ): Promise<ShardResult<pg.QueryResult<R>>[]> {
    let replica: ReplicaRead | undefined;
    try {
      replica = replicaRead(options);
    } catch (error) {
      return Promise.reject(error as Error);
    }
    if (options.params !== undefined)
      return queryEachShardWithParams<R>(this.internals(), sql, options.params, options, replica);
    for (const statement of splitSqlBothWays(sql)) {
      const escape = transactionEscape(statement);
      if (escape)
        return Promise.reject(
          new UsageError(`line ${statement.line} ${JSON.stringify(statement.code.slice(0, 60))}: ${escape}`, {
            input: 'sql',
          }),
        );
    }
    const body = sql.replace(/[\s;]+$/, '');
    const readOnly = options.readOnly ?? false;
    const query = options.query ?? {};
    const shardsPerQuery = options.shardsPerQuery ?? 1;
    if (!Number.isSafeInteger(shardsPerQuery) || shardsPerQuery < 1)
      throw new RangeError(`shardsPerQuery ${shardsPerQuery} must be a positive integer`);
    const single = (shard: number) =>
      this.run(
        shard,
        (host, trace) =>
          replica
            ? this.onReplica(host, shard, replica, trace, (via) =>
                this.attemptScript<R>(host, shard, body, readOnly, query, trace, via),
              )
            : this.attemptScript<R>(host, shard, body, readOnly, query, trace),
        readOnly,
      );
    if (!readOnly || shardsPerQuery === 1)
      return this.fanOut(async (shard) => unwrapScript(await single(shard)), options);
    return this.fanOut(async (shard) => unwrapScript(await single(shard)), options, {
      maxShards: shardsPerQuery,
      probe: async (shard) => {
        const r = await single(shard);
        return { value: r.value.last, host: r.host, statements: r.value.statements };
      },
      runChunk: (host, shards, statements) =>
        replica
          ? this.chunkOnReplica(host, shards, replica, (via) =>
              this.attemptChunk<R>(host, shards, body, statements, query, via),
            )
          : this.attemptChunk<R>(host, shards, body, statements, query),
    });
  }

  /**
   * A page of rows merged by id across shards (every shard, `shards`, or the shards of `keys`),
   * newest first or oldest first, with an opaque cursor for the next: see queryPage in
   * src/router/pages.ts. One parameterised SELECT; each shard asked only for rows past the cursor and
   * at most `limit`; shards of one host share round trips; moved shards are followed.
   */
  queryPage<R extends pg.QueryResultRow = pg.QueryResultRow>(sql: string, options: PageOptions): Promise<Page<R>> {
    return queryPage<R>(this.internals(), sql, options);
  }

  private async fanOut<T>(
    runShard: (shard: number) => Promise<{ value: T; host: string }>,
    options: ForEachShardOptions,
    chunks?: Chunking<T>,
  ): Promise<ShardResult<T>[]> {
    const shards = [...new Set(options.shards ?? Array.from({ length: this.config.shards }, (_, i) => i))].sort(
      (a, b) => a - b,
    );
    for (const shard of shards) this.checkShard(shard);
    const perHost = Math.min(options.perHost ?? this.options.poolSize, this.options.poolSize);
    const overall = new Limit(options.concurrency ?? this.options.poolSize * this.config.hosts.length);
    if (!Number.isSafeInteger(perHost) || perHost < 1)
      throw new RangeError(`perHost ${perHost} must be a positive integer`);

    const outcomes = new Map<number, { ok: true; result: ShardResult<T> } | { ok: false; failure: FanOutFailure }>();
    let done = 0;
    const record = (
      shard: number,
      outcome: { ok: true; result: ShardResult<T> } | { ok: false; failure: FanOutFailure },
    ): void => {
      outcomes.set(shard, outcome);
      done += 1;
      options.onShardDone?.({
        shard,
        host: outcome.ok ? outcome.result.host : outcome.failure.host,
        ok: outcome.ok,
        done,
        total: shards.length,
      });
    };
    const runOne = async (shard: number, hostName: string): Promise<void> => {
      try {
        const r = await runShard(shard);
        record(shard, { ok: true, result: { shard, host: r.host, value: r.value } });
      } catch (error) {
        record(shard, {
          ok: false,
          failure: { shard, host: hostForShard(this.config, shard)?.name ?? hostName, error },
        });
      }
    };

    // Chunked runs: the first shard alone tells how many results the text gives per shard.
    let statements: number | undefined;
    let rest = shards;
    if (chunks?.statements !== undefined) statements = chunks.statements;
    else if (chunks && shards.length > 1) {
      const first = shards[0]!;
      rest = shards.slice(1);
      await overall.run(async () => {
        try {
          const r = await chunks.probe(first);
          statements = r.statements;
          record(first, { ok: true, result: { shard: first, host: r.host, value: r.value } });
        } catch (error) {
          record(first, {
            ok: false,
            failure: { shard: first, host: hostForShard(this.config, first)?.name ?? '', error },
          });
        }
      });
    }

    const byHost = new Map<string, number[]>();
    for (const shard of rest) {
      const host = this.hostForShard(shard).name;
      const queue = byHost.get(host);
      if (queue) queue.push(shard);
      else byHost.set(host, [shard]);
    }
    // Per host, `perHost` workers take that host's shards in order (a chunk at a time when
    // chunking, the host's shards split evenly over its workers); each also holds a slot of the
    // overall limit while it runs.
    await Promise.all(
      [...byHost.entries()].flatMap(([hostName, queue]) => {
        const workers = Math.min(perHost, queue.length);
        const size =
          chunks && statements !== undefined
            ? Math.max(1, Math.min(chunks.maxShards, Math.ceil(queue.length / workers)))
            : 1;
        let next = 0;
        const worker = async (): Promise<void> => {
          while (next < queue.length) {
            const chunk = queue.slice(next, next + size);
            next += chunk.length;
            await overall.run(async () => {
              if (chunk.length === 1 || !chunks || statements === undefined) {
                for (const shard of chunk) await runOne(shard, hostName);
                return;
              }
              const host = this.hostForShard(chunk[0]!);
              // A reload (a move) may have sent some of them elsewhere: only a chunk on one host runs whole.
              // A failed chunk is not lost: its shards run one by one below, each reporting its own error.
              const values = chunk.every((s) => this.hostForShard(s) === host)
                ? await chunks.runChunk(host, chunk, statements).catch(() => undefined)
                : undefined;
              if (values) {
                chunk.forEach((shard, i) =>
                  record(shard, { ok: true, result: { shard, host: host.name, value: values[i]! } }),
                );
                return;
              }
              // The chunk failed (or its results were not what one shard gives): shard by shard.
              for (const shard of chunk) await runOne(shard, hostName);
            });
          }
        };
        return Array.from({ length: workers }, worker);
      }),
    );
    const results: ShardResult<T>[] = [];
    const failures: FanOutFailure[] = [];
    for (const shard of shards) {
      const outcome = outcomes.get(shard)!;
      if (outcome.ok) results.push(outcome.result);
      else failures.push(outcome.failure);
    }
    if (failures.length > 0) throw new ShardFanOutError(results, failures, shards.length);
    return results;
  }

  /**
   * Reads the placement from the fleet again (and the file first, for a router opened from one).
   * Concurrent callers share one read. A host that left the map, or whose URL changed, has its pool
   * ended (after its checked-out connections come back).
   */
  reload(): Promise<void> {
    this.reloading ??= (async () => {
      try {
        await this.discover();
      } finally {
        this.reloading = undefined;
      }
    })();
    return this.reloading;
  }

  private async discover(options: { rereadFile?: boolean } = {}): Promise<void> {
    let file = this.fileConfig;
    if (file && file.file !== '<inline>' && options.rereadFile !== false) {
      try {
        file = await loadConfig(file.file, {
          checkMigrationsDir: false,
          ...(this.options.env ? { env: this.options.env } : {}),
          ...(this.options.cwd ? { cwd: this.options.cwd } : {}),
        });
      } catch {
        // The file is being replaced or is invalid for a moment: the fleet decides anyway.
      }
    }
    const reading = { applicationName: this.options.applicationName, connectTimeoutMs: this.options.connectTimeoutMs };
    const found = file
      ? await discoverFromConfig(file, reading)
      : await discoverFleet(
          [
            ...this.config.hosts.map((h) => ({ name: h.name, url: h.url })),
            ...this.seeds.map((url, i) => ({ name: `seed ${i + 1}`, url })),
          ],
          { ...reading, ...(this.seeds[0] ? { credentials: this.seeds[0] } : {}) },
        );
    if (!file && found.placement.answered.length === 0) {
      throw new HostError(
        found.unreachable.map((u) => u.name).join(', ') || 'seeds',
        `no seed could be read: ${found.unreachable.map((u) => `${u.name}: ${u.reason}`).join('; ')}`,
        {
          code: 'HOST_UNREACHABLE',
        },
      );
    }
    const next = fleetConfig(file, found);
    for (const { name, writers } of 'distrusted' in found ? found.distrusted : []) {
      if (this.distrustWarned.has(name)) continue;
      this.distrustWarned.add(name);
      process.emitWarning(
        `shardctl: host ${name}'s registry of host addresses is writable by ${writers.join(', ')} (not only its owner): the addresses it lists are not used, and no password goes there; run shardctl status`,
        { code: 'SHARDCTL_REGISTRY_WRITABLE' },
      );
    }
    this.config = next;
    this.addresses.learn(found.registryUrls ?? new Map());
    this.unreachable = new Map(found.unreachable.map((u) => [u.name, u.reason]));
    this.followed.clear();
    this.starts = [new Map<number, TransactionStart>(), new Map<number, TransactionStart>()];
    for (const [name, entry] of this.pools) {
      const host = next.hosts.find((h) => h.name === name);
      if (!host || host.url !== entry.url) {
        this.endPool(name);
        this.addresses.forget(name);
      }
    }
  }

  /**
   * The call paths that src/router/shard-query.ts and pages.ts build on, for those modules only
   * (not public API): one shard's call following moves, one attempt, the fan-out, a connection.
   */
  private internals(): RouterInternals {
    return {
      config: () => this.config,
      checkShard: (shard) => this.checkShard(shard),
      hostForShard: (shard) => this.hostForShard(shard),
      run: (shard, attemptOn, readOnly) => this.run(shard, attemptOn, readOnly),
      attempt: (host, shard, fn, options, trace, via) => this.attempt(host, shard, fn, options, trace, via),
      onReplica: (host, shard, replica, trace, attempt) => this.onReplica(host, shard, replica, trace, attempt),
      chunkOnReplica: (host, shards, replica, attempt) => this.chunkOnReplica(host, shards, replica, attempt),
      fanOut: (runShard, options, chunks) => this.fanOut(runShard, options, chunks),
      withConnection: (host, shard, work, via) => this.withConnection(host, shard, undefined, work, via),
      counted: (host, ok) => this.diagnostics.ended(host, ok),
      transactionStart: (shard, readOnly) => this.transactionStart(shard, readOnly),
    };
  }

  /** Ends every pool; waits for checked-out connections to be released. The router is unusable after. */
  async close(): Promise<void> {
    this.closed = true;
    for (const name of [...this.pools.keys()]) this.endPool(name);
    await Promise.all([...this.ending, this.standbys.close()]);
  }

  /**
   * Per host of the map (and any with a pool or counted calls): the pool's connections, idle ones
   * and calls waiting for one, now; and since the router opened, the calls that ended there, the
   * failed ones, and the moves followed away from it. Events per call: src/router/diagnostics.ts.
   */
  stats(): HostStats[] {
    return this.diagnostics.stats(
      new Map([...this.pools].map(([name, entry]) => [name, entry.pool])),
      this.config.hosts.map((h) => h.name),
    );
  }

  /** Names of the hosts with an open pool (for tests and health checks). */
  openPools(): string[] {
    return [...this.pools.keys()];
  }

  private checkShard(shard: number): void {
    if (!Number.isSafeInteger(shard) || shard < 0 || shard >= this.config.shards) {
      throw new RangeError(`shard ${shard} is not in the map (0-${this.config.shards - 1})`);
    }
  }

  private async pool(host: HostConfig): Promise<pg.Pool> {
    if (this.closed) throw new Error('the ShardRouter is closed');
    const existing = this.pools.get(host.name);
    if (existing && existing.url === host.url && this.addresses.known(host)?.url === existing.address)
      return existing.pool;
    const address = (await this.addresses.resolve(host)).url;
    if (this.closed) throw new Error('the ShardRouter is closed');
    const current = this.pools.get(host.name);
    if (current && current.url === host.url && current.address === address) return current.pool;
    if (current) this.endPool(host.name);
    registerUrlSecret(host.url);
    registerUrlSecret(address);
    const pool = new pg.Pool({
      connectionString: libpqCompatible(address),
      max: this.options.poolSize,
      application_name: this.options.applicationName,
      ...hostClientSettings(host),
      connectionTimeoutMillis: this.options.connectTimeoutMs,
      idleTimeoutMillis: this.options.idleTimeoutMs,
      // pg.Pool counts both in its own units: whole seconds, and 0 / Infinity for none.
      maxLifetimeSeconds: Math.ceil(this.options.maxConnectionLifetimeMs / 1000),
      maxUses: this.options.maxConnectionUses || Infinity,
    });
    // An idle pooled connection whose server goes away emits 'error'; unhandled it would crash the
    // application. The pool drops that connection and the next checkout opens a new one.
    pool.on('error', () => undefined);
    // A host that stops answering fails the call waiting on it, naming the host, within its timeout
    // (the address this pool goes to is the one probed).
    const watched = address === host.url ? host : { ...host, url: address };
    pool.on('connect', (client) => watchSilence(client, watched));
    this.pools.set(host.name, { url: host.url, address, pool });
    return pool;
  }

  /**
   * After a failover symptom on `host` (failover.ts): forgets the address the failed call used
   * (unless another call already found a new one), and looks for the host's primary until one
   * answers or `deadline`; re-reads the registry meanwhile. Resolves true when a primary was found
   * (the call may run again), false otherwise. Calls meeting the same failure share one search.
   */
  private recover(
    host: HostConfig,
    usedAddress: string | undefined,
    deadline: number,
    error: unknown,
  ): Promise<boolean> {
    if (this.closed) return Promise.resolve(false);
    // A host of one address, with no other in the registry, that could not be reached or stopped
    // answering (the silence watchdog has already asked it over a new connection): nowhere to go.
    if (isHostDown(error) && !this.hasAlternatives(host)) return Promise.resolve(false);
    if (usedAddress !== undefined && this.addresses.known(host)?.url === usedAddress) {
      this.addresses.forget(host.name);
      this.endPool(host.name);
    }
    let recovering = this.recovering.get(host.name);
    if (!recovering) {
      recovering = this.searchPrimary(host.name, deadline).finally(() => this.recovering.delete(host.name));
      this.recovering.set(host.name, recovering);
    }
    return recovering;
  }

  private async searchPrimary(name: string, deadline: number): Promise<boolean> {
    let reloaded: Promise<void> | undefined;
    for (let round = 0; ; round += 1) {
      const host = this.config.hosts.find((h) => h.name === name);
      if (!host || this.closed) return false;
      try {
        await this.addresses.resolve(host, true);
        return true;
      } catch {
        // No address answers as a primary yet.
      }
      // The registry may name another address for the host (map pull), or the file another URL.
      reloaded ??= this.reload().catch(() => undefined);
      if (round === 0) await reloaded;
      const now = this.config.hosts.find((h) => h.name === name);
      // A host with nowhere else to look is tried again once (after the reload), not waited for.
      if (!now || (round > 0 && !this.hasAlternatives(now)) || Date.now() >= deadline) return false;
      if (round > 0) await new Promise((resolve) => setTimeout(resolve, FAILOVER_RETRY_MS));
      if (round % 20 === 19) reloaded = undefined;
    }
  }

  private hasAlternatives(host: HostConfig): boolean {
    return !HostAddressBook.isPlain(host) || this.addresses.hasRegistryAlternative(host);
  }

  private endPool(name: string): void {
    const entry = this.pools.get(name);
    if (!entry) return;
    this.pools.delete(name);
    const ending = endQuietly(entry.pool);
    this.ending.add(ending);
    void ending.finally(() => this.ending.delete(ending));
  }

  /** One call, following moves: returns fn's value and the host it committed on (counted, and traced when observed). */
  private async run<T>(
    shard: number,
    attemptOn: (host: HostConfig, trace: CallTrace | undefined) => Promise<Attempt<T>>,
    readOnly = false,
  ): Promise<{ value: T; host: string }> {
    this.checkShard(shard);
    const trace = this.diagnostics.begin(shard);
    let last: string | undefined;
    try {
      const done = await this.follow(shard, attemptOn, trace, (host) => (last = host), readOnly);
      this.diagnostics.ended(done.host, true);
      trace?.end(done.host);
      return done;
    } catch (error) {
      // No host at all (none reachable holds the shard): nothing to count against.
      if (last !== undefined) this.diagnostics.ended(last, false);
      trace?.end(last ?? '', { error });
      throw error;
    }
  }

  private async follow<T>(
    shard: number,
    attemptOn: (host: HostConfig, trace: CallTrace | undefined) => Promise<Attempt<T>>,
    trace: CallTrace | undefined,
    onHost: (host: string) => void,
    readOnly: boolean,
  ): Promise<{ value: T; host: string }> {
    let fencedSince: number | undefined;
    let backoffMs = FIRST_BACKOFF_MS;
    let failoverDeadline: number | undefined;
    for (;;) {
      const host = this.hostForShard(shard);
      onHost(host.name);
      trace?.attempt(host.name);
      const usedAddress = this.addresses.known(host)?.url;
      let attempt: Attempt<T>;
      try {
        attempt = await attemptOn(host, trace);
      } catch (error) {
        // Connecting failed, or the connection was lost where nothing can have committed.
        if (!isInDoubt(error) && isFailoverSymptom(error, readOnly)) {
          failoverDeadline ??= Date.now() + this.options.failoverTimeoutMs;
          // Bounded even when each search finds an address at once and the call fails there again.
          if (Date.now() < failoverDeadline && (await this.recover(host, usedAddress, failoverDeadline, error)))
            continue;
        }
        throw error;
      }
      if (attempt.ok) return { value: attempt.value, host: host.name };
      const error = attempt.error;
      // fn's statement failed because the host's primary went away: rolled back, run it again there.
      if (isFailoverSymptom(error, readOnly)) {
        failoverDeadline ??= Date.now() + this.options.failoverTimeoutMs;
        if (Date.now() < failoverDeadline && (await this.recover(host, usedAddress, failoverDeadline, error))) continue;
        throw error;
      }
      const moved = shardMovedTo(error);
      if (!moved && !MISSING_OBJECT_SQLSTATES.has((error as { code?: string }).code ?? '')) throw error;
      // A missing object on a host that still holds the shard is the application's error.
      if (!moved && (await this.holds(host.name, shard)) !== false) throw error;

      const now = Date.now();
      fencedSince ??= now;
      const waited = now - fencedSince;
      if (waited >= this.options.fencedTimeoutMs) throw error;
      trace?.retry(host.name, error);
      // The fence names the new host: straight there once it holds the shard (the switch is done).
      if (moved && moved.host !== host.name) {
        // No host answering the reload just now leaves the map in use: holds() below decides all the same.
        trace?.waiting('the new host to hold the shard', moved.host);
        if (!this.config.hosts.some((h) => h.name === moved.host)) await this.reload().catch(() => undefined);
        if ((await this.holds(moved.host, shard)) === true) {
          this.followed.set(shard, moved.host);
          this.diagnostics.followed(host.name);
          trace?.followed(host.name, moved.host);
          continue;
        }
      } else {
        trace?.waiting('the placement (reading the fleet)');
        try {
          await this.reload();
        } catch {
          // No host answered just now: retry with the map in use.
        }
        const now = this.hostForShard(shard).name;
        if (now !== host.name) {
          this.diagnostics.followed(host.name);
          trace?.followed(host.name, now);
          continue;
        }
      }
      // Fenced, not switched yet: wait a little, then try again.
      const jitter = Math.random() * backoffMs * 0.5;
      const since = trace?.waiting('the fence of a move', host.name);
      await new Promise((resolve) =>
        setTimeout(resolve, Math.min(backoffMs + jitter, this.options.fencedTimeoutMs - waited)),
      );
      if (since !== undefined) trace?.fenceWaited(since);
      backoffMs = Math.min(backoffMs * 2, MAX_BACKOFF_MS);
    }
  }

  /** Whether `hostName` holds `shard` active (its control schema says so); undefined when it cannot tell. */
  private async holds(hostName: string, shard: number): Promise<boolean | undefined> {
    const host = this.config.hosts.find((h) => h.name === hostName);
    if (!host) return undefined;
    try {
      const result = await (
        await this.pool(host)
      ).query<{ active: boolean }>(`SELECT ${shardIsActive()} AS active FROM ${CONTROL}.shards WHERE shard = $1`, [
        shard,
      ]);
      return result.rows[0]?.active ?? false;
    } catch {
      return undefined;
    }
  }

  private async attempt<T>(
    host: HostConfig,
    shard: number,
    fn: ShardFn<T>,
    options: TransactionOptions,
    trace?: CallTrace,
    via?: Via,
  ): Promise<Attempt<T>> {
    const readOnly = options.readOnly ?? false;
    const tracking = !readOnly && this.options.trackWriteLsn === true;
    return this.withConnection(
      host,
      shard,
      trace,
      async (lease) => {
        const client = lease.client;
        // BEGIN and SET LOCAL go out with fn's first query, in the same write, and COMMIT too when
        // fn returns that query's promise (DeferredBegin).
        const begin = new DeferredBegin(
          client,
          via ? via.start(shard) : this.transactionStart(shard, readOnly),
          tracking,
        );
        let value: T;
        try {
          const returned = fn(client, shard);
          begin.returned(returned);
          value = await returned;
        } catch (error) {
          // Restored first: the ROLLBACK must reach the server even after a COMMIT went with fn's query.
          begin.restore();
          // The COMMIT went with fn's query, and the connection was lost before its answer.
          if (begin.commitSent && !options.readOnly && isConnectionLoss(error)) {
            lease.broken(error);
            throw new CommitUnknownError(host.name, shard, error);
          }
          if (begin.started) await lease.rollback();
          // On a standby, the check that failed (replicas.ts) rather than fn's "transaction is aborted".
          return { ok: false, error: via ? (begin.error ?? error) : error };
        }
        begin.restore();
        // fn ran no statement: no transaction was started, nothing to commit.
        if (!begin.started) return { ok: true, value };
        if (begin.error) throw begin.error;
        // Committed with fn's only query.
        if (begin.committed === 'COMMIT') {
          if (tracking) this.wrote(host.name, begin.writeLsn);
          return { ok: true, value };
        }
        const commit =
          begin.committed !== undefined
            ? { command: begin.committed }
            : await commitOrDoubt(client, host, shard, tracking);
        if (tracking && commit.command === 'COMMIT') this.wrote(host.name, commit.writeLsn);
        // COMMIT of a transaction in which a statement failed (fn caught the error) rolls back.
        if (commit.command === 'ROLLBACK') {
          throw new HostError(
            host.name,
            'the transaction was rolled back: a statement in it failed and fn caught the error',
            {
              shard,
              code: 'TRANSACTION_ABORTED',
            },
          );
        }
        return { ok: true, value };
      },
      via,
    );
  }

  private async attemptScript<R extends pg.QueryResultRow>(
    host: HostConfig,
    shard: number,
    sql: string,
    readOnly: boolean,
    query: Omit<pg.QueryConfig, 'text' | 'values'>,
    trace?: CallTrace,
    via?: Via,
  ): Promise<Attempt<ScriptValue<R>>> {
    const tracking = !readOnly && this.options.trackWriteLsn === true;
    const start = via ? via.start(shard) : this.transactionStart(shard, readOnly);
    return this.withConnection(
      host,
      shard,
      trace,
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
        if (tracking) this.wrote(host.name, (results.pop()?.rows[0] as { lsn?: string } | undefined)?.lsn);
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
    );
  }

  /**
   * Several shards of one host in one READ ONLY transaction and one round trip. Resolves with each
   * shard's last result, or undefined when the chunk failed or its results do not have the shape
   * of `statements` results per shard (the caller then runs the shards one by one).
   */
  private async attemptChunk<R extends pg.QueryResultRow>(
    host: HostConfig,
    shards: readonly number[],
    sql: string,
    statements: number,
    query: Omit<pg.QueryConfig, 'text' | 'values'>,
    via?: Via,
  ): Promise<pg.QueryResult<R>[] | undefined> {
    const start = (shard: number): TransactionStart => (via ? via.start(shard) : this.transactionStart(shard, true));
    return this.withConnection(
      host,
      shards[0]!,
      undefined,
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
        this.diagnostics.ended(host.name, true);
        return shards.map((_, i) =>
          statements === 0 ? emptyResult<R>() : results[i * group + framing - 1 + statements]!,
        );
      },
      via,
    );
  }

  /**
   * BEGIN [READ ONLY], the shard's search_path and the router's timeouts, built once per shard and
   * map. Everything is transaction-local: a pooled server connection (the router's own, or
   * PgBouncer's shared by other clients) is left with the server's settings when the call ends.
   */
  private transactionStart(shard: number, readOnly: boolean): TransactionStart {
    const cache = this.starts[readOnly ? 1 : 0];
    let start = cache.get(shard);
    if (!start) {
      start = new TransactionStart(this.startStatements(shard, readOnly));
      cache.set(shard, start);
    }
    return start;
  }

  private startStatements(shard: number, readOnly: boolean): string[] {
    const { statementTimeoutMs, idleInTransactionTimeoutMs } = this.options;
    return [
      `BEGIN${readOnly ? ' READ ONLY' : ''}`,
      `SET LOCAL search_path TO ${quoteIdent(shardSchemaName(this.config, shard))}`,
      ...(statementTimeoutMs ? [`SET LOCAL statement_timeout = ${statementTimeoutMs}`] : []),
      ...(idleInTransactionTimeoutMs
        ? [`SET LOCAL idle_in_transaction_session_timeout = ${idleInTransactionTimeoutMs}`]
        : []),
    ];
  }

  /**
   * A replica read on `host`'s standby (replicas.ts): `attempt` runs there first; the primary
   * (`attempt` without a Via) takes the call when the host has no standby that answers, when the
   * standby refuses (not a standby, no WAL receiver, too far behind, the shard not active there;
   * behind a write asked for only after `waitMs`), or when the read met a connection loss or a
   * recovery conflict there (read-only, so running it again is safe). fn's own errors on the standby
   * (a moved shard's SC100 among them) go to the caller's loop as on the primary.
   */
  private async onReplica<T>(
    host: HostConfig,
    shard: number,
    replica: ReplicaRead,
    trace: CallTrace | undefined,
    attempt: (via?: Via) => Promise<Attempt<T>>,
  ): Promise<Attempt<T>> {
    const onPrimary = (reason: ReplicaFallback): Promise<Attempt<T>> => {
      this.diagnostics.replicaFallback(host.name, reason);
      trace?.replica(reason);
      return attempt();
    };
    // An LSN of another host (the shard moved since the write) says nothing about this one's standbys.
    if (replica.afterLsn && replica.afterLsn.host !== host.name) return onPrimary('moved');
    const standby = await this.standbys.pick(host).catch(() => undefined);
    if (!standby) return onPrimary('no-standby');
    const via = this.standbyVia(host, standby, replica);
    const deadline = Date.now() + replica.waitMs;
    for (;;) {
      let result: Attempt<T>;
      try {
        result = await attempt(via);
      } catch {
        this.standbys.failed(host.name, standby);
        return onPrimary('unreachable');
      }
      if (result.ok) {
        this.diagnostics.replicaRead(host.name);
        trace?.replica('standby');
        return result;
      }
      const refusal = replicaRefusal(result.error);
      if (refusal === undefined) {
        if (isConnectionLoss(result.error)) {
          this.standbys.failed(host.name, standby);
          return onPrimary('unreachable');
        }
        if (isRecoveryConflict(result.error)) return onPrimary('conflict');
        return result;
      }
      if (refusal === 'not-standby' || refusal === 'no-receiver') this.standbys.failed(host.name, standby);
      if (refusal === 'behind' && replica.afterLsn && Date.now() < deadline) {
        const replayed = await this.standbys.replayed(standby, replica.afterLsn.lsn, deadline).catch(() => false);
        if (replayed) continue;
      }
      return onPrimary(refusal);
    }
  }

  /**
   * A chunk of one host's shards on a standby (queryEachShard, queryPage): undefined when the host has
   * no standby or the chunk did not run there whole; the shards then run one by one, each a replica
   * read of its own (onReplica), which names why one went to the primary.
   */
  private async chunkOnReplica<V>(
    host: HostConfig,
    shards: readonly number[],
    replica: ReplicaRead,
    attempt: (via: Via) => Promise<V[] | undefined>,
  ): Promise<V[] | undefined> {
    if (replica.afterLsn && replica.afterLsn.host !== host.name) return undefined;
    const standby = await this.standbys.pick(host).catch(() => undefined);
    if (!standby) return undefined;
    const values = await attempt(this.standbyVia(host, standby, replica)).catch(() => undefined);
    if (values) this.diagnostics.replicaRead(host.name, shards.length);
    return values;
  }

  private standbyVia(host: HostConfig, standby: Standby, replica: ReplicaRead): Via {
    return {
      checkout: () => this.checkoutFrom(host, standby.pool),
      start: (shard) =>
        new TransactionStart([
          ...this.startStatements(shard, true),
          replicaCheckSql(shard, {
            maxLagMs: replica.maxLagMs,
            ...(replica.afterLsn ? { afterLsn: replica.afterLsn.lsn } : {}),
          }),
        ]),
    };
  }

  /** Keeps the highest LSN seen after a write on `host` (trackWriteLsn). */
  private wrote(hostName: string, lsn: string | undefined): void {
    const value = lsn === undefined ? undefined : parseLsn(lsn);
    if (value === undefined) return;
    const known = this.writeLsns.get(hostName);
    if (known === undefined || value > known) this.writeLsns.set(hostName, value);
  }

  /** A pooled connection of `host` for `work`, released or destroyed after it (src/router/connection.ts). */
  private withConnection<T>(
    host: HostConfig,
    shard: number,
    trace: CallTrace | undefined,
    work: (lease: Lease) => Promise<T>,
    via?: Via,
  ): Promise<T> {
    return withConnection(via ? () => via.checkout() : () => this.connect(host, shard, trace), work);
  }

  /** A connection of a standby's pool; failing names the host. */
  private async checkoutFrom(host: HostConfig, pool: pg.Pool): Promise<pg.PoolClient> {
    try {
      return await pool.connect();
    } catch (error) {
      throw new HostError(host.name, `cannot connect to a standby: ${describePgError(error)}`, {
        code: 'HOST_UNREACHABLE',
        cause: error,
      });
    }
  }

  private async connect(host: HostConfig, shard: number, trace?: CallTrace): Promise<pg.PoolClient> {
    try {
      const since = trace?.waiting('a pooled connection', host.name);
      const client = await (await this.pool(host)).connect();
      if (since !== undefined) trace?.poolWaited(since);
      return client;
    } catch (error) {
      throw new HostError(host.name, `cannot connect: ${describePgError(error)}`, {
        shard,
        code: 'HOST_UNREACHABLE',
        cause: error,
      });
    }
  }
}

/** COMMIT on its own round trip; a connection lost before its answer leaves the outcome unknown. */
async function commitOrDoubt(
  client: pg.PoolClient,
  host: HostConfig,
  shard: number,
  readWriteLsn = false,
): Promise<{ command: string; writeLsn?: string }> {
  try {
    if (!readWriteLsn) return await client.query('COMMIT');
    // The WAL's end right after the COMMIT, in the same round trip (router.lastWriteLsn).
    const [commit, lsn] = (await client.query(`COMMIT;${WRITE_LSN_SQL}`)) as unknown as [
      pg.QueryResult,
      pg.QueryResult<{ lsn: string }>,
    ];
    return { command: commit.command, ...(lsn.rows[0] ? { writeLsn: lsn.rows[0].lsn } : {}) };
  } catch (error) {
    if (isConnectionLoss(error)) throw new CommitUnknownError(host.name, shard, error);
    throw error;
  }
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
