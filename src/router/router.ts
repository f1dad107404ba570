import type pg from 'pg';
import { loadConfig } from '../config/load.js';
import { optionKeys, refuseUnknownOptions } from '../config/validate.js';
import { hostForShard, type HostConfig, type ShardctlConfig } from '../config/types.js';
import { HostError, UsageError } from '../errors.js';
import { decodeId, parseIdString } from '../id/layout.js';
import { shardForKey } from '../id/routing.js';
import { emptyFleetConfig, type UnreachableHost } from '../fleet/placement.js';
import { registerUrlSecret } from '../pg/redact.js';
import type { ShardResult } from './errors.js';
import { withConnection } from './connection.js';
import {
  formatLsn,
  parseLsn,
  REPLICA_READ_FLAGS,
  replicaRead,
  StandbyBook,
  type ReplicaRead,
  type WriteLsn,
} from './replicas.js';
import { queryEachShardWithParams } from './shard-query.js';
import { queryEachShardScript } from './script.js';
import { fanOut } from './fan-out.js';
import { followsFile, mapUnchanged, readRouterMap, type RouterMap } from './discover.js';
import { runFollowing, type FollowPaths } from './follow.js';
import { closedError, HostPools } from './pools.js';
import { StandbyReads } from './standby-reads.js';
import { attempt, TransactionStarts } from './transaction.js';
import {
  checkCallOptions,
  requireRouterOptions,
  routerSettings,
  type RouterSettings,
  type ShardRouterOptions,
} from './options.js';
import type { Attempt, ForEachShardOptions, RouterInternals, ShardFn, TransactionOptions, Via } from './types.js';
import { queryPage, type Page, type PageOptions } from './pages.js';
import { RouterDiagnostics, type CallTrace, type HostStats } from './diagnostics.js';

export type { Attempt, Chunking, ForEachShardOptions, ShardFn, TransactionOptions, Via } from './types.js';
export { DEFAULT_MAX_CONNECTION_LIFETIME_MS, type ShardRouterOptions } from './options.js';

/**
 * A failed connect of the fleet's reading that took at least this long (or half the connect timeout,
 * if less) waited for an answer that did not come: trying the host again right after would wait as
 * long (foundDown).
 */
const SLOW_CONNECT_FAILURE_MS = 1000;

/** Where a router takes its map from. */
export type RouterSource =
  /** A config file (path; default $SHARDCTL_CONFIG, else ./shardctl.yaml), corrected by the fleet. */
  | string
  | undefined
  /** Seed URLs only: the layout, hosts and placement come from the fleet. */
  | SeedsSource;

/** A router source of seed URLs alone. */
export interface SeedsSource {
  readonly seeds: readonly string[];
}
const SEEDS_SOURCE_KEYS = optionKeys<SeedsSource>({ seeds: true });

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
 *
 * This class holds the map and the state of the call paths and wires the modules that are those
 * paths: follow.ts (a call following moves and failovers), transaction.ts (one attempt), fan-out.ts
 * and script.ts (many shards), standby-reads.ts (replica reads), pools.ts (connections).
 */
export class ShardRouter {
  private config: ShardctlConfig;
  /** The file's map (file and config routers): the fallback for shards no reachable host places. */
  private readonly fileConfig: ShardctlConfig | null;
  /**
   * Whether later readings of the map read fileConfig's file again (discover.ts, followsFile):
   * decided once the file could be read, when the router opens (fromConfig: just after); until then
   * the file is not read again.
   */
  private fileFollowed: boolean | undefined;
  private readonly seeds: readonly string[];
  /** Hosts that could not be read at the last discovery: name → why, and when it ended. */
  private unreachable = new Map<string, UnreachableHost & { readonly at: number }>();
  /** Shards whose new host answered that it holds them, ahead of the next discovery. */
  private readonly followed = new Map<number, string>();
  /** Per host, one pg.Pool on its primary, and the search for a new primary after a failover (pools.ts). */
  private readonly pools: HostPools;
  /** Hosts whose writable registry was warned about (once each). */
  private readonly distrustWarned = new Set<string>();
  private reloading: Promise<void> | undefined;
  /** What the last full read of the map saw, for the background refresh to compare (discover.ts). */
  private stamps: RouterMap['stamps'] = null;
  private refreshing = false;
  private closed = false;
  /** Reads the placement again every mapRefreshMs (unref'd: it never keeps the process alive). */
  private readonly refresh: NodeJS.Timeout | undefined;
  /** The statements that start each shard's transaction on the map in use (transaction.ts); new with each reload(). */
  private starts: TransactionStarts;
  /** Per host, its standbys for replica reads (replicas.ts), and the reads run there (standby-reads.ts). */
  private readonly standbys: StandbyBook;
  private readonly standbyReads: StandbyReads;
  /** Per host name, where the WAL ended after this router's last committed write there (trackWriteLsn). */
  private readonly writeLsns = new Map<string, bigint>();
  private readonly diagnostics: RouterDiagnostics;
  private readonly options: RouterSettings;
  /** The call paths lent to the modules that build on them (not public API). */
  private readonly paths: RouterInternals;
  /** What a call's follow loop asks of the router (follow.ts). */
  private readonly following: FollowPaths;

