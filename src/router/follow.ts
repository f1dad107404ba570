import type { HostConfig } from '../config/types.js';
import { shardMovedTo } from '../config/shard-map.js';
import { CONTROL, shardIsActive } from '../fleet/control.js';
import { HostError, ShardctlError } from '../errors.js';
import { describePgError } from '../fleet/connect.js';
import type { CallTrace, RouterDiagnostics } from './diagnostics.js';
import { isFailoverSymptom, isInDoubt } from './failover.js';
import type { RouterSettings } from './options.js';
import { isRouterClosed, type HostPools } from './pools.js';
import type { Attempt } from './types.js';
import { INSUFFICIENT_PRIVILEGE } from '../pg/sqlstate.js';

/**
 * One call of the router, following the shard: its attempts run on the host the map names; an
 * attempt that meets a moved shard (SC100, or the old copy gone) goes to the shard's new host once
 * that host holds it, or waits (a short backoff) while the move is between its fence and its
 * switch; one that meets a failover waits for the host's new primary (pools.ts). fn may therefore
 * run more than once; only a failed, rolled back attempt is run again.
 */

const FIRST_BACKOFF_MS = 5;
const MAX_BACKOFF_MS = 100;
/**
 * Stale-map symptoms other than SC100: the old copy dropped (--drop-source, gc), or the old name
 * now views (no functions there): a missing relation, schema or function, or a statement views do
 * not take (TRUNCATE, COPY FROM, ALTER TABLE: 42809, wrong object type, before any of the views'
 * triggers can raise SC100); or a next_id() call caught by the clean-up's rename of the old copy
 * (its sequence then resolves in the renamed schema: SC003); or a move's incoming copy of a shard
 * the host held before, whose schema no role but its owner may use until the switch (a name the
 * search path no longer finds: 42P01, 42883; a qualified one: 42501, moves/privileges.ts
 * withheldSchemaAcl). Taken as a move only when the host says it no longer holds the shard.
 */
const MISSING_OBJECT_SQLSTATES = new Set(['42P01', '3F000', '42883', '42809', 'SC003', INSUFFICIENT_PRIVILEGE]);

/** What the follow loop needs of the router. */
export interface FollowPaths {
  settings: RouterSettings;
  diagnostics: RouterDiagnostics;
  pools: HostPools;
  checkShard(shard: number): void;
  hostForShard(shard: number): HostConfig;
  hosts(): readonly HostConfig[];
  reload(): Promise<void>;
  /** The shard's new host answered that it holds the shard, ahead of the next discovery. */
  followed(shard: number, host: string): void;
}

/**
 * One call, following moves: returns fn's value and the host it committed on (counted, and traced
 * when observed), or fn's value alone (`valueOnly`: withShard and the like, which need no host).
 * Not an async function itself (a routed call is on the application's hot path: each async layer
 * and each promise in the chain costs microtask turns and garbage); a shard outside the map still
 * rejects. A call that succeeds at once, the usual case, goes through one `then` here.
 */
export function runFollowing<T>(
  paths: FollowPaths,
  shard: number,
  attemptOn: (host: HostConfig, trace: CallTrace | undefined) => Promise<Attempt<T>>,
  readOnly?: boolean,
): Promise<{ value: T; host: string }>;
export function runFollowing<T>(
  paths: FollowPaths,
  shard: number,
  attemptOn: (host: HostConfig, trace: CallTrace | undefined) => Promise<Attempt<T>>,
  readOnly: boolean,
  valueOnly: true,
): Promise<T>;
export function runFollowing<T>(
  paths: FollowPaths,
  shard: number,
  attemptOn: (host: HostConfig, trace: CallTrace | undefined) => Promise<Attempt<T>>,
  readOnly = false,
  valueOnly = false,
): Promise<{ value: T; host: string } | T> {
  try {
    paths.checkShard(shard);
  } catch (error) {
    return Promise.reject(error as Error);
  }
  const trace = paths.diagnostics.begin(shard);
  let last: string | undefined;
  const onHost = (name: string): void => {
    last = name;
  };
  const succeeded = (done: { value: T; host: string }): { value: T; host: string } | T => {
    paths.diagnostics.ended(done.host, true);
    trace?.end(done.host);
    return valueOnly ? done.value : done;
  };
  const failed = (error: unknown): never => {
    // No host at all (none reachable holds the shard): nothing to count against; nor a call the
    // application's close() stopped before it ran (the host did nothing wrong).
    if (last !== undefined && !isRouterClosed(error)) paths.diagnostics.ended(last, false);
    trace?.end(last ?? '', { error });
    throw namingShard(error, shard);
  };
  // follow() (an async function, with its loop) is entered only when the first attempt did not succeed.
  const following = (first: FirstAttempt<T>): Promise<{ value: T; host: string } | T> =>
    follow(paths, shard, attemptOn, trace, onHost, readOnly, first).then(succeeded, failed);
  try {
    const host = paths.hostForShard(shard);
    onHost(host.name);
    trace?.attempt(host.name);
    const usedAddress = paths.pools.knownAddress(host);
    let attempted: Promise<Attempt<T>>;
    try {
      attempted = attemptOn(host, trace);
    } catch (error) {
      attempted = Promise.reject(error as Error);
    }
    return attempted.then(
      (attempt) =>
        attempt.ok
          ? succeeded({ value: attempt.value, host: host.name })
          : following({ host, usedAddress, outcome: { attempt } }),
      (error: unknown) => following({ host, usedAddress, outcome: { error } }),
    );
  } catch (error) {
    return Promise.reject(error as Error).then(succeeded, failed);
  }
}

