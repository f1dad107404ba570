/**
 * A TCP proxy in front of a PostgreSQL host, as PgBouncer, HAProxy, a cloud load balancer or
 * docker-proxy put in production: when a client goes away, the proxy closes its side to the server
 * only `lingerMs` later, so the server session (and any advisory lock it holds) outlives the client
 * for that long.
 */
import net from 'node:net';

export interface TcpProxy {
  /** The URL with host and port replaced by the proxy's. */
  readonly url: string;
  readonly port: number;
  close(): Promise<void>;
}

export async function startTcpProxy(targetUrl: string, options: { lingerMs?: number } = {}): Promise<TcpProxy> {
  const target = new URL(targetUrl);
  const lingerMs = options.lingerMs ?? 0;
  const sockets = new Set<net.Socket>();
  const timers = new Set<NodeJS.Timeout>();
  const server = net.createServer((client) => {
    const upstream = net.connect({ host: target.hostname, port: Number(target.port || 5432) });
    sockets.add(client).add(upstream);
    client.pipe(upstream, { end: false });
    upstream.pipe(client);
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
    close: async () => {
      for (const timer of timers) clearTimeout(timer);
      for (const socket of sockets) socket.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