  private constructor(
    config: ShardctlConfig,
    options: ShardRouterOptions,
    source: { file: boolean; seeds?: readonly string[] },
  ) {
    this.config = config;
    this.fileConfig = source.file ? config : null;
    this.seeds = source.seeds ?? [];
    this.options = routerSettings(options);
    this.diagnostics = new RouterDiagnostics(this.options.slowCallMs);
    this.standbys = new StandbyBook({
      applicationName: this.options.applicationName,
      connectTimeoutMs: this.options.connectTimeoutMs,
      poolSize: this.options.poolSize,
      idleTimeoutMs: this.options.idleTimeoutMs,
      statementTimeoutMs: this.options.statementTimeoutMs,
    });
    this.pools = new HostPools(this.options, { hosts: () => this.config.hosts, reload: () => this.reload() });
    this.starts = new TransactionStarts(config, this.options);
    this.standbyReads = new StandbyReads(this.standbys, this.diagnostics, (shard, read) =>
      this.starts.replicaStart(shard, read),
    );
    this.paths = this.lend();
    this.following = {
      settings: this.options,
      diagnostics: this.diagnostics,
      pools: this.pools,
      checkShard: (shard) => this.checkCall(shard),
      hostForShard: (shard) => this.hostForShard(shard),
      hosts: () => this.config.hosts,
      reload: () => this.reload(),
      followed: (shard, host) => this.followed.set(shard, host),
    };
    // A router idle for a shard through a move away from a host and back would otherwise still send
    // its calls to that host, into the incoming copy of the move back (README, Guarantees). A failed
    // refresh changes nothing: the next one, or a call that meets the move, reads the fleet again.
    if (this.options.mapRefreshMs > 0) {
      this.refresh = setInterval(() => {
        if (!this.closed) void this.refreshMap().catch(() => undefined);
      }, this.options.mapRefreshMs);
      this.refresh.unref();
    }
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
    requireRouterOptions(options);
    if (typeof source === 'object' && source !== null) {
      refuseUnknownOptions('router source', source, SEEDS_SOURCE_KEYS);
      // From JavaScript a single URL string would be spread into its characters, each a "seed".
      if (!Array.isArray(source.seeds) || !source.seeds.every((seed) => typeof seed === 'string'))
        throw new UsageError('must be a list of URLs', { input: 'seeds' });
      const seeds = [...source.seeds];
      if (seeds.length === 0) throw new UsageError('give at least one URL', { input: 'seeds' });
      seeds.forEach(registerUrlSecret);
      const router = new ShardRouter(emptyFleetConfig(), options, { file: false, seeds });
      await router.discover();
      return router;
    }
    if (source !== undefined && typeof source !== 'string')
      throw new UsageError('must be a config file path or { seeds: [URL, …] }', { input: 'router source' });
    const config = await loadConfig(source, {
      checkMigrationsDir: false,
      ...(options.env ? { env: options.env } : {}),
      ...(options.cwd ? { cwd: options.cwd } : {}),
    });
    return ShardRouter.openLoaded(config, options, true);
  }

  /**
   * A router over an already loaded config, corrected by the fleet's placement (read now). It reads
   * `config.file` again when it reads the map later (a move followed, the background refresh) only
   * if, at open, that file has every setting of the config (shard lists aside); a config changed in
   * code (a password from a secret store) is used as given (the fleet's placement still corrects it).
   */
  static async openConfig(config: ShardctlConfig, options: ShardRouterOptions = {}): Promise<ShardRouter> {
    return ShardRouter.openLoaded(config, options, false);
  }

  private static async openLoaded(
    config: ShardctlConfig,
    options: ShardRouterOptions,
    loadedNow: boolean,
  ): Promise<ShardRouter> {
    const router = new ShardRouter(config, options, { file: true });
    if (loadedNow) router.fileFollowed = true;
    else await router.followingFile();
    // Just loaded: the file is read again only by later discoveries.
    await router.discover({ rereadFile: false });
    return router;
  }

