import type { Env } from '../config/env.js';
import { optionKeys, refuseUnknownOptions } from '../config/validate.js';
import { UsageError } from '../errors.js';

/** The default of ShardRouterOptions.mapRefreshMs: 30 s. */
export const DEFAULT_MAP_REFRESH_MS = 30_000;

/** The default of ShardRouterOptions.maxConnectionLifetimeMs: one hour. */
export const DEFAULT_MAX_CONNECTION_LIFETIME_MS = 3_600_000;

export interface ShardRouterOptions {
  /** Connections per host (the pg.Pool's max). Default 10. */
  poolSize?: number;
  /**
   * statement_timeout of every routed statement, in ms; 0 or unset: the server's setting. Never
   * outlives the router's own connections, and holds through a transaction pooler:
   * - a host whose url is the server itself (no `directUrl` beside it): a startup parameter of each
   *   of the router's connections to it, checked once when it connects, so the transactions need
   *   no statement for it; a connection whose session turns out not to have it (a pooler in front
   *   that drops it, `ignore_startup_parameters`) sets it per transaction, and an address that
   *   refuses it (PgBouncer: "unsupported startup parameter") is connected to again without it;
   * - a host whose url goes through a pooler (`directUrl` set): per transaction (`SET LOCAL`, in the
   *   same round trip as BEGIN), since a session setting would reach the pooler's other clients.
   * A session-level `SET statement_timeout` that fn runs itself stays on that connection.
   */
  statementTimeoutMs?: number;
  /**
   * idle_in_transaction_session_timeout of every routed transaction, in ms, as statementTimeoutMs;
   * unset: the server's setting. Per transaction it is left out of a call that is one round trip
   * (fn's only query, with its COMMIT in the same write), which never waits inside a transaction.
   */
  idleInTransactionTimeoutMs?: number;
  /**
   * Shown in pg_stat_activity. Default 'shardctl-router'. A startup parameter: PgBouncer passes it
   * on to the server connection a transaction runs on.
   */
  applicationName?: string;
  /**
   * How long to wait for a connection (connecting, or a free one in the pool). Default 10 s, and
   * never more than the host's `hostTimeout` (the config's bound on connecting).
   */
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
   * The placement is checked this often in the background, so that a router that makes no call to
   * a shard for a long time does not go on placing it where it was before moves: one short query
   * per host on the router's own pools (each host's placement version and registry), and, when one
   * changed or could not be asked (or a host has no pool yet, or the router's file names its hosts
   * differently), the whole map read again as reload() does. Default 30 s; 0: only when a call
   * meets a moved shard, and on reload().
   */
  mapRefreshMs?: number;
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
/** The router's options with their defaults resolved and checked once, when it is made. */
export type RouterSettings = Required<
  Omit<ShardRouterOptions, 'env' | 'cwd' | 'statementTimeoutMs' | 'idleInTransactionTimeoutMs' | 'trackWriteLsn'>
> &
  Pick<ShardRouterOptions, 'env' | 'cwd' | 'statementTimeoutMs' | 'idleInTransactionTimeoutMs' | 'trackWriteLsn'>;

/** Every key of ShardRouterOptions (the compiler checks the list is whole). */
const ROUTER_OPTION_KEYS = optionKeys<ShardRouterOptions>({
  poolSize: true,
  statementTimeoutMs: true,
  idleInTransactionTimeoutMs: true,
  applicationName: true,
  connectTimeoutMs: true,
  idleTimeoutMs: true,
  maxConnectionLifetimeMs: true,
  maxConnectionUses: true,
  fencedTimeoutMs: true,
  slowCallMs: true,
  failoverTimeoutMs: true,
  mapRefreshMs: true,
  trackWriteLsn: true,
  env: true,
  cwd: true,
});

