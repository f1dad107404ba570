import pg from 'pg';
import type { HostConfig } from '../config/types.js';
import { HostError, ShardctlError } from '../errors.js';
import { describePgError, untilAborted } from '../fleet/connect.js';
import { hostClientSettings, silenceAfterMs, watchSilence } from '../fleet/silence.js';
import { endQuietly } from '../pg/quiet.js';
import { registerUrlSecret } from '../pg/redact.js';
import { inspectConnection, type SessionTimeouts } from '../pg/pooler.js';
import { libpqCompatible } from '../pg/tls.js';
import {
  SESSION_STATE_SQL,
  addressLabel,
  mismatchReason,
  parsePostgresUrl,
  sessionMatches,
  type TargetSessionAttrs,
} from '../pg/multihost.js';
import type { CallTrace } from './diagnostics.js';
import { FAILOVER_RETRY_MS, HostAddressBook, isHostDown, isTwoPrimaries } from './failover.js';
import type { RouterSettings } from './options.js';

/** Fails (the pool drops the connection) unless `client`'s session fits `attrs`. */
async function holdTo(client: pg.ClientBase, attrs: TargetSessionAttrs, address: string): Promise<void> {
  const { rows } = await client.query<{ in_recovery: boolean; read_only: boolean }>(SESSION_STATE_SQL);
  const state = { inRecovery: rows[0]?.in_recovery === true, readOnly: rows[0]?.read_only === true };
  if (sessionMatches(attrs, state, 'last')) return;
  let label = 'the address';
  try {
    label = parsePostgresUrl(address).addresses.map(addressLabel).join(',');
  } catch {
    // the address as a whole is not shown (it holds credentials)
  }
  throw new Error(`${label} ${mismatchReason(attrs, state)} (no longer the host's primary)`);
}

/**
 * The router's connections to the hosts' primaries: one pg.Pool per host, made on first use for the
 * address of the host that is its primary now (failover.ts's HostAddressBook), ended when the host
 * leaves the map, changes URL or fails over; and the search for a host's new primary after a
 * failover symptom, shared by the calls that meet it.
 */
export class HostPools {
  /**
   * Per host: its pool, the host URL it was made for, the one address it connects to, and whether
   * its connections ask for the router's timeouts as startup parameters.
   */
  private readonly pools = new Map<string, { url: string; address: string; pool: pg.Pool; startup: boolean }>();
  /** Hosts whose address refused the timeouts as startup parameters (a pooler the config did not declare). */
  private readonly refusesStartupTimeouts = new Set<string>();
  /**
   * Hosts where a named statement of fn met another client's or missed its own: a pooler the config
   * does not declare, which passes the server's key on (one that does not is found per connection:
   * src/pg/pooler.ts, behindPooler).
   */
  private readonly sharesStatements = new Set<string>();
  /** Which address of each host is its primary now; found again after a failover (failover.ts). */
  private readonly addresses: HostAddressBook;
  /** Per host, the search for its new primary that calls meeting a failover wait on. */
  private readonly recovering = new Map<string, Promise<boolean>>();
  /** Per host, the TWO_PRIMARIES error its last search for a primary ended on (failover.ts). */
  private readonly twoPrimaries = new Map<string, unknown>();
  private readonly ending = new Set<Promise<void>>();
  private closed = false;
  /**
   * Aborted by close(): the router's own work (a reading of the map, a check on a host: ownQuery)
   * is given up at once, its connections dropped, rather than waited for.
   */
  private readonly closing = new AbortController();

  constructor(
    private readonly settings: RouterSettings,
    /** The router's map now, and its reload (the registry may name another address for a host). */
    private readonly fleet: { hosts(): readonly HostConfig[]; reload(): Promise<void> },
  ) {
    this.addresses = new HostAddressBook({
      applicationName: settings.applicationName,
      connectTimeoutMs: settings.connectTimeoutMs,
    });
  }

