import pg from 'pg';
import type { HostConfig } from '../config/types.js';
import { HostError } from '../errors.js';
import { redact, registerSecret, registerUrlSecret } from '../pg/redact.js';
import { confirmBackendPid, HOST_SILENT, hostClientSettings, watchSilence } from './silence.js';
import { isLostConnection } from '../pg/ended.js';
import { endQuietly } from '../pg/quiet.js';
import { serializeQueries } from '../pg/serial.js';
import { isSqlState } from '../pg/sqlstate.js';
import { libpqCompatible } from '../pg/tls.js';
import {
  addressLabel,
  attrsFor,
  connectFirstMatching,
  parsePostgresUrl,
  SESSION_STATE_SQL,
  type PostgresUrl,
  type SessionState,
} from '../pg/multihost.js';

export interface ConnectOptions {
  /** Shown in pg_stat_activity so a DBA can see what a shardctl connection is doing. */
  applicationName?: string;
  /**
   * Ends the connection attempt at once when aborted (a connection opened ahead and no longer
   * wanted); with withHost, the work on the connection too.
   */
  signal?: AbortSignal;
}

/**
 * Connects to a host of the map. PG* environment variables and ~/.pgpass apply through
 * node-postgres, as with psql. Errors name the host and never contain the password. Connecting,
 * and any later wait on the host, are bounded by the host's timeout (see silence.ts).
 */
export async function connectHost(host: HostConfig, options: ConnectOptions = {}): Promise<pg.Client> {
  registerUrlSecret(host.url);
  registerSecret(process.env['PGPASSWORD']);
  const parsed = parsedHostUrl(host);
  const attrs = attrsFor(parsed);
  try {
    // One address and nothing asked of it: connected to as it is, unchecked (libpq's "any").
    if (parsed.addresses.length === 1 && attrs === 'any') return await connectAddress(host, host.url, options);
    const { client } = await connectFirstMatching(parsed, attrs, {
      open: (single) => connectAddress(host, single, options),
      stateOf: (client: pg.Client) => sessionState(client),
      close: (client: pg.Client) => endQuietly(client),
      describe: describePgError,
    });
    return client;
  } catch (error) {
    if (error instanceof HostError && error.code === HOST_SILENT) throw error;
    throw new HostError(host.name, `cannot connect: ${describePgError(error)}`, {
      code: 'HOST_UNREACHABLE',
      cause: error,
    });
  }
}

/** The settings of a one-off connection (connectOnce). */
export interface OnceOptions {
  readonly applicationName: string;
  /** Bounds the connect, with the host's own timeout (the shorter of the two). */
  readonly connectTimeoutMs: number;
}

/**
 * A connection to one address of a host outside its pools, for a question asked once (is this
 * server a primary or a standby?) and ended by the caller: the shorter of `connectTimeoutMs` and the
 * host's timeout bounds the connect, TCP keepalives on, and an error the idle client emits swallowed
 * (its next query fails instead). A failed connect is ended and thrown. Routers use it to find a
 * host's primary (router/failover.ts) and its standbys (router/replicas.ts).
 */
export async function connectOnce(
  host: Pick<HostConfig, 'timeoutMs'>,
  url: string,
  options: OnceOptions,
): Promise<pg.Client> {
  registerUrlSecret(url);
  const client = new pg.Client({
    connectionString: libpqCompatible(url),
    application_name: options.applicationName,
    connectionTimeoutMillis: Math.min(options.connectTimeoutMs, host.timeoutMs),
    keepAlive: true,
  });
  client.on('error', () => undefined);
  try {
    await client.connect();
  } catch (error) {
    discard(client);
    throw error;
  }
  return client;
}

/** The host's URL parsed (cached per URL: a config's URLs were checked when it was loaded). */
export function parsedHostUrl(host: Pick<HostConfig, 'name' | 'url'>): PostgresUrl {
  let parsed = parsedUrls.get(host.url);
  if (!parsed) {
    parsed = parsePostgresUrl(host.url, `host ${host.name} url`);
    parsedUrls.set(host.url, parsed);
  }
  return parsed;
}
const parsedUrls = new Map<string, PostgresUrl>();

