/**
 * How a router follows a host's failover without the application doing anything.
 *
 * A host's URL may list several addresses (src/pg/multihost.ts). The router's pool for a host goes
 * to one address, the one found by trying them in order as libpq does (`resolve`). A call that
 * meets a symptom of a failover (`isFailoverSymptom`: the connection refused, reset or silent, the
 * server shutting down (57P01/57P02/57P03), a write refused as read-only (25006) by a primary that
 * was demoted) makes the router forget that address and look again (`HostAddressBook.recover`,
 * shared by every call waiting on the host): the host's addresses, then the address the fleet's
 * registry gives the host (after `shardctl map pull`, or for a router started from a config copy
 * made before the failover). The call then runs again on the new primary, unless it may have
 * committed: an error after COMMIT was sent fails the call with COMMIT_UNKNOWN (CommitUnknownError),
 * never retried, since running it again could apply it twice.
 */
import pg from 'pg';
import type { HostConfig } from '../config/types.js';
import { HostError, ShardctlError } from '../errors.js';
import { connectOnce, describePgError, parsedHostUrl, sessionState } from '../fleet/connect.js';
import { HOST_SILENT } from '../fleet/silence.js';
import { isLostConnection } from '../pg/ended.js';
import { endQuietly } from '../pg/quiet.js';
import { primariesBeside, TWO_PRIMARIES, twoPrimariesError } from '../fleet/primaries.js';
import { readFleetRow } from '../fleet/topology.js';
import {
  attrsFor,
  connectFirstMatching,
  parsePostgresUrl,
  type PostgresUrl,
  type TargetSessionAttrs,
  withCredentials,
} from '../pg/multihost.js';

/** The code of CommitUnknownError. */
export const COMMIT_UNKNOWN = 'COMMIT_UNKNOWN';

/**
 * A host two of whose addresses answer as its writable primary (split brain: an old primary started
 * again as a primary after a failover): the router runs none of the host's calls rather than pick
 * one, since rows written to the wrong one are lost to the other.
 */
export function isTwoPrimaries(error: unknown): error is HostError {
  return error instanceof HostError && error.code === TWO_PRIMARIES;
}

/**
 * The connection was lost after the call's COMMIT was sent and before its answer came: the
 * transaction may or may not have committed (on a failover, it may have committed on the old
 * primary and not reached the new one). Not retried; the application decides (e.g. reads back by
 * a key it wrote, or makes the write idempotent).
 */
export class CommitUnknownError extends HostError {
  /** `what`: what was sent that commits (a COMMIT; a statement the protocol's Sync commits on its own). */
  constructor(host: string, shard: number, cause: unknown, what = 'COMMIT') {
    super(
      host,
      `the connection was lost after ${what} was sent; whether it committed is not known (${describePgError(cause)})`,
      {
        shard,
        code: COMMIT_UNKNOWN,
        cause,
      },
    );
  }
}

/** Whether `error` says the connection or the server went away (the call did not reach a verdict). */
export function isConnectionLoss(error: unknown): boolean {
  if (error instanceof HostError) return error.code === HOST_SILENT || error.code === 'HOST_UNREACHABLE';
  return isLostConnection(error);
}

/** The host itself could not be reached, or stopped answering (not one connection lost). */
export function isHostDown(error: unknown): boolean {
  if (!(error instanceof HostError)) return false;
  // The watchdog found one connection lost on a host that answers (silence.ts): try a new one.
  if (error.code === HOST_SILENT) return error.data?.['connectionLost'] !== true;
  return error.code === 'HOST_UNREACHABLE';
}

/**
 * A symptom of the host's primary having moved: the connection lost, or (for a read-write call) a
 * write refused because the server is read-only now.
 */
export function isFailoverSymptom(error: unknown, readOnly: boolean): boolean {
  // Two primaries: mid-failover, until the old one is stopped or demoted (waited for like a new one).
  if (isConnectionLoss(error) || isTwoPrimaries(error)) return true;
  return !readOnly && (error as { code?: unknown } | null)?.code === '25006';
}

export interface ResolveOptions {
  readonly applicationName: string;
  readonly connectTimeoutMs: number;
}

/** Where a host's pool goes now: a URL of one address. */
export interface ResolvedAddress {
  readonly url: string;
  /** Came from the registry rather than the host's own URL. */
  readonly fromRegistry: boolean;
  /**
   * What the address was held to when it was found ('any': nothing, a plain host's URL). The pool's
   * new connections are held to it too (pools.ts): a primary restarted as a standby keeps its
   * address, and a connection opened there later must not take the host's calls.
   */
  readonly attrs: TargetSessionAttrs;
}

/**
 * The address each host's pool uses, found once and found again after a failover. A host whose URL
 * has one address and asks nothing of it is used as it is (no extra connection).
 */
export class HostAddressBook {
  private readonly current = new Map<string, { hostUrl: string; resolved: ResolvedAddress }>();
  private readonly finding = new Map<string, Promise<ResolvedAddress>>();
  /** Per host, its registry address with the router's credentials (trusted registries only). */
  private registry = new Map<string, string>();

  constructor(private readonly options: ResolveOptions) {}

  /** The registry's addresses, with credentials, as the last discovery read them. */
  learn(registry: ReadonlyMap<string, string>): void {
    this.registry = new Map(registry);
  }

  /** The address in use for `host`, if one was found for its current URL. */
  known(host: HostConfig): ResolvedAddress | undefined {
    const entry = this.current.get(host.name);
    return entry && entry.hostUrl === host.url ? entry.resolved : undefined;
  }

