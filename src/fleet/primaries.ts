/**
 * Which of a host's addresses answer as its primary: an old primary started again as a primary
 * after a failover (split brain) is found by asking every address what it is, not by taking the
 * first writable one as libpq does. Used by `status` and `map set-address` (which say TWO
 * PRIMARIES) and by the router, which refuses to pick one of two (src/router/failover.ts).
 */
import { randomBytes } from 'node:crypto';
import type pg from 'pg';
import type { HostConfig } from '../config/types.js';
import { HostError } from '../errors.js';
import {
  addressLabel,
  attrsFor,
  formatPostgresUrl,
  parsePostgresUrl,
  withCredentials,
  type PostgresUrl,
} from '../pg/multihost.js';
import { isSqlState } from '../pg/sqlstate.js';
import { connectedAddress, describePgError, parsedHostUrl, withHost } from './connect.js';
import { readFleetRow, readTopology } from './topology.js';

/** The code of the error of a host two of whose addresses answer as its writable primary. */
export const TWO_PRIMARIES = 'TWO_PRIMARIES';

/** How long an address is waited for (usually a primary that is down, or a standby). */
export const ADDRESS_PROBE_WAIT_MS = 2_000;

/** Who asks: the application_name of the probes' sessions. */
export interface ProbeOptions {
  readonly applicationName: string;
}

/** What one address of a host says it is: its fleet record and whether it is in recovery; null when it did not answer. */
export interface AddressProbe {
  readonly address: string;
  /** The URL it was reached by (that address alone, with the host's credentials). */
  readonly url: string;
  readonly seen: { readonly fleet: Awaited<ReturnType<typeof readFleetRow>>; readonly inRecovery: boolean } | null;
  /** A server answered there but refused the host's credentials or database (an error with a SQLSTATE). */
  readonly refused?: string;
}

/**
 * Each address of `urls` (with `host`'s credentials) but those in `except`, connected to on its own
 * and asked what it is, waited for ADDRESS_PROBE_WAIT_MS at most.
 */
export async function probeAddresses(
  host: HostConfig,
  urls: readonly (string | null | undefined)[],
  except: ReadonlySet<string>,
  { applicationName }: ProbeOptions,
): Promise<AddressProbe[]> {
  const candidates = new Map<string, string>();
  for (const url of urls) {
    if (!url) continue;
    let parsed;
    try {
      parsed = parsePostgresUrl(withCredentials(url, host.url));
    } catch {
      continue;
    }
    for (const address of parsed.addresses)
      if (!except.has(addressKey(address)) && !candidates.has(addressKey(address)))
        candidates.set(
          addressKey(address),
          formatPostgresUrl({ ...parsed, addresses: [address], targetSessionAttrs: undefined }),
        );
  }
  return Promise.all(
    [...candidates].map(async ([address, url]) => {
      const probe: HostConfig = { ...host, url, timeoutMs: Math.min(host.timeoutMs, ADDRESS_PROBE_WAIT_MS) };
      let refused: string | undefined;
      const seen = await withHost(
        probe,
        async (client) => ({ fleet: await readFleetRow(client), inRecovery: (await readTopology(client)).inRecovery }),
        { applicationName },
      ).catch((error: unknown) => {
        const cause = error instanceof Error && error.cause !== undefined ? error.cause : error;
        // Its credentials refused (28xxx) or its database missing (3D000); not a server starting or
        // shutting down (57P03), which may be the host's standby.
        const code = (cause as { code?: unknown } | null)?.code;
        if (isSqlState(code) && (code.startsWith('28') || code === '3D000')) refused = describePgError(cause);
        return null;
      });
      return { address, url, seen, ...(refused !== undefined ? { refused } : {}) };
    }),
  );
}

/** An address as `host:port` (lower case, 5432 when unsaid): how addresses are compared. */
export function addressKey(a: { host: string; port: string | undefined }): string {
  return `${a.host.toLowerCase()}:${a.port ?? '5432'}`;
}

/**
 * The probed addresses that answer as a writable primary of this host of this fleet on another
 * server than `host`'s url reaches: the same server under another address (a pooler put in front of
 * it, a DNS name for an IP) is no second primary.
 */
export async function otherServersWritableAs(
  host: HostConfig,
  probes: readonly AddressProbe[],
  fleet: { readonly fleetId: string; readonly hostName: string },
  options: ProbeOptions,
): Promise<string[]> {
  const writable = probes.filter(
    ({ seen }) =>
      seen !== null &&
      !seen.inRecovery &&
      seen.fleet?.fleetId === fleet.fleetId &&
      seen.fleet.hostName === fleet.hostName,
  );
  const same = await Promise.all(writable.map((p) => sameServer(host, p.url, host.url, options)));
  return writable.filter((_, i) => !same[i]).map((p) => p.address);
}

