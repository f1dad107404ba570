/**
 * Bounds how long a host may leave shardctl waiting. Connecting has a timeout of its own; after
 * that, a statement may legitimately run for hours (an index build, a COPY, a move's catch-up wait)
 * with nothing coming back, so silence alone proves nothing. When a connection has been waiting
 * `bound` ms with no byte from the server, a fresh connection must connect and answer SELECT 1
 * within `bound`: if it does, the host is alive, and a second new connection asks pg_stat_activity
 * whether the waiting connection's server process is still running its statement: if so the host
 * is busy and the wait goes on (statement_timeout and lock_timeout still apply); if that process is
 * idle or gone, this one connection was lost on the way (a NAT or firewall that dropped the flow, a
 * pooler that lost its server connection) and no reply will come: its socket is destroyed with a
 * HostError saying so. If the host does not answer, the silent connection's socket is destroyed with
 * a HostError naming the host, so its pending query fails and the command reports the host instead
 * of hanging.
 *
 * Reads node-postgres internals (tested with pg 8.x): the active query, the pipelined queue, the
 * ending flags and the socket. They are checked when a client is watched; without them the client
 * goes unwatched (TCP keepalive and the connect timeout still apply).
 */
import type { Socket } from 'node:net';
import pg from 'pg';
import type { HostConfig } from '../config/types.js';
import { HostError } from '../errors.js';
import { connectionEnded } from '../pg/ended.js';
import { redact } from '../pg/redact.js';
import { endQuietly } from '../pg/quiet.js';
import { libpqCompatible } from '../pg/tls.js';
import { isMultiHostUrl, parsePostgresUrl, singleAddressUrls } from '../pg/multihost.js';

/** The code of the HostError a silent host's pending queries fail with. */
export const HOST_SILENT = 'HOST_SILENT';

/** The client settings every shardctl connection to a host uses. */
export function hostClientSettings(
  host: HostConfig,
): Pick<pg.ClientConfig, 'connectionTimeoutMillis' | 'keepAlive' | 'keepAliveInitialDelayMillis'> {
  return {
    connectionTimeoutMillis: host.timeoutMs,
    // Lets the kernel notice a peer that vanished (rebooted, unplugged) while a connection is idle.
    keepAlive: true,
    keepAliveInitialDelayMillis: host.timeoutMs,
  };
}

interface PgClientInternals {
  _activeQuery: unknown;
  _sentQueryQueue?: unknown[];
  _ending: boolean;
  _ended: boolean;
  connection: { stream: Socket };
}

function internalsOf(client: pg.Client): PgClientInternals | undefined {
  const candidate = client as unknown as Partial<PgClientInternals>;
  const stream = candidate.connection?.stream;
  if (!('_activeQuery' in candidate) || typeof candidate._ending !== 'boolean' || typeof candidate._ended !== 'boolean')
    return undefined;
  if (!stream || typeof stream.destroy !== 'function' || typeof stream.on !== 'function') return undefined;
  return candidate as PgClientInternals;
}

/** A query sent (or queued to be sent) and not answered yet. */
function waitsForQuery(internals: PgClientInternals): boolean {
  return internals._activeQuery != null || (internals._sentQueryQueue?.length ?? 0) > 0;
}

/**
 * How long past a statement timeout a reply may take (the server notices the timeout, cancels,
 * and sends the error) before the silence counts: the slack of silenceAfterMs.
 */
export const STATEMENT_REPLY_SLACK_MS = 1000;

/**
 * How long a connection may wait with no byte from `host` before the host is asked whether it still
 * answers: its hostTimeout, or, when every statement on the connection runs under a statement
 * timeout (the router's statementTimeoutMs), that timeout and STATEMENT_REPLY_SLACK_MS when shorter:
 * a server that answers replies by then, with the rows or with the timeout's error.
 */
export function silenceAfterMs(host: HostConfig, statementTimeoutMs: number | undefined): number {
  return statementTimeoutMs ? Math.min(host.timeoutMs, statementTimeoutMs + STATEMENT_REPLY_SLACK_MS) : host.timeoutMs;
}