  /** The address of `host` the pool goes to now, if one is known. */
  knownAddress(host: HostConfig): string | undefined {
    return this.addresses.known(host)?.url;
  }

  /** After a discovery: the registry's addresses, and the pools of hosts gone from `hosts` or whose URL changed ended. */
  learn(registryUrls: ReadonlyMap<string, string>, hosts: readonly HostConfig[]): void {
    this.addresses.learn(registryUrls);
    for (const [name, entry] of this.pools) {
      const host = hosts.find((h) => h.name === name);
      if (!host || host.url !== entry.url) {
        this.end(name);
        this.addresses.forget(name);
      }
    }
  }

  /** The host's pool when it is there and goes to the address known now (no await on a call's hot path). */
  private current(host: HostConfig): pg.Pool | undefined {
    if (this.closed) return undefined;
    const existing = this.pools.get(host.name);
    return existing && existing.url === host.url && this.addresses.known(host)?.url === existing.address
      ? existing.pool
      : undefined;
  }

  /** The host's pool, made (or made again for a new primary address) when needed. */
  async pool(host: HostConfig): Promise<pg.Pool> {
    if (this.closed) throw new Error('the ShardRouter is closed');
    const existing = this.current(host);
    if (existing) return existing;
    const resolved = await this.addresses.resolve(host);
    const address = resolved.url;
    if (this.closed) throw new Error('the ShardRouter is closed');
    const current = this.pools.get(host.name);
    if (current && current.url === host.url && current.address === address) return current.pool;
    if (current) this.end(host.name);
    registerUrlSecret(host.url);
    registerUrlSecret(address);
    const startup = this.startupTimeouts(host);
    const pool = new pg.Pool({
      connectionString: libpqCompatible(address),
      max: this.settings.poolSize,
      application_name: this.settings.applicationName,
      ...hostClientSettings(host),
      // Connecting takes at most the host's hostTimeout, as the CLI's connections (and the standbys'
      // pools) do; the same bound holds for a wait for a free connection (pg-pool has one setting).
      connectionTimeoutMillis: Math.min(this.settings.connectTimeoutMs, host.timeoutMs),
      idleTimeoutMillis: this.settings.idleTimeoutMs,
      // pg.Pool counts both in its own units: whole seconds, and 0 / Infinity for none.
      maxLifetimeSeconds: Math.ceil(this.settings.maxConnectionLifetimeMs / 1000),
      maxUses: this.settings.maxConnectionUses || Infinity,
      ...startup,
      // pg-pool (3.13 and later; pg 8.23 needs 3.14) waits for onConnect's promise before it hands
      // the connection out; its types say void. An older pg-pool does not call it: no connection is
      // marked, every transaction sets the timeouts itself, and a pooler the config does not declare
      // is learned from a named statement's failure (transaction.ts).
      ...(host.url === host.directUrl || resolved.attrs !== 'any'
        ? {
            // eslint-disable-next-line @typescript-eslint/no-misused-promises
            onConnect: async (client: pg.ClientBase) => {
              // The address was found as the host's primary (read-write, unless its URL asks
              // otherwise); a connection opened there later is held to the same: after a
              // switchover the old primary comes back as a standby at the same address, and a
              // read-only call would otherwise read it, however far behind (and a replica read's
              // fallback "to the primary" too). Refused, the call looks for the primary again.
              if (resolved.attrs !== 'any') await holdTo(client, resolved.attrs, address);
              if (host.url === host.directUrl) await inspectConnection(client, startup);
            },
          }
        : {}),
    });
    // An idle pooled connection whose server goes away emits 'error'; unhandled it would crash the
    // application. The pool drops that connection and the next checkout opens a new one.
    pool.on('error', () => undefined);
    // A host that stops answering fails the call waiting on it, naming the host, within its timeout
    // (the address this pool goes to is the one probed); with statementTimeoutMs set, the silence
    // is noticed once that timeout and a second have passed without a reply (silenceAfterMs).
    const watched = address === host.url ? host : { ...host, url: address };
    const silenceMs = silenceAfterMs(host, this.settings.statementTimeoutMs);
    pool.on('connect', (client) => watchSilence(client, watched, silenceMs));
    this.pools.set(host.name, { url: host.url, address, pool, startup: startup !== undefined });
    return pool;
  }

