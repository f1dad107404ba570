/**
 * libpq's multi-host connection URLs, which node-postgres does not understand:
 *
 *   postgres://app:pw@db2a:5432,db2b:5433/app?target_session_attrs=read-write
 *
 * The addresses are tried in order and the first whose session has the attributes asked for is
 * used, as libpq does (PostgreSQL docs, 34.1.1.3 "Specifying Multiple Hosts"; target_session_attrs):
 *
 *   any             the first that accepts the connection
 *   read-write      transaction_read_only is off (a primary, not a hot standby, not a read-only server)
 *   read-only       transaction_read_only is on
 *   primary         pg_is_in_recovery() is false
 *   standby         pg_is_in_recovery() is true
 *   prefer-standby  a standby if any address is one, else any
 *
 * Unlike libpq, a URL of several addresses that does not say defaults to `read-write`, not `any`:
 * shardctl writes to a host, and a standby listed first must not take the writes' connections (a
 * URL of one address without the parameter is used as it is, unchecked, as before). The URL is kept
 * as written everywhere else (the config, the registry, a subscription's conninfo, which the
 * server's own libpq reads); only the connection made by shardctl goes to one address at a time,
 * each as a URL of its own with the same user, password, database and parameters.
 */
import { UsageError } from '../errors.js';
import { redactUrl } from './redact.js';

export const TARGET_SESSION_ATTRS = ['any', 'read-write', 'read-only', 'primary', 'standby', 'prefer-standby'] as const;
export type TargetSessionAttrs = (typeof TARGET_SESSION_ATTRS)[number];

/** The default for a URL of several addresses that does not say (see above). */
export const DEFAULT_MULTI_HOST_ATTRS: TargetSessionAttrs = 'read-write';

export interface PostgresUrl {
  /** 'postgres' or 'postgresql'. */
  readonly scheme: string;
  /** user[:password], as written (percent-encoded), or undefined. */
  readonly userinfo: string | undefined;
  /** host[:port] per address, in order; a host may be an IPv6 literal in brackets. */
  readonly addresses: readonly { readonly host: string; readonly port: string | undefined }[];
  /** '/database' or ''. */
  readonly path: string;
  /** The query string without target_session_attrs, with its '?' (or ''). */
  readonly query: string;
  /** What the URL asks for; undefined when it does not say. */
  readonly targetSessionAttrs: TargetSessionAttrs | undefined;
}

/** libpq's sslmode values, and node-postgres's own no-verify. */
const SSL_MODES: readonly string[] = ['disable', 'allow', 'prefer', 'require', 'verify-ca', 'verify-full', 'no-verify'];