/** Whether the session is a standby, and whether it is read-only (target_session_attrs). */
export async function sessionState(client: pg.Client | pg.PoolClient): Promise<SessionState> {
  const { rows } = await client.query<{ in_recovery: boolean; read_only: boolean }>(SESSION_STATE_SQL);
  return { inRecovery: rows[0]!.in_recovery, readOnly: rows[0]!.read_only };
}

/** The address (host:port) a client of connectHost is connected to. */
export function connectedAddress(client: pg.Client): string | undefined {
  return addresses.get(client);
}
const addresses = new WeakMap<pg.Client, string>();

/**
 * The host's URL narrowed to the one address `client` (of connectHost) went to: for a second
 * connection that must reach the same server (a move's replication connection), since node-postgres
 * cannot read a URL of several addresses. The host's URL itself when it has one address.
 */
export function connectedUrl(host: HostConfig, client: pg.Client): string {
  return connectedUrls.get(client) ?? host.url;
}
const connectedUrls = new WeakMap<pg.Client, string>();

/** One address of the host (`url` has a single one); errors as node-postgres throws them. */
async function connectAddress(host: HostConfig, url: string, options: ConnectOptions): Promise<pg.Client> {
  const client = new pg.Client({
    connectionString: libpqCompatible(url),
    application_name: options.applicationName ?? 'shardctl',
    ...hostClientSettings(host),
  });
  // An idle client whose server goes away emits 'error'; without a listener that would crash the
  // process. The next query on it fails and is reported with the host's name instead.
  client.on('error', () => undefined);
  serializeQueries(client);
  // The server reports some settings (server_version among them) while the connection starts; kept
  // so that nobody spends a round trip asking again.
  const reported = new Map<string, string>();
  startupSettings.set(client, reported);
  client.connection.on('parameterStatus', (message: { parameterName: string; parameterValue: string }) => {
    reported.set(message.parameterName, message.parameterValue);
  });
  const single = parsePostgresUrl(url, `host ${host.name} url`).addresses[0]!;
  addresses.set(client, addressLabel(single));
  connectedUrls.set(client, url);
  try {
    await untilAborted(client, options.signal, async () => {
      await client.connect();
      // The silence watchdog probes the address this connection went to, not the host's first.
      watchSilence(client, url === host.url ? host : { ...host, url });
      await confirmServerPid(client);
    });
  } catch (error) {
    discard(client);
    throw error;
  }
  return client;
}

/**
 * Drops a client whose connecting failed: its socket destroyed, not end(), since a socket that never
 * connected (say, to a port Node refuses) never emits the 'end' that end() would wait for.
 */
function discard(client: pg.Client): void {
  client.connection.stream.destroy();
}

/**
 * Runs `work` on `client`, which is ended (its socket destroyed, whatever it waits for failing at
 * once) if `signal` aborts meanwhile; refused before it starts when the signal already has.
 */
export async function untilAborted<T>(
  client: pg.Client,
  signal: AbortSignal | undefined,
  work: () => Promise<T>,
): Promise<T> {
  if (!signal) return work();
  if (signal.aborted) throw new Error('the connection is no longer wanted');
  // Its socket destroyed, not a Terminate sent: a host that stopped answering would never close its side.
  const abort = (): void => void client.connection.stream.destroy();
  signal.addEventListener('abort', abort, { once: true });
  try {
    return await work();
  } finally {
    signal.removeEventListener('abort', abort);
  }
}

/** How often the server checks, during a statement, that a shardctl client is still there. */
export const CLIENT_CONNECTION_CHECK_INTERVAL = '1s';