/**
 * Watches a connected client until it ends. Its timer is unref'd: it never keeps the process alive,
 * and it stops when the client ends. `silenceMs` (silenceAfterMs; at most the host's timeout) is how
 * long a wait with no byte from the server goes before the host is probed; the probe itself has the
 * host's timeout, so a host that is merely slow to take a new connection is not judged by the shorter
 * bound.
 */
export function watchSilence(client: pg.Client, host: HostConfig, silenceMs: number = host.timeoutMs): void {
  // The failure reaches the pending query; a checked-out pool client has no other listener, and
  // node-postgres would throw its 'error' event at the process. The error is kept: a query made on
  // the client afterwards only hears that it is not queryable (src/pg/ended.ts says why).
  client.on('error', (error) => connectionEnded(client, error));
  const internals = internalsOf(client);
  if (!internals) return;
  const bound = Math.min(silenceMs, host.timeoutMs);
  const probeBound = host.timeoutMs;
  const stream = internals.connection.stream;
  let heardAt = Date.now();
  let waitingSince: number | undefined;
  let endingSince: number | undefined;
  let checking = false;

  // Polled, not a 'data' listener: pg-copy-streams insists on being the socket's only reader.
  let bytesRead = stream.bytesRead;

  const tick = (): void => {
    if (internals._ended || stream.destroyed) {
      clearInterval(timer);
      return;
    }
    const now = Date.now();
    if (stream.bytesRead !== bytesRead) {
      bytesRead = stream.bytesRead;
      heardAt = now;
    }
    if (internals._ending) {
      // end() waits for the server to close the socket; a silent one never does.
      endingSince ??= now;
      if (now - endingSince >= bound) stream.destroy();
      return;
    }
    if (!waitsForQuery(internals)) {
      waitingSince = undefined;
      return;
    }
    waitingSince ??= now;
    const silentSince = Math.max(heardAt, waitingSince);
    // A host a probe has just found dead: a statement sent to it since is given a quarter of the
    // bound, not the whole, so a run's last steps there (a flush, releasing its locks) do not each
    // wait a full bound before the command can report the host.
    const dead = knownDead(host, heardAt);
    if (checking || now - silentSince < (dead === null ? bound : Math.max(20, Math.floor(bound / 4)))) return;
    if (dead !== null) {
      stream.destroy(new HostError(host.name, silentReason(bound, probeBound, dead), { code: HOST_SILENT }));
      return;
    }
    checking = true;
    const seen = stream.bytesRead;
    void probeHost(host, silentSince, heardAt).then(async (failure) => {
      if (failure === null) {
        // The host answers: is this connection's statement still running there, or was the
        // connection lost on the way (a NAT or firewall that dropped the flow, a pooler that lost
        // its server connection) so that no reply will ever come?
        const lost = await lostConnection(client, host, bound, probeBound).catch(() => null);
        checking = false;
        if (lost !== null && stream.bytesRead === seen && !stream.destroyed) {
          // HOST_SILENT for the waits it fails, marked as one connection's: the host itself is fine.
          stream.destroy(new HostError(host.name, lost, { code: HOST_SILENT, data: { connectionLost: true } }));
          return;
        }
        // Alive and busy: wait on, and look again after another bound of silence.
        waitingSince = Date.now();
        return;
      }
      checking = false;
      if (stream.bytesRead !== seen || stream.destroyed) return;
      stream.destroy(new HostError(host.name, silentReason(bound, probeBound, failure), { code: HOST_SILENT }));
    });
  };
  const timer = setInterval(tick, Math.min(1000, Math.max(20, Math.floor(bound / 5))));
  timer.unref();
  client.once('end', () => clearInterval(timer));
}

/**
 * Whether `client` waits for a query now, and how many bytes its socket has read so far: for a
 * caller that times a connection's silence against a limit of its own (a fenced wave's,
 * watchFence). undefined when that cannot be told (node-postgres internals not as expected).
 */
export function waitState(client: pg.Client): { waiting: boolean; bytesRead: number } | undefined {
  const internals = internalsOf(client);
  if (!internals) return undefined;
  const stream = internals.connection.stream;
  const open = !internals._ended && !stream.destroyed;
  return { waiting: open && waitsForQuery(internals), bytesRead: stream.bytesRead };
}