const EXPECTED = 'expected postgres://user@host:5432/database, or host1:5432,host2:5432 for several';
const PASSWORD_HINT = "in a password, '#', '/', '?' and '@' must be percent-encoded as %23, %2F, %3F and %40";
const URL_SHAPE = /^(postgres(?:ql)?):\/\/(?:([^/?#]*)@)?([^@/?#]*)(\/[^?#]*)?(\?[^#]*)?(#.*)?$/i;
// A host name, an IPv4 address or an IPv6 literal in brackets; a port of digits.
const ADDRESS = /^(\[[0-9A-Fa-f:.%a-zA-Z]+\]|[^\s[\]:,]*)(?::(\d*))?$/;

/**
 * Parses a postgres:// URL of one or several addresses. Throws a UsageError naming `field` and the
 * URL (its password hidden) for anything libpq would refuse: another scheme, an empty address
 * between commas, a port that is not a number from 1 to 65535, an unknown target_session_attrs.
 */
export function parsePostgresUrl(url: string, field = 'url'): PostgresUrl {
  const fail = (reason: string): never => {
    throw new UsageError(reason, { input: field, value: redactUrl(url) });
  };
  // Whitespace inside: in a password libpq and node-postgres take it as it is, but no message could
  // show the URL without it (a password is hidden up to a space), so the URL is refused, never
  // shown. Around it (a newline a secret file or an environment variable ends with) it is ignored,
  // as URL parsing ignores it.
  if (/\s/.test(url.trim()))
    throw new UsageError('is not a valid URL (it holds whitespace; in a password write a space as %20)', {
      input: field,
    });
  const scheme = /^([a-z][a-z0-9+.-]*):/i.exec(url)?.[1];
  if (scheme !== undefined && !/^postgres(ql)?$/i.test(scheme)) fail('is not a postgres:// or postgresql:// URL');
  const match = URL_SHAPE.exec(url);
  if (!match) return fail(`is not a valid URL (${EXPECTED})`);
  const [, , userinfo, hostspec, path, rawQuery] = match as unknown as [
    string,
    string,
    string | undefined,
    string,
    string | undefined,
    string | undefined,
  ];
  // An '@' after the user information means a password was cut short: an unencoded '#', '/' or '?'
  // in it ends the user information early, and what follows (an address, a port, a database name)
  // may be part of the password. Refused before anything of it is shown or used.
  const afterUserinfo = url.slice(match[1]!.length + 3 + (userinfo !== undefined ? userinfo.length + 1 : 0));
  if (afterUserinfo.includes('@'))
    fail(`is not a valid URL (an '@' after the user information; ${PASSWORD_HINT}, and '@' anywhere else as %40)`);
  const addresses = hostspec.split(',').map((part, i, all) => {
    const address = ADDRESS.exec(part);
    const which = all.length > 1 ? `address ${i + 1} ` : '';
    if (!address) {
      // With an '@' in the URL the part may be a password cut short (an unencoded '#', '/' or '?'
      // in it ends the user information early): never shown.
      if (url.includes('@'))
        return fail(`is not a valid URL (${which || 'its address '}is not host[:port]; ${PASSWORD_HINT})`);
      return fail(`is not a valid URL (${which}${JSON.stringify(part)} is not host[:port])`);
    }
    const [, host = '', port] = address;
    if (host === '' && all.length > 1) return fail(`is not a valid URL (address ${i + 1} of ${all.length} is empty)`);
    if (port !== undefined && port !== '') {
      const n = Number(port);
      if (!Number.isInteger(n) || n < 1 || n > 65535)
        return fail(`is not a valid URL (${which}port ${JSON.stringify(port)} is not a number from 1 to 65535)`);
    }
    return { host, port: port === '' ? undefined : port };
  });
  const params = new URLSearchParams(rawQuery?.slice(1) ?? '');
  for (const value of params.getAll('sslmode')) {
    if (!SSL_MODES.includes(value))
      fail(`has sslmode=${JSON.stringify(value)}: must be one of ${SSL_MODES.join(', ')}`);
  }
  // A port given as a parameter (libpq's ?port=, a list for several addresses) is checked as one
  // in the address is: node-postgres would otherwise throw from inside its socket.
  for (const value of params.getAll('port')) {
    if (!value.split(',').every((p) => /^\d{1,5}$/.test(p) && Number(p) >= 1 && Number(p) <= 65535))
      fail(`has port=${JSON.stringify(value)}: each port must be a number from 1 to 65535`);
  }
  const attrsValues = params.getAll('target_session_attrs');
  let targetSessionAttrs: TargetSessionAttrs | undefined;
  if (attrsValues.length > 1) fail('gives target_session_attrs more than once');
  if (attrsValues.length === 1) {
    const value = attrsValues[0]!;
    if (!(TARGET_SESSION_ATTRS as readonly string[]).includes(value))
      fail(`has target_session_attrs=${JSON.stringify(value)}: must be one of ${TARGET_SESSION_ATTRS.join(', ')}`);
    targetSessionAttrs = value as TargetSessionAttrs;
  }
  // The query string is kept as written, less target_session_attrs (node-postgres would pass an
  // unknown parameter on to the server as a startup setting).
  const kept = (rawQuery?.slice(1) ?? '')
    .split('&')
    .filter((pair) => pair !== '' && !/^target_session_attrs(=|$)/.test(pair));
  const parsed: PostgresUrl = {
    scheme: match[1]!.toLowerCase(),
    userinfo,
    addresses,
    path: path ?? '',
    query: kept.length > 0 ? `?${kept.join('&')}` : '',
    targetSessionAttrs,
  };
  // Each address must make a URL node-postgres reads (e.g. no space in a host name).
  for (const [i, single] of singleAddressUrls(parsed).entries()) {
    try {
      new URL(single);
    } catch {
      fail(`is not a valid URL (host ${JSON.stringify(parsed.addresses[i]!.host)}; ${EXPECTED})`);
    }
  }
  return parsed;
}

/** Whether `url` lists more than one address (a cheap test; parsePostgresUrl validates). */
export function isMultiHostUrl(url: string): boolean {
  const match = URL_SHAPE.exec(url);
  return match !== null && (match[3] ?? '').includes(',');
}

/** One URL per address, in order: what node-postgres connects to. */
export function singleAddressUrls(url: PostgresUrl): string[] {
  return url.addresses.map(
    (a) =>
      `${url.scheme}://${url.userinfo !== undefined ? `${url.userinfo}@` : ''}${a.host}${a.port !== undefined ? `:${a.port}` : ''}${url.path}${url.query}`,
  );
}

/** The URL written back, with `addresses` (e.g. another order) and its target_session_attrs. */
export function formatPostgresUrl(url: PostgresUrl, changes: Partial<Pick<PostgresUrl, 'userinfo'>> = {}): string {
  const userinfo = 'userinfo' in changes ? changes.userinfo : url.userinfo;
  const hosts = url.addresses.map((a) => `${a.host}${a.port !== undefined ? `:${a.port}` : ''}`).join(',');
  const attrs = url.targetSessionAttrs ? `target_session_attrs=${url.targetSessionAttrs}` : '';
  const query = attrs ? (url.query ? `${url.query}&${attrs}` : `?${attrs}`) : url.query;
  return `${url.scheme}://${userinfo !== undefined && userinfo !== '' ? `${userinfo}@` : ''}${hosts}${url.path}${query}`;
}

/** An address as people write it: host:port (the default port left out). */
export function addressLabel(address: { host: string; port: string | undefined }): string {
  return `${address.host || 'localhost'}${address.port !== undefined ? `:${address.port}` : ''}`;
}

/** What a connection to one address reported about itself. */
export interface SessionState {
  readonly inRecovery: boolean;
  readonly readOnly: boolean;
}

/** One round trip that tells both; answered by any server shardctl supports. */
export const SESSION_STATE_SQL = `SELECT pg_catalog.pg_is_in_recovery() AS in_recovery, pg_catalog.current_setting('transaction_read_only') = 'on' AS read_only`;

/** Whether a session in `state` will do for `attrs` (prefer-standby: in its first, standby-only pass). */
export function sessionMatches(attrs: TargetSessionAttrs, state: SessionState, pass: 'first' | 'last'): boolean {
  switch (attrs) {
    case 'any':
      return true;
    case 'read-write':
      return !state.readOnly;
    case 'read-only':
      return state.readOnly;
    case 'primary':
      return !state.inRecovery;
    case 'standby':
      return state.inRecovery;
    case 'prefer-standby':
      return pass === 'last' || state.inRecovery;
  }
}

/** Why a session does not do, in the words of the error listing every address's outcome. */
export function mismatchReason(attrs: TargetSessionAttrs, state: SessionState): string {
  const what = state.inRecovery ? 'a standby (in recovery)' : state.readOnly ? 'read-only' : 'a primary';
  return `is ${what}, not ${attrs}`;
}

/**
 * Tries each address in order (prefer-standby: standbys first, then any), as libpq does: `open`
 * connects to one address, `stateOf` reads its session state, `close` discards one that does not
 * do. Resolves with the first that does and its index; rejects with an AggregateError whose message
 * lists every address and why it was not taken.
 */
export async function connectFirstMatching<C>(
  url: PostgresUrl,
  attrs: TargetSessionAttrs,
  steps: {
    open: (singleUrl: string, index: number) => Promise<C>;
    stateOf: (client: C) => Promise<SessionState>;
    close: (client: C) => Promise<void>;
    describe: (error: unknown) => string;
  },
): Promise<{ client: C; index: number; url: string }> {
  const urls = singleAddressUrls(url);
  const outcomes = new Map<number, string>();
  const errors: unknown[] = [];
  // Standbys found in the first pass of prefer-standby are remembered: the last pass reconnects.
  for (const pass of attrs === 'prefer-standby' ? (['first', 'last'] as const) : (['last'] as const)) {
    for (const [index, single] of urls.entries()) {
      if (pass === 'last' && attrs === 'prefer-standby' && outcomes.get(index)?.startsWith('cannot')) continue;
      let client: C;
      try {
        client = await steps.open(single, index);
      } catch (error) {
        errors.push(error);
        outcomes.set(index, `cannot connect: ${steps.describe(error)}`);
        continue;
      }
      try {
        if (attrs === 'any') return { client, index, url: single };
        const state = await steps.stateOf(client);
        if (sessionMatches(attrs, state, pass)) return { client, index, url: single };
        outcomes.set(index, mismatchReason(attrs, state));
      } catch (error) {
        errors.push(error);
        outcomes.set(index, `cannot check it: ${steps.describe(error)}`);
      }
      await steps.close(client);
    }
  }
  const lines = url.addresses.map((a, i) => `${addressLabel(a)} ${outcomes.get(i) ?? 'not tried'}`);
  throw new AggregateError(
    errors,
    `no address is ${attrs === 'prefer-standby' || attrs === 'any' ? 'reachable' : attrs}: ${lines.join('; ')}`,
  );
}

/** The attributes a connection for `url` must have: the URL's, else read-write for several addresses, else any. */
export function attrsFor(url: PostgresUrl): TargetSessionAttrs {
  return url.targetSessionAttrs ?? (url.addresses.length > 1 ? DEFAULT_MULTI_HOST_ATTRS : 'any');
}

/**
 * A URL for the server's own libpq (a subscription's connection): libpq's default for several
 * addresses is `any`, which would take a standby listed first, where a logical replication slot
 * cannot be used; a URL of several addresses that does not say gets target_session_attrs=read-write,
 * as shardctl's own connections do. Any other URL is returned as written.
 */
export function forServerLibpq(url: string): string {
  if (!isMultiHostUrl(url)) return url;
  let parsed: PostgresUrl;
  try {
    parsed = parsePostgresUrl(url);
  } catch {
    return url;
  }
  return parsed.targetSessionAttrs
    ? url
    : formatPostgresUrl({ ...parsed, targetSessionAttrs: DEFAULT_MULTI_HOST_ATTRS });
}

/**
 * The server a URL reaches (its addresses and database, lower-cased; the port 5432 when unsaid), to
 * tell that two URLs with different credentials or options reach the same server; undefined for a
 * URL that names no address (a socket from the environment) or cannot be read, and, with
 * `requireDatabase`, for one that names no database (then the user's name, or PGDATABASE's).
 */
/**
 * One key per address of the URL (address and database, as serverKey): two URLs that share one
 * reach the same server and database whenever that address answers. Empty when serverKey would be
 * undefined.
 */
export function serverKeys(url: string, { requireDatabase = false } = {}): string[] {
  const whole = serverKey(url, { requireDatabase });
  if (whole === undefined) return [];
  const parsed = parsePostgresUrl(url);
  return parsed.addresses.map((a) => `${a.host.toLowerCase()}:${a.port ?? '5432'}${parsed.path}`);
}

export function serverKey(url: string, { requireDatabase = false } = {}): string | undefined {
  try {
    const parsed = parsePostgresUrl(url);
    if (parsed.addresses.length === 0 || parsed.addresses.some((a) => a.host === '')) return undefined;
    if (requireDatabase && (parsed.path === '' || parsed.path === '/')) return undefined;
    return `${parsed.addresses.map((a) => `${a.host.toLowerCase()}:${a.port ?? '5432'}`).join(',')}${parsed.path}`;
  } catch {
    return undefined;
  }
}

/**
 * A URL to reach `address` with the user, password and TLS parameters of `credentials` (a seed URL);
 * without them pg falls back to PGUSER, PGPASSWORD and ~/.pgpass, as psql does.
 */
export function withCredentials(address: string, credentials: string | undefined): string {
  if (!credentials) return address;
  if (isMultiHostUrl(address) || isMultiHostUrl(credentials)) {
    let from: PostgresUrl;
    let to: PostgresUrl;
    try {
      from = parsePostgresUrl(credentials);
      to = parsePostgresUrl(address);
    } catch {
      return address;
    }
    const fromParams = new URLSearchParams(from.query.slice(1));
    const params = new URLSearchParams(to.query.slice(1));
    for (const key of TLS_PARAMETERS) {
      const value = fromParams.get(key);
      if (value !== null) params.set(key, value);
    }
    const query = params.toString();
    return formatPostgresUrl({ ...to, userinfo: from.userinfo, query: query ? `?${query}` : '' });
  }
  let from: URL;
  let to: URL;
  try {
    from = new URL(credentials);
    to = new URL(address);
  } catch {
    return address;
  }
  to.username = from.username;
  to.password = from.password;
  // The seed's TLS parameters too, over the address's own: the application's seed is the trust
  // anchor, and a host it learned of is checked as strictly as the seed (README, TLS).
  for (const key of TLS_PARAMETERS) {
    const value = from.searchParams.get(key);
    if (value !== null) to.searchParams.set(key, value);
  }
  return to.toString();
}

/** The connection parameters of a seed that a registry address takes from it. */
const TLS_PARAMETERS = ['sslmode', 'sslrootcert', 'sslcert', 'sslkey', 'uselibpqcompat'] as const;
