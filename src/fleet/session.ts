import { EventEmitter } from 'node:events';
import type pg from 'pg';
import type { HostConfig } from '../config/types.js';
import { failureReason, HostError, RuntimeFailure, ShardctlError } from '../errors.js';
import { connectHost, describePgError, reportedSetting, untilAborted } from './connect.js';
import { refuseSecondPrimary } from './primaries.js';
import { HOST_SILENT } from './silence.js';
import { CONTROL_SCHEMA, requireKnownControlVersion } from './control.js';
import { abandonRunnerLock, openRunnerLock, registerWorker, releaseRunnerLock, takeRunnerLock } from './locks.js';
import { endQuietly } from '../pg/quiet.js';
import { quoteLiteral } from '../pg/quote.js';
import { controlRightsError, requireRights } from './rights.js';

/**
 * Host sessions: one coordinator connection per host, with the server's version read once when it
 * opens. Every command that talks to the fleet opens, locks, loses and closes hosts through here,
 * so "a host went away" means the same thing to init, migrate, status, gc and a move.
 */
export interface HostSession {
  readonly host: HostConfig;
  readonly client: pg.Client;
  /** server_version, e.g. "18.4". */
  readonly serverVersion: string;
  /** server_version_num, e.g. 180004. */
  readonly serverVersionNum: number;
  locked: boolean;
}

/** A host that could not be reached or read; `reason` does not repeat the host's name. */
export interface LostHost {
  readonly host: HostConfig;
  readonly reason: string;
}

export interface OpenOptions {
  /** Shown in pg_stat_activity, e.g. 'shardctl move'. */
  readonly applicationName?: string;
}

export async function openSession(host: HostConfig, options: OpenOptions = {}): Promise<HostSession> {
  const client = await connectHost(host, { applicationName: options.applicationName ?? 'shardctl' });
  tagErrors(client, host.name);
  const reported = reportedSetting(client, 'server_version');
  const reportedNum = reported === undefined ? null : versionNum(reported);
  if (reported !== undefined && reportedNum !== null) {
    return { host, client, serverVersion: reported, serverVersionNum: reportedNum, locked: false };
  }
  try {
    const result = await client.query<{ version: string; num: string }>(
      `SELECT current_setting('server_version') AS version, current_setting('server_version_num') AS num`,
    );
    const row = result.rows[0]!;
    return { host, client, serverVersion: row.version, serverVersionNum: Number(row.num), locked: false };
  } catch (error) {
    await endQuietly(client);
    throw new HostError(host.name, `cannot read the server version: ${describePgError(error)}`, {
      code: 'HOST_UNREACHABLE',
      cause: error,
    });
  }
}

/**
 * server_version_num from server_version as the server reports it at start-up ("18.4" → 180004,
 * "18beta1" → 180000, "9.6.24" → 90624, "15.18 (Debian 15.18-0+deb12u1)" → 150018); null for a
 * form it does not know, and the caller asks the server instead.
 */
export function versionNum(version: string): number | null {
  const match = /^(\d+)(?:\.(\d+))?(?:\.(\d+))?(?:(?:devel|alpha\d*|beta\d*|rc\d*)|\s|$)/.exec(version);
  if (!match) return null;
  const [major, minor, patch] = [Number(match[1]), Number(match[2] ?? 0), Number(match[3] ?? 0)];
  return major >= 10 ? major * 10000 + minor : major * 10000 + minor * 100 + patch;
}

/**
 * A connection that does the work of a run on a host (copying, creating shards) while the run's
 * session holds the runner lock: it is recorded as a worker, so a later run waits for it to finish
 * even if this process dies (see locks.ts). `signal` ends the attempt at once (connecting or
 * registering) when the connection is no longer wanted.
 */
export async function openWorker(
  host: HostConfig,
  applicationName = 'shardctl worker',
  signal?: AbortSignal,
): Promise<pg.Client> {
  const client = await connectHost(host, { applicationName, signal });
  tagErrors(client, host.name);
  try {
    await untilAborted(client, signal, () => registerWorker(client, host.name));
  } catch (error) {
    await endQuietly(client);
    throw error;
  }
  return client;
}

/** The host whose connection raised `error` (a query on a session or worker), if known. */
export function errorHost(error: unknown): string | undefined {
  // A COPY stream's failure is not tagged by tagErrors; a silent host's HostError names it anyway.
  if (error instanceof HostError) return error.host;
  return (error as { shardctlHost?: string } | null)?.shardctlHost;
}