  /**
   * The router's timeouts as startup parameters, for a host whose url is the server itself (no
   * directUrl beside it): then each connection's session carries them, checked when it connects
   * (inspectConnection), and its transactions need no SET LOCAL for them: two statements fewer
   * per call. A connection the check does not confirm (a pooler in front that drops the parameters:
   * ignore_startup_parameters) sets them per transaction, as does every connection of a host whose
   * url goes through a pooler (directUrl set) or whose address refused them (refusedStartup).
   */
  private startupTimeouts(host: HostConfig): SessionTimeouts | undefined {
    if (host.url !== host.directUrl || this.refusesStartupTimeouts.has(host.name)) return undefined;
    const { statementTimeoutMs, idleInTransactionTimeoutMs } = this.settings;
    if (!statementTimeoutMs && !idleInTransactionTimeoutMs) return undefined;
    return {
      ...(statementTimeoutMs ? { statement_timeout: statementTimeoutMs } : {}),
      ...(idleInTransactionTimeoutMs ? { idle_in_transaction_session_timeout: idleInTransactionTimeoutMs } : {}),
    };
  }

  /**
   * A pooler the config does not declare (PgBouncer refuses a startup statement_timeout): the
   * host's pools go without the startup parameters from now on, and the call connects again.
   */
  private refusedStartup(host: HostConfig, error: unknown): boolean {
    if (!/unsupported startup parameter/i.test(error instanceof Error ? error.message : '')) return false;
    // Calls that met the refusal together: the first makes the pool again, the others use that one.
    if (this.refusesStartupTimeouts.has(host.name)) return true;
    if (!this.pools.get(host.name)?.startup) return false;
    this.refusesStartupTimeouts.add(host.name);
    this.end(host.name);
    return true;
  }

  /**
   * Whether a connection of `host` may be handed another server connection from one transaction to
   * the next (a transaction pooler: PgBouncer before 1.21 keeps no prepared statement per client):
   * its url goes through a pooler (directUrl set), it refused the router's startup parameters as
   * PgBouncer does, or a named statement of fn met another client's or missed its own there. Such a
   * host's calls send fn's named statements unnamed (transaction.ts), as do those on a connection
   * found behind a pooler when it was made (src/pg/pooler.ts, behindPooler).
   */
  statementsShared(host: HostConfig): boolean {
    return (
      host.url !== host.directUrl || this.refusesStartupTimeouts.has(host.name) || this.sharesStatements.has(host.name)
    );
  }

  /** A pooler is in front of `host`, though its config does not say so (see statementsShared). */
  learnStatementsShared(host: HostConfig): void {
    this.sharesStatements.add(host.name);
  }

  /**
   * A pooled connection of `host`; failing names the host and the shard. When the host's pool is
   * there and the call is not traced (the usual case), one promise settled from pg-pool's callback
   * (its promise form makes two, and a handler for the failure a third): no async layer on a routed
   * call's hot path.
   */
  connect(host: HostConfig, shard: number, trace?: CallTrace): Promise<pg.PoolClient> {
    const pool = trace === undefined ? this.current(host) : undefined;
    if (!pool) return this.connectTraced(host, shard, trace);
    return new Promise((resolve, reject) => {
      pool.connect((error: Error | undefined, client: pg.PoolClient | undefined) => {
        if (!error && client) return resolve(client);
        try {
          resolve(this.connectFailed(host, shard, trace, false, error ?? new Error('pg-pool gave no connection')));
        } catch (thrown) {
          reject(thrown as Error);
        }
      });
    });
  }