  /** Whether finding the address needs no connection (one address, nothing asked). */
  static isPlain(host: HostConfig): boolean {
    const parsed = parsedHostUrl(host);
    return parsed.addresses.length === 1 && attrsFor(parsed) === 'any';
  }

  /**
   * The address for `host`'s pool; concurrent callers share one search. `recovering` (after a
   * failover symptom): every address is connected to and checked, a host of one address too, and
   * one that asks nothing is held to read-write (a demoted primary must not be found again).
   */
  resolve(host: HostConfig, recovering = false): Promise<ResolvedAddress> {
    const known = this.known(host);
    if (known && !recovering) return Promise.resolve(known);
    if (!recovering && HostAddressBook.isPlain(host)) {
      const plain: ResolvedAddress = { url: host.url, fromRegistry: false, attrs: 'any' };
      this.current.set(host.name, { hostUrl: host.url, resolved: plain });
      return Promise.resolve(plain);
    }
    let finding = this.finding.get(host.name);
    if (!finding) {
      finding = this.find(host, recovering).finally(() => this.finding.delete(host.name));
      this.finding.set(host.name, finding);
    }
    return finding;
  }

  /** Whether the registry gives `host` an address its own URL does not list. */
  hasRegistryAlternative(host: HostConfig): boolean {
    const registered = this.registry.get(host.name);
    if (registered === undefined) return false;
    try {
      const own = new Set(parsedHostUrl(host).addresses.map((a) => `${a.host}:${a.port ?? ''}`));
      return parsePostgresUrl(registered).addresses.some((a) => !own.has(`${a.host}:${a.port ?? ''}`));
    } catch {
      return false;
    }
  }

  /** Forgets the address in use for `host` (it failed): the next resolve searches again. */
  forget(hostName: string): void {
    this.current.delete(hostName);
  }

  private async find(host: HostConfig, recovering: boolean): Promise<ResolvedAddress> {
    const own = parsedHostUrl(host);
    const failures: string[] = [];
    const candidates: { url: PostgresUrl; fromRegistry: boolean }[] = [{ url: own, fromRegistry: false }];
    const registered = this.registry.get(host.name);
    if (registered !== undefined) {
      try {
        // With the host's own user, password and TLS parameters (the file's, or the seed's).
        const parsed = parsePostgresUrl(withCredentials(registered, host.url), `registry address of ${host.name}`);
        const ownAddresses = new Set(own.addresses.map((a) => `${a.host}:${a.port ?? ''}`));
        if (parsed.addresses.some((a) => !ownAddresses.has(`${a.host}:${a.port ?? ''}`)))
          candidates.push({ url: parsed, fromRegistry: true });
      } catch {
        // A registry address that is not a URL is not a way to the host.
      }
    }
    for (const candidate of candidates) {
      // The registry's address is held to what the host's URL asks, read-write when it asks nothing.
      const asked = attrsFor(own);
      const attrs = asked === 'any' && (recovering || candidate.fromRegistry) ? 'read-write' : asked;
      try {
        const { client, url, index } = await connectFirstMatching(candidate.url, attrs, {
          open: (single) => connectOnce(host, single, this.options),
          // A host that accepts connections and then says nothing must not hold the search.
          stateOf: (client: pg.Client) => withDeadline(sessionState(client), host.timeoutMs, client),
          close: (client: pg.Client) => endQuietly(client),
          describe: describePgError,
        });
        let others: string[];
        try {
          others = await this.otherPrimaries(host, candidate.url, index, client);
        } finally {
          await endQuietly(client);
        }
        if (others.length > 0)
          throw twoPrimariesError(
            host,
            candidate.url,
            index,
            others,
            "none of the host's calls runs until one of them is stopped or made a standby (shardctl status names them)",
          );
        const resolved: ResolvedAddress = { url, fromRegistry: candidate.fromRegistry, attrs };
        this.current.set(host.name, { hostUrl: host.url, resolved });
        return resolved;
      } catch (error) {
        // Not a way round it: the registry's address would be one more guess between the two.
        if (isTwoPrimaries(error)) throw error;
        failures.push(`${candidate.fromRegistry ? 'registry address: ' : ''}${describePgError(error)}`);
      }
    }
    throw new HostError(host.name, `cannot connect: ${failures.join('; ')}`, { code: 'HOST_UNREACHABLE' });
  }

  /** primariesBeside (src/fleet/primaries.ts) of the primary found, once its fleet record is read. */
  private async otherPrimaries(
    host: HostConfig,
    url: PostgresUrl,
    index: number,
    client: pg.Client,
  ): Promise<string[]> {
    if (url.addresses.length < 2) return [];
    // None when the server records no fleet, or its record cannot be read (a role without SELECT on
    // it): nothing to compare with.
    const fleet = await withDeadline(readFleetRow(client), host.timeoutMs, client).catch(() => null);
    if (!fleet) return [];
    return primariesBeside(host, url, index, fleet, { applicationName: this.options.applicationName });
  }
}

/** `work` on `client`, whose socket is destroyed (failing it) when `ms` pass first. */
async function withDeadline<T>(work: Promise<T>, ms: number, client: pg.Client): Promise<T> {
  const timer = setTimeout(
    () => (client as unknown as { connection: { stream: { destroy(): void } } }).connection.stream.destroy(),
    ms,
  );
  try {
    return await work;
  } finally {
    clearTimeout(timer);
  }
}

/** Between two searches for a host's new primary while none answers as one. */
export const FAILOVER_RETRY_MS = 100;

/** Tells a failed call's error apart for the router's retry loop. */
export function isInDoubt(error: unknown): boolean {
  return error instanceof ShardctlError && error.code === COMMIT_UNKNOWN;
}