/**
 * A server otherwise notices a killed client only when it next writes to it: a killed run's
 * statement (and the locks it holds) would run on to its end. PostgreSQL 14+ has
 * client_connection_check_interval; platforms where the setting must stay 0 go without (the runner
 * lock's wait covers the rest). This sets it for the session: only for a connection that is a server
 * session of shardctl's own for its whole life (a move's replication connection, a no-transaction
 * migration's worker, both on the host's directUrl). Transactions that may go through a pooler set it
 * for themselves (WORKER_TRANSACTION_SQL), a move's workers as they are put to work (ASYNC_COMMIT_SQL).
 */
export async function checkClientConnection(client: pg.Client): Promise<void> {
  // The same round trip confirms that the pid the server gave at connect time is this connection's
  // server process (not a pooler's stand-in), so that the silence watchdog may take its absence
  // from pg_stat_activity as a lost connection (silence.ts).
  await client
    .query<{ pid: number }>(
      `SELECT pg_catalog.pg_backend_pid() AS pid, CASE WHEN current_setting('server_version_num')::int >= 140000
          THEN set_config('client_connection_check_interval', '${CLIENT_CONNECTION_CHECK_INTERVAL}', false) END AS check_interval`,
    )
    .then(
      ({ rows }) => confirmBackendPid(client, rows[0]!.pid),
      (error: unknown) => {
        // 22023: "must be set to 0 on this platform"; anything else is a real failure.
        if ((error as { code?: unknown }).code !== '22023') throw error;
      },
    );
}

/**
 * Asks the server for this connection's process id, so that the silence watchdog may take its
 * absence from pg_stat_activity as a lost connection (silence.ts) when it is the pid the server gave
 * at connect time (not a pooler's stand-in). A query of its own: nothing is set on the session.
 */
async function confirmServerPid(client: pg.Client): Promise<void> {
  const { rows } = await client.query<{ pid: number }>('SELECT pg_catalog.pg_backend_pid() AS pid');
  confirmBackendPid(client, rows[0]!.pid);
}

const startupSettings = new WeakMap<pg.Client, ReadonlyMap<string, string>>();

/** A setting the server reported when this client connected (ParameterStatus), e.g. server_version. */
export function reportedSetting(client: pg.Client, name: string): string | undefined {
  return startupSettings.get(client)?.get(name);
}

/**
 * A pg error as one redacted line, with the SQLSTATE when there is one. A host that stopped
 * answering is described without its name: whoever reports a query's failure names its host.
 */
export function describePgError(error: unknown): string {
  if (error instanceof HostError && error.code === HOST_SILENT) return redact(error.reason);
  if (error instanceof Error) {
    const code = (error as { code?: string | number }).code;
    const detail = (error as { detail?: unknown }).detail;
    const text =
      error.message.length > 0
        ? error.message
        : error instanceof AggregateError
          ? error.errors.map((e) => (e instanceof Error ? e.message : String(e))).join('; ')
          : String(code ?? error.name);
    const suffix = isSqlState(code)
      ? ` (SQLSTATE ${code})`
      : (error as { code?: unknown }).code === 'ECONNREFUSED'
        ? ' (nothing accepts connections there: the server is down or restarting, or the address is wrong)'
        : isLostConnection(error, { worded: true })
          ? ' (the connection was lost: the server stopped or restarted, or the network dropped it)'
          : '';
    const detailText = typeof detail === 'string' && detail.length > 0 ? `; ${detail}` : '';
    return redact(`${text}${detailText}${suffix}`);
  }
  return redact(String(error));
}

/** Runs fn with a connection to host, closing it afterwards whatever happens. */
export async function withHost<T>(
  host: HostConfig,
  fn: (client: pg.Client) => Promise<T>,
  options?: ConnectOptions,
): Promise<T> {
  const client = await connectHost(host, options);
  try {
    // With a signal, fn's work too ends at once when it aborts (its socket destroyed).
    return await untilAborted(client, options?.signal, () => fn(client));
  } finally {
    await endQuietly(client);
  }
}