/** The options' defaults, each checked (a UsageError naming the option and its value). */
export function routerSettings(options: ShardRouterOptions): RouterSettings {
  requireRouterOptions(options);
  const poolSize = options.poolSize ?? 10;
  if (!Number.isSafeInteger(poolSize) || poolSize < 1) refuse('poolSize', poolSize, 'must be a positive integer');
  for (const name of ['statementTimeoutMs', 'idleInTransactionTimeoutMs'] as const) {
    const value = options[name];
    if (value !== undefined && !isMilliseconds(value))
      refuse(name, value, "must be a whole number of milliseconds (0: the server's setting)");
  }
  const maxConnectionLifetimeMs = options.maxConnectionLifetimeMs ?? DEFAULT_MAX_CONNECTION_LIFETIME_MS;
  if (!Number.isSafeInteger(maxConnectionLifetimeMs) || maxConnectionLifetimeMs < 0)
    refuse('maxConnectionLifetimeMs', maxConnectionLifetimeMs, 'must be a whole number of milliseconds (0: no limit)');
  const maxConnectionUses = options.maxConnectionUses ?? 0;
  if (!Number.isSafeInteger(maxConnectionUses) || maxConnectionUses < 0)
    refuse('maxConnectionUses', maxConnectionUses, 'must be a whole number (0: no limit)');
  const settings: RouterSettings = {
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
    mapRefreshMs: options.mapRefreshMs ?? DEFAULT_MAP_REFRESH_MS,
  };
  if (!isMilliseconds(settings.mapRefreshMs))
    refuse(
      'mapRefreshMs',
      settings.mapRefreshMs,
      'must be a whole number of milliseconds (0: no refresh in the background)',
    );
  if (!Number.isSafeInteger(settings.slowCallMs) || settings.slowCallMs < 0)
    refuse('slowCallMs', settings.slowCallMs, 'must be a whole number of milliseconds (0: no warning)');
  for (const name of ['connectTimeoutMs', 'idleTimeoutMs', 'fencedTimeoutMs', 'failoverTimeoutMs'] as const) {
    if (!isMilliseconds(settings[name])) refuse(name, settings[name], 'must be a whole number of milliseconds');
  }
  if (typeof settings.applicationName !== 'string')
    refuse('applicationName', settings.applicationName, 'must be a string');
  if (options.trackWriteLsn !== undefined && typeof options.trackWriteLsn !== 'boolean')
    refuse('trackWriteLsn', options.trackWriteLsn, 'must be true or false');
  return settings;
}

/** The router's options are an object of known keys (from JavaScript, null or a misspelt key could be passed). */
export function requireRouterOptions(options: unknown): asserts options is ShardRouterOptions {
  refuseUnknownOptions('router options', options, ROUTER_OPTION_KEYS);
}

/**
 * A call's options (`what`: which call's, for the message): known keys only, and the values the
 * calls share of the right types (a UsageError naming the first that is not): from JavaScript
 * `readOnly: 'false'` would read as true, and `perHost: '2'` as a number.
 */
export function checkCallOptions(what: string, options: unknown, known: readonly string[]): void {
  refuseUnknownOptions(what, options, known);
  const values = options as Record<string, unknown>;
  if (values['readOnly'] !== undefined && typeof values['readOnly'] !== 'boolean')
    refuse('readOnly', values['readOnly'], 'must be true or false');
  for (const name of ['perHost', 'concurrency', 'shardsPerQuery']) {
    const value = values[name];
    if (value !== undefined && (!Number.isSafeInteger(value) || (value as number) < 1))
      refuse(name, value, 'must be a positive integer');
  }
  if (values['shards'] !== undefined && !Array.isArray(values['shards']))
    refuse('shards', values['shards'], 'must be an array of shard numbers');
}

/** A whole number of milliseconds PostgreSQL and Node's timers both take (0 to 2^31 - 1). */
function isMilliseconds(value: unknown): boolean {
  return Number.isSafeInteger(value) && (value as number) >= 0 && (value as number) <= 2_147_483_647;
}

function refuse(name: string, value: unknown, reason: string): never {
  throw new UsageError(reason, { input: name, value });
}