/**
 * A host's failure as the call's: a HostError about the connection (a host that stopped answering,
 * one that cannot be reached) names the host only where it is made; the call names its shard too.
 */
function namingShard(error: unknown, shard: number): unknown {
  if (!(error instanceof HostError) || error.shard !== undefined || error.migration !== undefined) return error;
  return error.forShard(shard);
}

/**
 * A call that met a failover symptom and found no primary to run again on (none answered within
 * failoverTimeoutMs, or a host of one address that is down): the driver's or server's error (say,
 * "Connection terminated unexpectedly", which names nothing) said with the host and the shard, its
 * SQLSTATE kept as the code and the error itself as the cause. A HostError already names them.
 */
function noPrimary(hostName: string, shard: number, error: unknown): unknown {
  if (error instanceof ShardctlError) return namingShard(error, shard);
  const code = (error as { code?: unknown } | null | undefined)?.code;
  return new HostError(hostName, `${describePgError(error)}; no primary of the host answered, not run again`, {
    shard,
    code: typeof code === 'string' ? code : 'CONNECTION_LOST',
    cause: error,
  });
}

/** The attempt runFollowing made before entering follow(): its host, the address it used, and how it ended. */
interface FirstAttempt<T> {
  readonly host: HostConfig;
  readonly usedAddress: string | undefined;
  readonly outcome: { readonly attempt: Attempt<T> } | { readonly error: unknown };
}