/**
 * Every failed query on this client carries the host's name, so an engine that talks to two hosts
 * reports a failure against the host where it happened: a promise's rejection, and the error of a
 * stream (COPY TO / FROM, which pipeline() passes on to the other end; the first tag stays).
 */
function tagErrors(client: pg.Client, host: string): void {
  const tag = (error: unknown): void => {
    if (error && typeof error === 'object' && !('shardctlHost' in error))
      Object.defineProperty(error, 'shardctlHost', { value: host });
  };
  const query = client.query.bind(client) as (...args: unknown[]) => unknown;
  (client as unknown as { query: (...args: unknown[]) => unknown }).query = (...args: unknown[]) => {
    const result = query(...args);
    if (result && typeof (result as Promise<unknown>).then === 'function') {
      return (result as Promise<unknown>).catch((error: unknown) => {
        tag(error);
        throw error;
      });
    }
    if (result instanceof EventEmitter) {
      result.prependListener('error', function tagStream(error: unknown) {
        tag(error);
        // Alone, it must not swallow the error: an 'error' nobody listens to throws.
        if (result.listenerCount('error') === 1) throw error;
      });
    }
    return result;
  };
}

/**
 * Where the control schema does not exist yet, the run's role must be allowed to create it (the
 * runner lock's tables go there first): checked on every host before the first lock is taken, so a
 * host that refuses stops the run with nothing written on the others. What each check settled to
 * is returned: a host whose check failed (its connection lost, say) is left to the lock, which gets
 * that failure as the host's and loses the host or stops, as for any failure of the lock.
 */
async function requireControlSchemaRights(
  sessions: readonly HostSession[],
): Promise<PromiseSettledResult<HostError | null | undefined>[]> {
  return requireRights(
    sessions,
    async (s) => {
      const { rows } = await s.client.query<{ refused: boolean }>(
        `SELECT pg_catalog.to_regnamespace(${quoteLiteral(CONTROL_SCHEMA)}) IS NULL
                AND NOT pg_catalog.has_database_privilege(pg_catalog.current_database(), 'CREATE') AS refused`,
      );
      return rows[0]!.refused
        ? controlRightsError(s.client, s.host, new Error('permission denied for database'))
        : undefined;
    },
    (count) => `${count} hosts refuse this role the control schema; nothing was written`,
    { alone: true },
  );
}

export async function closeSession(session: HostSession): Promise<void> {
  await Promise.all([session.locked ? releaseRunnerLock(session.client) : undefined, endQuietly(session.client)]);
}

/** Runs fn with a session on host, closing it afterwards whatever happens. */
export async function withSession<T>(
  host: HostConfig,
  fn: (session: HostSession) => Promise<T>,
  options: OpenOptions = {},
): Promise<T> {
  const session = await openSession(host, options);
  try {
    return await fn(session);
  } finally {
    await closeSession(session);
  }
}

/**
 * Sessions on several hosts. A host that cannot be reached is "lost": commands that can go on
 * without it (migrate, status) report it; the others call requireAll() before writing anything.
 */
export class Fleet {
  private constructor(
    readonly sessions: HostSession[],
    readonly lost: LostHost[],
  ) {}

  /** Connects to every host in parallel; one session per host name. */
  static async open(hosts: readonly HostConfig[], options: OpenOptions = {}): Promise<Fleet> {
    const unique = hosts.filter((h, i) => hosts.findIndex((o) => o.name === h.name) === i);
    const results = await Promise.allSettled(unique.map((host) => openSession(host, options)));
    const fleet = new Fleet([], []);
    results.forEach((result, i) => {
      const host = unique[i]!;
      if (result.status === 'fulfilled') fleet.sessions.push(result.value);
      else fleet.lost.push({ host, reason: failureReason(result.reason, describePgError) });
    });
    return fleet;
  }

  session(hostName: string): HostSession {
    const session = this.sessions.find((s) => s.host.name === hostName);
    if (!session) throw new Error(`no session on host ${hostName}`);
    return session;
  }