  /**
   * A router over an already loaded map, without reading the fleet first: the file is trusted until
   * a call meets a moved shard, which makes the router read the fleet. Prefer open()/openConfig().
   */
  static fromConfig(config: ShardctlConfig, options: ShardRouterOptions = {}): ShardRouter {
    const router = new ShardRouter(config, options, { file: true });
    // Decided now, against the file as it reads now, not at the first reading of the map (a refresh
    // away, or never with mapRefreshMs 0), when an edit of the file could be taken for a change in code.
    void router.followingFile();
    return router;
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

  /**
   * A host the last reading of the fleet could not connect to at all, less than the connect timeout
   * ago, after a wait of its own (no answer: SLOW_CONNECT_FAILURE_MS), with no other address to look
   * at: the error a connection there would meet now (a fan-out fails its shards with it rather than
   * wait out the same timeout again); else undefined. A host that refused at once (a server
   * restarting) is tried again: that costs a moment, and it may be back.
   */
  private foundDown(hostName: string): HostError | undefined {
    const down = this.unreachable.get(hostName);
    const { connectTimeoutMs } = this.options;
    if (
      !down?.connectFailed ||
      (down.connectWaitedMs ?? 0) < Math.min(SLOW_CONNECT_FAILURE_MS, connectTimeoutMs / 2) ||
      performance.now() - down.at > connectTimeoutMs
    )
      return undefined;
    const host = this.config.hosts.find((h) => h.name === hostName);
    if (!host || this.pools.hasAlternatives(host)) return undefined;
    return new HostError(hostName, down.reason, { code: 'HOST_UNREACHABLE' });
  }

  /** Hosts that could not be read at the last discovery, with the reason. */
  unreachableHosts(): { name: string; reason: string }[] {
    return [...this.unreachable.values()].map(({ name, reason }) => ({ name, reason }));
  }

  shardForKey(key: bigint): number {
    if (typeof key !== 'bigint') throw new UsageError('must be a bigint', { input: 'key', value: key });
    return shardForKey(key, this.config.shards);
  }

  /** The shard an id was made in, decoded with the map's id layout. Accepts a decimal string. */
  shardForId(id: bigint | string): number {
    const value = typeof id === 'string' ? parseIdString(id) : id;
    if (typeof value !== 'bigint') throw new UsageError('is not a decimal 64-bit id', { input: 'id', value: id });
    const { shard } = decodeId(value, this.config.idLayout);
    if (shard >= this.config.shards) {
      throw new UsageError(`carries shard ${shard}, but the map has shards 0-${this.config.shards - 1}`, {
        input: 'id',
        value: value.toString(),
      });
    }
    return shard;
  }

  withShard<T>(shard: number, fn: ShardFn<T>, options: TransactionOptions = {}): Promise<T> {
    return this.routed(() => shard, fn, options);
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
    if (!replica) return (host, trace) => this.paths.attempt(host, shard, fn, options, trace);
    return (host, trace) =>
      this.standbyReads.onReplica(host, shard, replica, trace, (via) =>
        this.paths.attempt(host, shard, fn, options, trace, via),
      );
  }

  /** Instagram routing: the shard of `key mod shards` (e.g. a user id). */
  withKey<T>(key: bigint, fn: ShardFn<T>, options: TransactionOptions = {}): Promise<T> {
    return this.routed(() => this.shardForKey(key), fn, options);
  }

  /** The shard an id carries (e.g. a photo id made by that shard's next_id()). */
  withId<T>(id: bigint | string, fn: ShardFn<T>, options: TransactionOptions = {}): Promise<T> {
    return this.routed(() => this.shardForId(id), fn, options);
  }

  /**
   * One routed call on the shard `shardOf` names (withShard, withKey, withId). Not an async
   * function: a routed call is on the application's hot path, and each async layer costs a promise
   * and microtask turns. A key, id or option it refuses rejects the call rather than throws.
   */
  private routed<T>(shardOf: () => number, fn: ShardFn<T>, options: TransactionOptions): Promise<T> {
    let shard: number;
    let replica: ReplicaRead | undefined;
    try {
      checkCallOptions('call options', options, CALL_OPTION_KEYS);
      shard = shardOf();
      replica = replicaRead(options);
    } catch (error) {
      return Promise.reject(error as Error);
    }
    return runFollowing(
      this.following,
      shard,
      this.attemptOn(shard, fn, options, replica),
      options.readOnly ?? false,
      true,
    );
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
      checkCallOptions('forEachShard options', options, FAN_OUT_OPTION_KEYS);
      replica = replicaRead(options);
    } catch (error) {
      return Promise.reject(error as Error);
    }
    return fanOut(
      this.paths,
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
      checkCallOptions('queryEachShard options', options, QUERY_EACH_OPTION_KEYS);
      replica = replicaRead(options);
    } catch (error) {
      return Promise.reject(error as Error);
    }
    if (options.params !== undefined)
      return queryEachShardWithParams<R>(this.paths, sql, options.params, options, replica);
    return queryEachShardScript<R>(this.paths, sql, options, replica);
  }