async function follow<T>(
  paths: FollowPaths,
  shard: number,
  attemptOn: (host: HostConfig, trace: CallTrace | undefined) => Promise<Attempt<T>>,
  trace: CallTrace | undefined,
  onHost: (host: string) => void,
  readOnly: boolean,
  first: FirstAttempt<T>,
): Promise<{ value: T; host: string }> {
  const { settings, diagnostics, pools } = paths;
  let fencedSince: number | undefined;
  /** Whether the host the fence names held the shard when last asked (undefined: it did not say). */
  let newHolds: boolean | undefined;
  let backoffMs = FIRST_BACKOFF_MS;
  let failoverDeadline: number | undefined;
  let made: FirstAttempt<T>['outcome'] | undefined = first.outcome;
  for (;;) {
    // The first time round, the attempt runFollowing made; then a new one on the host the map names now.
    const host = made ? first.host : paths.hostForShard(shard);
    const usedAddress = made ? first.usedAddress : pools.knownAddress(host);
    let attempt: Attempt<T>;
    try {
      if (made) {
        const outcome = made;
        made = undefined;
        if ('error' in outcome) throw outcome.error;
        attempt = outcome.attempt;
      } else {
        onHost(host.name);
        trace?.attempt(host.name);
        attempt = await attemptOn(host, trace);
      }
    } catch (error) {
      // Connecting failed, or the connection was lost where nothing can have committed.
      if (!isInDoubt(error) && isFailoverSymptom(error, readOnly)) {
        failoverDeadline ??= Date.now() + settings.failoverTimeoutMs;
        trace?.waiting("the host's primary to answer (a failover, a restart)", host.name);
        // Bounded even when each search finds an address at once and the call fails there again.
        if (Date.now() < failoverDeadline && (await pools.recover(host, usedAddress, failoverDeadline, error)))
          continue;
        throw noPrimary(host.name, shard, pools.searchFailure(host.name) ?? error);
      }
      throw error;
    }
    if (attempt.ok) return { value: attempt.value, host: host.name };
    const error = attempt.error;
    // fn's statement failed because the host's primary went away: rolled back, run it again there.
    if (isFailoverSymptom(error, readOnly)) {
      failoverDeadline ??= Date.now() + settings.failoverTimeoutMs;
      trace?.waiting("the host's primary to answer (a failover, a restart)", host.name);
      if (Date.now() < failoverDeadline && (await pools.recover(host, usedAddress, failoverDeadline, error))) continue;
      throw noPrimary(host.name, shard, pools.searchFailure(host.name) ?? error);
    }
    const moved = shardMovedTo(error);
    // fn may throw anything, undefined and null too: passed on as it is.
    const code = (error as { code?: unknown } | null | undefined)?.code;
    if (!moved && !(typeof code === 'string' && MISSING_OBJECT_SQLSTATES.has(code))) throw error;
    // A missing object on a host that still holds the shard is the application's error.
    if (!moved && (await holds(paths, host.name, shard)) !== false) throw error;

    const now = Date.now();
    fencedSince ??= now;
    const waited = now - fencedSince;
    if (waited >= settings.fencedTimeoutMs)
      throw moved && moved.host !== host.name
        ? stillFenced(host.name, shard, moved.host, waited, newHolds, error)
        : error;
    trace?.retry(host.name, error);
    // The fence names the new host: straight there once it holds the shard (the switch is done).
    if (moved && moved.host !== host.name) {
      // No host answering the reload just now leaves the map in use: holds() below decides all the same.
      trace?.waiting('the new host to hold the shard', moved.host);
      if (!paths.hosts().some((h) => h.name === moved.host)) await paths.reload().catch(() => undefined);
      newHolds = await holds(paths, moved.host, shard);
      if (newHolds === true) {
        paths.followed(shard, moved.host);
        diagnostics.followed(host.name);
        trace?.followed(host.name, moved.host);
        continue;
      }
    } else {
      trace?.waiting('the placement (reading the fleet)');
      try {
        await paths.reload();
      } catch {
        // No host answered just now: retry with the map in use.
      }
      const now = paths.hostForShard(shard).name;
      if (now !== host.name) {
        diagnostics.followed(host.name);
        trace?.followed(host.name, now);
        continue;
      }
    }
    // Fenced, not switched yet: wait a little, then try again.
    const jitter = Math.random() * backoffMs * 0.5;
    const since = trace?.waiting('the fence of a move', host.name);
    await new Promise((resolve) =>
      setTimeout(resolve, Math.min(backoffMs + jitter, settings.fencedTimeoutMs - waited)),
    );
    if (since !== undefined) trace?.fenceWaited(since);
    backoffMs = Math.min(backoffMs * 2, MAX_BACKOFF_MS);
  }
}

/**
 * A shard fenced past fencedTimeoutMs: why, as far as the router can tell. The host the fence names
 * does not hold it (a move that has not switched: running, or stopped and waiting for --resume or
 * --abort), or did not answer.
 */
function stillFenced(
  hostName: string,
  shard: number,
  target: string,
  waitedMs: number,
  targetHolds: boolean | undefined,
  cause: unknown,
): HostError {
  const waited = `${(waitedMs / 1000).toFixed(1)} s`;
  const reason =
    targetHolds === false
      ? `shard ${shard} is fenced by a move to ${target} that has not switched (waited ${waited}): a running move switches within seconds; one that stopped is finished with shardctl move-shard ${shard} --resume, or undone with --abort`
      : `shard ${shard} is fenced by a move to ${target}, which did not say whether it holds the shard (waited ${waited})`;
  return new HostError(hostName, reason, {
    shard,
    code: 'SHARD_FENCED',
    cause,
    next: [
      { action: 'resume', shards: [shard] },
      { action: 'abort', shards: [shard] },
    ],
  });
}

/** Whether `hostName` holds `shard` active (its control schema says so); undefined when it cannot tell. */
async function holds(paths: FollowPaths, hostName: string, shard: number): Promise<boolean | undefined> {
  const host = paths.hosts().find((h) => h.name === hostName);
  if (!host) return undefined;
  try {
    const result = await paths.pools.ownQuery<{ active: boolean }>(
      await paths.pools.pool(host),
      `SELECT ${shardIsActive()} AS active FROM ${CONTROL}.shards WHERE shard = $1`,
      [shard],
    );
    return result.rows[0]?.active ?? false;
  } catch {
    return undefined;
  }
}