/**
 * Fails the query `client` waits for, and every later one, as if `host` had stopped answering:
 * its socket is destroyed with a HostError (HOST_SILENT) saying `reason`. Only this client: the
 * host is not judged for the process's other connections. A client that ended is left as it is.
 */
export function cutOff(client: pg.Client, host: HostConfig, reason: string): void {
  const internals = internalsOf(client);
  if (!internals || internals._ended || internals.connection.stream.destroyed) return;
  internals.connection.stream.destroy(new HostError(host.name, reason, { code: HOST_SILENT }));
}

/**
 * The server process of a connection whose pid the server gave at connect time (BackendKeyData)
 * and that connectHost confirmed with pg_backend_pid() (not a pooler's stand-in): see lostConnection.
 */
const confirmedPids = new WeakMap<object, number>();

/** Records that `client`'s BackendKeyData pid is its server process (asked with pg_backend_pid()). */
export function confirmBackendPid(client: pg.ClientBase, pid: number): void {
  if ((client as unknown as { processID?: unknown }).processID === pid) confirmedPids.set(client, pid);
}

/**
 * Why `client`'s connection is lost although its host answers, asked over a new connection: its
 * server process is idle (it finished, or never received, what the client waits for: the reply
 * or the request was lost on the way), or gone (for a pid confirmed at connect; through a pooler
 * the pid is the pooler's and proves nothing). null: the statement is running (busy), or it cannot
 * be told (a role that may not see the process's state).
 */
async function lostConnection(
  client: pg.Client,
  host: HostConfig,
  bound: number,
  probeBound: number,
): Promise<string | null> {
  const pid = (client as unknown as { processID?: unknown }).processID;
  if (typeof pid !== 'number') return null;
  const applicationName = (client as unknown as { connectionParameters?: { application_name?: unknown } })
    .connectionParameters?.application_name;
  const rows = await onNewConnection(host.url, host, probeBound, async (probe) => {
    const result = await probe.query<{ state: string | null }>(
      `SELECT state FROM pg_catalog.pg_stat_activity WHERE pid = $1${typeof applicationName === 'string' ? ' AND application_name = $2' : ''}`,
      typeof applicationName === 'string' ? [pid, applicationName] : [pid],
    );
    return result.rows;
  });
  if (rows === undefined) return null;
  if (rows.length === 0)
    return confirmedPids.get(client) === pid
      ? `the connection was lost: the host answers a new connection, but this connection's server process (pid ${pid}) is gone`
      : null;
  const state = rows[0]!.state;
  if (state === null || state === 'active' || state === 'fastpath function call') return null;
  return `the connection was lost: the host answers a new connection, but this connection's server process (pid ${pid}) is ${state}, not running what shardctl has waited ${formatMs(bound)} for`;
}

function silentReason(bound: number, probeBound: number, failure: string): string {
  return `stopped answering: no reply for ${formatMs(bound)} and a new connection could not run SELECT 1 within ${formatMs(probeBound)} (${failure})`;
}

interface Probe {
  readonly startedAt: number;
  /** null: the host answered; else why not. */
  readonly failure: Promise<string | null>;
  failed: boolean;
  /** Why it failed, and when that was known. */
  reason?: string;
  failedAt?: number;
}

/**
 * Why the host's last probe failed, while that verdict stands (see probeHost), for a connection that
 * has heard nothing from the host since; else null. A connection that heard from it later (the host
 * came back) or connected later is judged on its own.
 */
function knownDead(host: HostConfig, heardAt: number): string | null {
  const probe = probes.get(`${host.name}\u0000${host.url}`);
  if (!probe?.failed || probe.reason === undefined || probe.failedAt === undefined) return null;
  return heardAt <= probe.failedAt ? probe.reason : null;
}

/**
 * One probe per host at a time, shared: every connection that fell silent before a probe started
 * takes its verdict, so a dead host with many connections is probed once. A failed verdict also
 * stands for `bound` after it came, so a run's last statements on a dead host (releasing its locks)
 * fail after one bound of silence rather than two.
 */
const probes = new Map<string, Probe>();