  private async connectTraced(
    host: HostConfig,
    shard: number,
    trace: CallTrace | undefined,
    again = false,
  ): Promise<pg.PoolClient> {
    try {
      const since = trace?.waiting('a pooled connection', host.name);
      const client = await (this.current(host) ?? (await this.pool(host))).connect();
      if (since !== undefined) trace?.poolWaited(since);
      return client;
    } catch (error) {
      return this.connectFailed(host, shard, trace, again, error);
    }
  }

  /** Why a connection of `host` could not be had, as the call's error (or one more try, once). */
  private connectFailed(
    host: HostConfig,
    shard: number,
    trace: CallTrace | undefined,
    again: boolean,
    error: unknown,
  ): Promise<pg.PoolClient> {
    // The application's mistake, not the host's: said as such (and not taken for a failover).
    if (error instanceof RouterClosed)
      throw closedError(host, shard, 'was closed while the call waited for a pooled connection: it did not run');
    if (this.closed) throw closedError(host, shard, 'was closed before the call had a connection: it did not run');
    // Once per call: a refusal of something else than the timeouts is not retried for ever.
    if (!again && this.refusedStartup(host, error)) return this.connectTraced(host, shard, trace, true);
    // The search for the host's address failed (failover.ts): already a HostError of this host, which
    // says "cannot connect" and why; the shard is added, not the host's name a second time.
    if (error instanceof HostError && error.host === host.name && error.shard === undefined)
      throw error.forShard(shard);
    throw new HostError(host.name, `cannot connect: ${describePgError(error)}`, {
      shard,
      code: 'HOST_UNREACHABLE',
      cause: error,
    });
  }

  /**
   * After a failover symptom on `host` (failover.ts): forgets the address the failed call used
   * (unless another call already found a new one), and looks for the host's primary until one
   * answers or `deadline`; re-reads the registry meanwhile. Resolves true when a primary was found
   * (the call may run again), false otherwise. Calls meeting the same failure share one search.
   */
  recover(host: HostConfig, usedAddress: string | undefined, deadline: number, error: unknown): Promise<boolean> {
    if (this.closed) return Promise.resolve(false);
    // A host of one address, with no other in the registry, that could not be reached or stopped
    // answering (the silence watchdog has already asked it over a new connection): nowhere to go.
    if (isHostDown(error) && !this.hasAlternatives(host)) return Promise.resolve(false);
    if (usedAddress !== undefined && this.addresses.known(host)?.url === usedAddress) {
      this.addresses.forget(host.name);
      this.end(host.name);
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
      const host = this.fleet.hosts().find((h) => h.name === name);
      if (!host || this.closed) return false;
      try {
        await this.addresses.resolve(host, true);
        this.twoPrimaries.delete(name);
        return true;
      } catch (error) {
        // No address answers as a primary yet, or two do.
        if (isTwoPrimaries(error)) this.twoPrimaries.set(name, error);
        else this.twoPrimaries.delete(name);
      }
      // The registry may name another address for the host (map pull), or the file another URL.
      reloaded ??= this.fleet.reload().catch(() => undefined);
      if (round === 0) await reloaded;
      const now = this.fleet.hosts().find((h) => h.name === name);
      // A host with nowhere else to look is tried again once (after the reload), not waited for.
      if (!now || (round > 0 && !this.hasAlternatives(now)) || Date.now() >= deadline) return false;
      if (round > 0) await new Promise((resolve) => setTimeout(resolve, FAILOVER_RETRY_MS));
      if (round % 20 === 19) reloaded = undefined;
    }
  }

  /** Why the last search for `host`'s primary found none: two of them (TWO_PRIMARIES), if so. */
  searchFailure(hostName: string): unknown {
    return this.twoPrimaries.get(hostName);
  }

  /** Whether `host` has an address to look at besides its own URL's one (several in it, or the registry's). */
  hasAlternatives(host: HostConfig): boolean {
    return !HostAddressBook.isPlain(host) || this.addresses.hasRegistryAlternative(host);
  }

