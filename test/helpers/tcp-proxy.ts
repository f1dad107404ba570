/**
 * A TCP proxy in front of a PostgreSQL host, as PgBouncer, HAProxy, a cloud load balancer or
 * docker-proxy put in production: when a client goes away, the proxy closes its side to the server
 * only `lingerMs` later, so the server session (and any advisory lock it holds) outlives the client
 * for that long.
 *
 * It can also play a host that stops answering without closing anything (a hung server, a
 * black-holed route): `silence()` swallows every byte from then on, both ways, on open connections
 * and new ones; `silence('after-handshake')` lets each new connection finish its start-up (up to the
 * server's first ReadyForQuery) and then swallows; `silenceAfter(n)` does the latter by itself once
 * n more bytes have gone from clients to the server (mid-COPY, say).
 *
 * `refuse()` plays a server restarting: every new connection is closed at once (the client hears
 * "terminated" in a few ms), open ones go on.
 *
 * `stallEstablished()` plays a path that lost its open flows while the host is fine (a NAT gateway
 * or firewall that dropped an idle flow, a pooler that lost a server connection): the connections
 * open at that moment pass no byte any more, either way, while new connections work normally.
 */
import net from 'node:net';
import { afterAll, afterEach, beforeAll } from 'vitest';
import { init } from '../../src/commands/init.js';
import { type Fleet, makeFleet } from './fleet.js';
import { type TestDatabases, useTestDatabases } from './hosts.js';

export type Silence = 'forward' | 'all' | 'after-handshake';

export interface TcpProxy {
  /** The URL with host and port replaced by the proxy's. */
  readonly url: string;
  readonly port: number;
  /** Stop answering: swallow everything ('all'), or everything after each connection's start-up. */
  silence(mode?: Exclude<Silence, 'forward'>): void;
  /** silence('after-handshake') once `bytes` more bytes have gone from clients to the server. */
  silenceAfter(bytes: number): void;
  /** The connections open now pass nothing from now on (for ever); new ones are not affected. */
  stallEstablished(): void;
  /** stallEstablished() once `bytes` more bytes have gone from clients to the server (that chunk still passes). */
  stallEstablishedAfter(bytes: number): void;
  /** Close every new connection at once (until resume()); open ones are not affected. */
  refuse(): void;
  /** Forward again (bytes swallowed meanwhile are lost). */
  resume(): void;
  /** Bytes forwarded from clients to the server so far. */
  readonly bytesUp: number;
  /** Connections accepted so far (refused ones included). */
  readonly connections: number;
  close(): Promise<void>;
}

export interface TcpProxyOptions {
  lingerMs?: number;
}

const READY_FOR_QUERY = 0x5a; // 'Z'