  /**
   * A page of rows merged by id across shards (every shard, `shards`, or the shards of `keys`),
   * newest first or oldest first, with an opaque cursor for the next: see queryPage in
   * src/router/pages.ts. One parameterised SELECT; each shard asked only for rows past the cursor and
   * at most `limit`; shards of one host share round trips; moved shards are followed.
   */
  queryPage<R extends pg.QueryResultRow = pg.QueryResultRow>(sql: string, options: PageOptions): Promise<Page<R>> {
    return queryPage<R>(this.paths, sql, options);
  }

  /**
   * Reads the placement from the fleet again (and the file first, for a router opened from one).
   * Concurrent callers share one read. A host that left the map, or whose URL changed, has its pool
   * ended (after its checked-out connections come back).
   */
  reload(): Promise<void> {
    if (this.closed) return Promise.reject(closedError(undefined, undefined, 'is closed: reload() reads nothing'));
    this.reloading ??= (async () => {
      try {
        await this.discover();
      } finally {
        this.reloading = undefined;
      }
    })();
    return this.reloading;
  }

  /**
   * The background refresh: a short query per host on the router's own pools first, and the whole
   * map read again (new connections to every host) only when a host's placement or registry
   * changed since the last read, or could not be asked.
   */
  private async refreshMap(): Promise<void> {
    // One at a time: a check waiting on a host that stopped answering (up to its hostTimeout) is
    // not joined by another each interval.
    if (this.refreshing) return;
    this.refreshing = true;
    try {
      await this.checkMap();
    } finally {
      this.refreshing = false;
    }
  }

  private async checkMap(): Promise<void> {
    const stamps = this.stamps;
    if (stamps && !this.reloading) {
      // Every host's pool, made now for a host no call has gone to yet: one connection there, not
      // a whole read of the map (new connections to every host) at each refresh. A host whose pool
      // cannot be made is not asked: the map is read again, as before.
      const pools = await Promise.all(this.config.hosts.map((h) => this.pools.pool(h).catch(() => undefined)));
      const file = (await this.followingFile()) ? this.fileConfig : null;
      const unchanged = await mapUnchanged(stamps, pools, file, this.options, (pool, text) =>
        this.pools.ownQuery(pool, text),
      );
      if (unchanged && this.stamps === stamps) return;
    }
    if (!this.closed) await this.reload();
  }

  private async discover(options: { rereadFile?: boolean } = {}): Promise<void> {
    const read = await readRouterMap(
      { file: this.fileConfig, current: this.config, seeds: this.seeds },
      this.options,
      this.distrustWarned,
      options.rereadFile !== false && (await this.followingFile()),
      this.pools.closingSignal,
    );
    this.config = read.config;
    this.stamps = read.stamps;
    const at = performance.now();
    this.unreachable = new Map(read.unreachable.map((u) => [u.name, { ...u, at }]));
    this.followed.clear();
    this.starts = new TransactionStarts(read.config, this.options);
    this.pools.learn(read.registryUrls, read.config.hosts);
  }

  /**
   * The call paths that the router's modules build on (shard-query.ts, script.ts, pages.ts,
   * transaction.ts, fan-out.ts), for those modules only (not public API): one shard's call
   * following moves, one attempt, the replica paths, the fan-out, a connection.
   */
  private lend(): RouterInternals {
    const paths: RouterInternals = {
      config: () => this.config,
      settings: this.options,
      checkShard: (shard) => this.checkCall(shard),
      hostForShard: (shard) => this.hostForShard(shard),
      run: (shard, attemptOn, readOnly) => this.run(shard, attemptOn, readOnly),
      attempt: (host, shard, fn, options, trace, via) => attempt(paths, host, shard, fn, options, trace, via),
      onReplica: (host, shard, replica, trace, attemptThere) =>
        this.standbyReads.onReplica(host, shard, replica, trace, attemptThere),
      chunkOnReplica: (host, shards, replica, trace, attemptThere) =>
        this.standbyReads.chunkOnReplica(host, shards, replica, trace, attemptThere),
      fanOut: (runShard, options, chunks) => fanOut(paths, runShard, options, chunks),
      foundDown: (hostName) => this.foundDown(hostName),
      withConnection: (host, shard, work, via, trace) =>
        withConnection(
          via ? () => standbyCheckout(via, host, trace) : () => this.pools.connect(host, shard, trace),
          work,
        ),
      counted: (host, ok) => this.diagnostics.ended(host, ok),
      beginRoundTrip: (shards) => this.diagnostics.beginRoundTrip(shards),
      transactionStart: (shard, readOnly, sessionTimeouts) =>
        this.starts.transactionStart(shard, readOnly, sessionTimeouts),
      wrote: (host, lsn) => this.wrote(host, lsn),
      statementsShared: (host) => this.pools.statementsShared(host),
      learnStatementsShared: (host) => this.pools.learnStatementsShared(host),
    };
    return paths;
  }