/**
 * The other addresses of `host`'s url (a primary and its standbys, in libpq's syntax) that answer
 * as a writable primary of the same host of the same fleet, on another server than the one
 * `connected` names (host:port, the address the url reached), and but those in `skip` (host:port):
 * an old primary started again as a primary after a failover, which clients that try it first
 * (libpq's order) write to. Split brain: status and map set-address say TWO PRIMARIES, the router
 * refuses the host's calls. Each address waited for ADDRESS_PROBE_WAIT_MS at most.
 */
export async function otherWritablePrimaries(
  host: HostConfig,
  connected: string | null,
  fleet: { readonly fleetId: string; readonly hostName: string },
  options: ProbeOptions & { readonly skip?: readonly string[] },
): Promise<string[]> {
  if (parsePostgresUrl(host.url).addresses.length < 2) return [];
  const except = new Set([...(connected ? [connected] : []), ...(options.skip ?? [])].map((a) => a.toLowerCase()));
  const probes = await probeAddresses(host, [host.url], except, options);
  return otherServersWritableAs(host, probes, fleet, options);
}

/**
 * Whether `earlierUrl` and `currentUrl` reach one server: a session opened by the first, under a
 * name of its own, is seen in pg_stat_activity by the second (the same role sees its own sessions;
 * through a pooler the second's server process is the same server's). False when either does not answer.
 */
async function sameServer(
  host: HostConfig,
  earlierUrl: string,
  currentUrl: string,
  { applicationName }: ProbeOptions,
): Promise<boolean> {
  // Fixed and short: application_name is cut at 63 bytes, and a cut name would never be seen.
  const mark = `shardctl ${randomBytes(8).toString('hex')}`;
  const timeoutMs = Math.min(host.timeoutMs, ADDRESS_PROBE_WAIT_MS);
  return withHost(
    { ...host, url: earlierUrl, timeoutMs },
    () =>
      withHost(
        { ...host, url: currentUrl, timeoutMs },
        async (client) =>
          (
            await client.query<{ seen: boolean }>(
              'SELECT EXISTS (SELECT FROM pg_catalog.pg_stat_activity WHERE application_name = $1) AS seen',
              [mark],
            )
          ).rows[0]!.seen,
        { applicationName },
      ),
    { applicationName: mark },
  ).catch(() => false);
}

/**
 * For a server found as `host`'s primary at address `index` of `url` (a URL of several addresses,
 * asking for read-write or primary), whose control schema records `fleet`: the addresses after it
 * that answer as a writable primary of the same host of the same fleet on another server. Those
 * before it were just tried (libpq's order) and did not answer as one. Each waited for
 * ADDRESS_PROBE_WAIT_MS at most.
 */
export async function primariesBeside(
  host: HostConfig,
  url: PostgresUrl,
  index: number,
  fleet: { readonly fleetId: string; readonly hostName: string },
  options: ProbeOptions,
): Promise<string[]> {
  const attrs = attrsFor(url);
  if (url.addresses.length < 2 || (attrs !== 'read-write' && attrs !== 'primary')) return [];
  return otherWritablePrimaries({ ...host, url: formatPostgresUrl(url) }, addressKey(url.addresses[index]!), fleet, {
    ...options,
    skip: url.addresses.slice(0, index).map(addressKey),
  });
}

/** TWO_PRIMARIES: `others` answer as `host`'s writable primary beside address `index` of `url`; `what` follows. */
export function twoPrimariesError(
  host: HostConfig,
  url: PostgresUrl,
  index: number,
  others: readonly string[],
  what: string,
): HostError {
  return new HostError(
    host.name,
    `TWO PRIMARIES: ${others.join(', ')} also ${others.length === 1 ? 'answers' : 'answer'} as a writable primary of ${host.name} beside ${addressLabel(url.addresses[index]!)} (an old primary started again as a primary after a failover?); ${what}`,
    { code: TWO_PRIMARIES },
  );
}

/**
 * For a command about to write on `host` through `client` (connected by its url, src/fleet/connect.ts):
 * refused with TWO_PRIMARIES when another address of a url of several answers as the host's writable
 * primary too (primariesBeside); the command would write to one of two servers, apart from the other.
 */
export async function refuseSecondPrimary(host: HostConfig, client: pg.Client, options: ProbeOptions): Promise<void> {
  const url = parsedHostUrl(host);
  if (url.addresses.length < 2) return;
  const connected = connectedAddress(client);
  const index = url.addresses.findIndex((a) => addressLabel(a) === connected);
  if (index < 0) return;
  const fleet = await readFleetRow(client).catch(() => null);
  if (!fleet) return;
  const others = await primariesBeside(host, url, index, fleet, options);
  if (others.length > 0)
    throw twoPrimariesError(
      host,
      url,
      index,
      others,
      'nothing was written; stop one of them or make it a standby of the other (shardctl status names them)',
    );
}