  /** Ends the host's pool (after its checked-out connections come back). */
  end(name: string): void {
    const entry = this.pools.get(name);
    if (!entry) return;
    this.pools.delete(name);
    const ending = endQuietly(entry.pool);
    this.ending.add(ending);
    void ending.finally(() => this.ending.delete(ending));
  }

  /** Aborted when the router closes (see `closing`). */
  get closingSignal(): AbortSignal {
    return this.closing.signal;
  }

  /**
   * A statement of the router's own (not fn's: a check of the map, of a shard's holder) on a
   * connection of `host`'s pool, dropped at once when the router closes: close() does not wait for
   * it on a host that stopped answering, and the connection does not go back to the pool.
   */
  async ownQuery<R extends pg.QueryResultRow>(
    pool: pg.Pool,
    text: string,
    values?: readonly unknown[],
  ): Promise<pg.QueryResult<R>> {
    const client = await pool.connect();
    let failed: Error | undefined;
    try {
      return await untilAborted(client as unknown as pg.Client, this.closing.signal, () =>
        client.query<R>(text, values as unknown[] | undefined),
      );
    } catch (error) {
      failed = error as Error;
      throw error;
    } finally {
      // A failed connection is dropped by the pool (pg-pool ends it) rather than handed out again.
      client.release(failed);
    }
  }

  /** Ends every pool and waits for them; no pool is made after; calls waiting for a connection fail. */
  async close(): Promise<void> {
    this.closed = true;
    this.closing.abort();
    // pg-pool's end() leaves the calls waiting for a connection waiting for ever: each is answered
    // now (ROUTER_CLOSED, from connectFailed). Its waiters' queue is read here only, at close, so
    // the hot path pays nothing; a pg-pool without it leaves them as before.
    // A connection still being made (to a host that does not answer, it would take the connect
    // timeout) is dropped too: the call waiting for it did not run, and fails as above.
    for (const { pool } of this.pools.values()) {
      const { _pendingQueue: queue, _clients: clients } = pool as unknown as {
        _pendingQueue?: unknown;
        _clients?: unknown;
      };
      if (Array.isArray(queue))
        for (const item of queue.splice(0) as { callback?: unknown }[])
          if (typeof item.callback === 'function') (item.callback as (error: Error) => void)(new RouterClosed());
      if (Array.isArray(clients))
        for (const client of clients as { _connecting?: unknown; connection?: { stream?: { destroy?: unknown } } }[])
          if (client._connecting === true && typeof client.connection?.stream?.destroy === 'function')
            (client.connection.stream.destroy as () => void).call(client.connection.stream);
    }
    for (const name of [...this.pools.keys()]) this.end(name);
    await Promise.all([...this.ending]);
  }

  /** The open pools by host name. */
  byHost(): Map<string, pg.Pool> {
    return new Map([...this.pools].map(([name, entry]) => [name, entry.pool]));
  }
}

/** What close() answers a call waiting for a pooled connection with (connectFailed names its host and shard). */
class RouterClosed extends Error {}

/** The router's ROUTER_CLOSED error (the application's doing, not the host's: not a failover). */
export function closedError(host: HostConfig | undefined, shard: number | undefined, what: string): ShardctlError {
  return new ShardctlError(ROUTER_CLOSED, `the ShardRouter ${what}`, {
    exitCode: 2,
    data: { ...(host ? { host: host.name } : {}), ...(shard !== undefined ? { shard } : {}) },
  });
}

/** The code of the router's errors for what close() stopped or refused. */
export const ROUTER_CLOSED = 'ROUTER_CLOSED';

/** Whether `error` is ROUTER_CLOSED: the application closed the router, which says nothing of a host. */
export function isRouterClosed(error: unknown): boolean {
  return error instanceof ShardctlError && error.code === ROUTER_CLOSED;
}