  /** Writing is safe only when every host has been reached (e.g. checked for another copy of a schema). */
  requireAll(): void {
    if (this.lost.length === 0) return;
    const [first] = this.lost;
    if (this.lost.length === 1) throw new HostError(first!.host.name, first!.reason, { code: 'HOST_UNREACHABLE' });
    throw new RuntimeFailure(
      'HOST_UNREACHABLE',
      `${this.lost.length} hosts cannot be reached; nothing was written:\n${this.lost.map((l) => `  - host ${l.host.name}: ${l.reason}`).join('\n')}`,
      { hosts: this.lost.map((l) => l.host.name) },
    );
  }

  /**
   * Takes the runner lock on every host, in order. Another runner on any host stops the whole run
   * before anything is written (fail fast, whatever the command); a host whose connection fails
   * here is lost when `tolerateLoss`, else the run stops. The lock connections are opened on all
   * hosts at once (nothing is locked by opening one); only the locks are taken one after the other.
   */
  async lock(options: { lockTimeout?: string; tolerateLoss?: boolean } = {}): Promise<void> {
    // Every run takes its hosts' locks in the order of their names, not in its own order of hosts
    // (a move's is source then target): two runs in opposite directions (pg1 → pg2 and pg2 → pg1,
    // or two files that list the hosts differently) would each hold one lock and wait for the
    // other's until lockTimeout, and both fail where the second could have waited for the first.
    const sessions = [...this.sessions].sort((a, b) => byName(a.host.name, b.host.name));
    const checked = await requireControlSchemaRights(sessions);
    // A host of several addresses two of which answer as its writable primary (split brain) stops
    // the run before anything is locked or written, as another runner does.
    const single = await Promise.allSettled(
      sessions.map((s) => refuseSecondPrimary(s.host, s.client, { applicationName: 'shardctl' })),
    );
    const opened = await Promise.allSettled(
      sessions.map((s, i) => {
        const failed = [checked[i]!, single[i]!].find((r) => r.status === 'rejected');
        return failed ? Promise.reject(failed.reason as Error) : openRunnerLock(s.host, s.client);
      }),
    );
    let next = 0;
    try {
      for (; next < sessions.length; next++) {
        const session = sessions[next]!;
        const pending = opened[next]!;
        try {
          if (pending.status === 'rejected') throw pending.reason;
          await takeRunnerLock(pending.value, options.lockTimeout ? { workerWait: options.lockTimeout } : {});
          session.locked = true;
          await requireKnownControlVersion(session.client, session.host.name);
        } catch (error) {
          // Another runner stops everything; a host that cannot be reached (the lock's own connection
          // included) or stopped answering is lost.
          if (error instanceof ShardctlError && error.code !== HOST_SILENT && error.code !== 'HOST_UNREACHABLE')
            throw error;
          this.lose(session, error, options.tolerateLoss ?? false, 'cannot take the runner lock');
        }
      }
    } finally {
      // The lock connections of the hosts not reached when a run stops (a busy or lost host before them).
      await Promise.all(
        opened.slice(next + 1).flatMap((p) => (p.status === 'fulfilled' ? [abandonRunnerLock(p.value)] : [])),
      );
    }
  }

  /**
   * Runs fn on every session in parallel and returns the results in session order. A session whose
   * fn fails is lost when `tolerateLoss`; otherwise the first failure is thrown, naming its host.
   */
  async each<T>(
    fn: (session: HostSession) => Promise<T>,
    options: { tolerateLoss?: boolean; doing?: string } = {},
  ): Promise<T[]> {
    const sessions = [...this.sessions];
    const results = await Promise.allSettled(sessions.map((s) => fn(s)));
    const values: T[] = [];
    results.forEach((result, i) => {
      if (result.status === 'fulfilled') values.push(result.value);
      else this.lose(sessions[i]!, result.reason, options.tolerateLoss ?? false, options.doing);
    });
    return values;
  }

  /** Drops a failed host from the fleet (tolerate) or turns its failure into a HostError. */
  lose(session: HostSession, error: unknown, tolerate: boolean, doing?: string): void {
    const reason = `${doing ? `${doing}: ` : ''}${failureReason(error, describePgError)}`;
    if (!tolerate)
      throw error instanceof HostError ? error : new HostError(session.host.name, reason, { cause: error });
    this.sessions.splice(this.sessions.indexOf(session), 1);
    this.lost.push({ host: session.host, reason });
    void closeSession(session);
  }

  async close(): Promise<void> {
    await Promise.all(this.sessions.map((s) => closeSession(s)));
  }
}

/** Host names in one order for every run (code points, not the locale's collation). */
function byName(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0;
}