  private async followingFile(): Promise<boolean> {
    if (this.fileConfig === null) return false;
    if (this.fileFollowed === undefined) {
      // A file that cannot be read now (replaced at this instant, a ${VAR} the router's env lacks) is
      // not read this time and decided at the next reading.
      const decided = await followsFile(this.fileConfig, this.options);
      if (decided === null) return false;
      this.fileFollowed ??= decided;
    }
    return this.fileFollowed;
  }

  /**
   * Ends every pool; waits for checked-out connections to be released (the calls running finish).
   * A reading of the map in the background is given up at once, and nothing connects after. The
   * router is unusable after.
   */
  async close(): Promise<void> {
    this.closed = true;
    clearInterval(this.refresh);
    await Promise.all([this.pools.close(), this.standbys.close()]);
  }

  /**
   * Per host of the map (and any with a pool or counted calls): the pool's connections, idle ones
   * and calls waiting for one, now; and since the router opened, the calls that ended there, the
   * failed ones, and the moves followed away from it. Events per call: src/router/diagnostics.ts.
   */
  stats(): HostStats[] {
    return this.diagnostics.stats(
      this.pools.byHost(),
      this.config.hosts.map((h) => h.name),
    );
  }

  /** Names of the hosts with an open pool (for tests and health checks). */
  openPools(): string[] {
    return [...this.pools.byHost().keys()];
  }

  /** A call's shard, checked (checkShard), on a router not closed. */
  private checkCall(shard: number): void {
    this.checkShard(shard);
    if (this.closed) throw closedError(undefined, shard, 'is closed: a call made after close() does not run');
  }

  private checkShard(shard: number): void {
    if (!Number.isSafeInteger(shard) || shard < 0 || shard >= this.config.shards) {
      throw new UsageError(
        typeof shard === 'number' ? `is not in the map (0-${this.config.shards - 1})` : 'must be a shard number',
        { input: 'shard', value: shard },
      );
    }
  }

  /** One call, following moves (follow.ts): fn's value and the host it committed on. */
  private run<T>(
    shard: number,
    attemptOn: (host: HostConfig, trace: CallTrace | undefined) => Promise<Attempt<T>>,
    readOnly = false,
  ): Promise<{ value: T; host: string }> {
    return runFollowing(this.following, shard, attemptOn, readOnly);
  }

  /** Keeps the highest LSN seen after a write on `host` (trackWriteLsn). */
  private wrote(hostName: string, lsn: string | undefined): void {
    const value = lsn === undefined ? undefined : parseLsn(lsn);
    if (value === undefined) return;
    const known = this.writeLsns.get(hostName);
    if (known === undefined || value > known) this.writeLsns.set(hostName, value);
  }
}

/** The keys of a routed call's options (TransactionOptions), of forEachShard's and of queryEachShard's. */
const CALL_OPTION_FLAGS = { readOnly: true, ...REPLICA_READ_FLAGS } as const;
const CALL_OPTION_KEYS = optionKeys<TransactionOptions>(CALL_OPTION_FLAGS);
const FAN_OUT_OPTION_KEYS = optionKeys<ForEachShardOptions>({
  ...CALL_OPTION_FLAGS,
  shards: true,
  concurrency: true,
  perHost: true,
  onShardDone: true,
});
const QUERY_EACH_OPTION_KEYS: readonly string[] = [...FAN_OUT_OPTION_KEYS, 'query', 'shardsPerQuery', 'params'];

/** A standby's connection for a replica read, its wait counted in the call's event as the primary's is (pools.ts). */
async function standbyCheckout(via: Via, host: HostConfig, trace: CallTrace | undefined): Promise<pg.PoolClient> {
  if (trace === undefined) return via.checkout();
  const since = trace.waiting('a pooled connection', host.name);
  const client = await via.checkout();
  trace.poolWaited(since);
  return client;
}