function probeHost(host: HostConfig, silentSince: number, heardAt: number): Promise<string | null> {
  const key = `${host.name}\u0000${host.url}`;
  const existing = probes.get(key);
  // A probe started since this connection fell silent answers for it; a failed one that started
  // earlier only if this connection has heard nothing from the host since it failed (a connection
  // silent for less than hostTimeout, under a statement timeout, may meet a verdict still standing).
  if (
    existing &&
    (existing.startedAt >= silentSince ||
      (existing.failed && existing.failedAt !== undefined && heardAt <= existing.failedAt))
  )
    return existing.failure;
  const probe: Probe = { startedAt: Date.now(), failure: runProbe(host), failed: false };
  probes.set(key, probe);
  void probe.failure.then((failure) => {
    probe.failed = failure !== null;
    if (failure !== null) {
      probe.reason = failure;
      probe.failedAt = Date.now();
    }
    const forget = setTimeout(() => {
      if (probes.get(key) === probe) probes.delete(key);
    }, host.timeoutMs);
    forget.unref();
  });
  return probe.failure;
}

/**
 * Whether `host` answers a new connection's SELECT 1 within `ms`: null if it does, else why not.
 * Its own probe, not shared (probeHost): for a caller with a limit shorter than hostTimeout
 * (watchFence), which must tell a silent host from a busy statement before it cuts anything off.
 */
export function answersWithin(host: HostConfig, ms: number): Promise<string | null> {
  return runProbe(host, ms);
}

async function runProbe(host: HostConfig, bound = host.timeoutMs): Promise<string | null> {
  if (!isMultiHostUrl(host.url)) return probeAddress(host.url, host, bound);
  // A host of several addresses is there when any of them answers (whichever is its primary now).
  const urls = singleAddressUrls(parsePostgresUrl(host.url, `host ${host.name} url`));
  const failures = await Promise.all(urls.map((url) => probeAddress(url, host, bound)));
  return failures.includes(null) ? null : failures.join('; ');
}

/** `run` on a new connection to `url`, all within `bound`; undefined when that failed. */
async function onNewConnection<T>(
  url: string,
  host: HostConfig,
  bound: number,
  run: (client: pg.Client) => Promise<T>,
): Promise<T | undefined> {
  const probe = new pg.Client({
    connectionString: libpqCompatible(url),
    application_name: 'shardctl probe',
    ...hostClientSettings(host),
    connectionTimeoutMillis: 0,
  });
  probe.on('error', () => undefined);
  const stream = (probe as unknown as Partial<PgClientInternals>).connection?.stream;
  const deadline = setTimeout(() => stream?.destroy(), bound);
  deadline.unref();
  try {
    await probe.connect();
    return await run(probe);
  } catch {
    return undefined;
  } finally {
    clearTimeout(deadline);
    const closing = setTimeout(() => stream?.destroy(), bound);
    closing.unref();
    void endQuietly(probe).finally(() => clearTimeout(closing));
  }
}

async function probeAddress(url: string, host: HostConfig, bound: number): Promise<string | null> {
  // The deadline below bounds connecting and the query together.
  const probe = new pg.Client({
    connectionString: libpqCompatible(url),
    application_name: 'shardctl probe',
    ...hostClientSettings(host),
    connectionTimeoutMillis: 0,
  });
  probe.on('error', () => undefined);
  const stream = (probe as unknown as Partial<PgClientInternals>).connection?.stream;
  let phase = 'connecting';
  let timedOut = false;
  const deadline = setTimeout(() => {
    timedOut = true;
    stream?.destroy();
  }, bound);
  deadline.unref();
  try {
    await probe.connect();
    phase = 'SELECT 1';
    await probe.query('SELECT 1');
    return null;
  } catch (error) {
    // The server answered, if only with an error (too many connections, authentication): it is there.
    if (error instanceof pg.DatabaseError) return null;
    const message =
      error instanceof Error ? error.message || String((error as { code?: unknown }).code) : String(error);
    return timedOut ? `${phase} got no answer` : `${phase} failed: ${redact(message)}`;
  } finally {
    clearTimeout(deadline);
    const closing = setTimeout(() => stream?.destroy(), bound);
    closing.unref();
    void endQuietly(probe).finally(() => clearTimeout(closing));
  }
}

/** 2000 → "2 s", 1500 → "1.5 s", 500 → "500 ms". */
export function formatMs(ms: number): string {
  return ms < 1000 ? `${ms} ms` : `${Number((ms / 1000).toFixed(1))} s`;
}