export async function startTcpProxy(targetUrl: string, options: TcpProxyOptions = {}): Promise<TcpProxy> {
  const target = new URL(targetUrl);
  const lingerMs = options.lingerMs ?? 0;
  const sockets = new Set<net.Socket>();
  const timers = new Set<NodeJS.Timeout>();
  let mode: Silence = 'forward';
  let refusing = false;
  let bytesUp = 0;
  let connections = 0;
  let silenceAt: number | undefined;
  const stallers = new Set<() => void>();
  let stallAt: number | undefined;
  const stallAll = (): void => {
    for (const stall of stallers) stall();
    stallers.clear();
  };
  const server = net.createServer((client) => {
    connections += 1;
    if (refusing) {
      client.destroy();
      return;
    }
    const upstream = net.connect({ host: target.hostname, port: Number(target.port || 5432) });
    sockets.add(client).add(upstream);
    // Until the server's first ReadyForQuery, the connection is starting up.
    let started = false;
    let pending = Buffer.alloc(0);
    let stalled = false;
    // A connection still starting up is a new one: it goes on working (only established flows are lost).
    const stall = (): void => {
      if (started) stalled = true;
    };
    stallers.add(stall);
    client.once('close', () => stallers.delete(stall));
    const swallowing = (): boolean => stalled || mode === 'all' || (mode === 'after-handshake' && started);

    client.on('data', (chunk: Buffer) => {
      if (swallowing()) return;
      upstream.write(chunk);
      bytesUp += chunk.length;
      if (stallAt !== undefined && bytesUp >= stallAt) {
        stallAt = undefined;
        stallAll();
      }
      if (silenceAt !== undefined && bytesUp >= silenceAt) {
        silenceAt = undefined;
        mode = 'after-handshake';
      }
    });
    upstream.on('data', (chunk: Buffer) => {
      if (swallowing()) return;
      if (started) {
        client.write(chunk);
        return;
      }
      // Finds the end of the first ReadyForQuery, so that exactly the start-up is let through.
      pending = Buffer.concat([pending, chunk]);
      let offset = 0;
      let end = -1;
      while (pending.length - offset >= 5) {
        const length = pending.readInt32BE(offset + 1);
        if (pending.length - offset < 1 + length) break;
        if (pending[offset] === READY_FOR_QUERY) {
          end = offset + 1 + length;
          break;
        }
        offset += 1 + length;
      }
      if (end === -1) {
        client.write(chunk);
        return;
      }
      const already = pending.length - chunk.length;
      client.write(chunk.subarray(0, end - already));
      started = true;
      pending = Buffer.alloc(0);
      if (!swallowing()) client.write(chunk.subarray(end - already));
    });
    const closeUpstream = (): void => {
      const timer = setTimeout(() => {
        timers.delete(timer);
        upstream.destroy();
      }, lingerMs);
      timers.add(timer);
    };
    client.once('close', closeUpstream);
    upstream.once('close', () => client.destroy());
    for (const socket of [client, upstream]) {
      socket.on('error', () => socket.destroy());
      socket.once('close', () => sockets.delete(socket));
    }
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => resolve());
  });
  const port = (server.address() as net.AddressInfo).port;
  const url = new URL(targetUrl);
  url.hostname = '127.0.0.1';
  url.port = String(port);
  return {
    url: url.toString(),
    port,
    silence: (next = 'all') => {
      mode = next;
    },
    silenceAfter: (bytes) => {
      silenceAt = bytesUp + bytes;
    },
    stallEstablished: stallAll,
    stallEstablishedAfter: (bytes) => {
      stallAt = bytesUp + bytes;
    },
    refuse: () => {
      refusing = true;
    },
    resume: () => {
      refusing = false;
      mode = 'forward';
      silenceAt = undefined;
      stallAt = undefined;
    },
    get bytesUp() {
      return bytesUp;
    },
    get connections() {
      return connections;
    },
    close: async () => {
      for (const timer of timers) clearTimeout(timer);
      for (const socket of sockets) socket.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

/**
 * For a describe block: a two-host fleet of 8 shards, pg1 direct and pg2 through a TCP proxy
 * (replication reaches pg2 directly), `hostTimeout: 2s`, initialised before the tests; the proxy
 * passes bytes again after each test and is closed after the block.
 */
export function useProxiedFleet(): {
  readonly db: TestDatabases;
  readonly proxy: () => TcpProxy;
  readonly fleet: () => Fleet;
} {
  const db = useTestDatabases(2);
  let proxy: TcpProxy | undefined;
  let fleet: Fleet | undefined;
  beforeAll(async () => {
    proxy = await startTcpProxy(db.urls[1]!);
    fleet = makeFleet({
      urls: [db.urls[0]!, proxy.url],
      replicationUrls: [undefined, db.replicationUrls[1]],
      shards: 8,
      extra: 'hostTimeout: 2s',
    });
    // Set up with the default hostTimeout: connecting through the proxy on a loaded machine (a CI
    // run) can take longer than the 2 s the tests themselves are about.
    const config = await fleet.config();
    const result = await init({ ...config, hosts: config.hosts.map((h) => ({ ...h, timeoutMs: 10_000 })) });
    if (!result.ok) throw new Error('init of the proxied fleet failed');
  });
  afterEach(() => proxy?.resume());
  afterAll(async () => {
    await proxy?.close();
  });
  return { db, proxy: () => proxy!, fleet: () => fleet! };
}

/** How long run took, with its value. */
export async function timed<T>(run: () => Promise<T>): Promise<{ value: T; ms: number }> {
  const started = performance.now();
  const value = await run();
  return { value, ms: performance.now() - started };
}
