import net from 'node:net';
import type pg from 'pg';

/** The protocol's CancelRequest code (1234 << 16 | 5678). */
const CANCEL_REQUEST_CODE = 80877102;

/** How long a cancel request may take to be delivered before it is given up. */
export const CANCEL_TIMEOUT_MS = 1_000;

/**
 * Asks the server that `client` is connected to to cancel the query its session runs: a
 * CancelRequest with the session's key (BackendKeyData) on a connection of its own to the same
 * address (the socket's peer: the address that answered among several, a pooler's), as libpq's
 * PQcancel does. Resolves once the server has closed that connection (it has then signalled the
 * session) or after `timeoutMs`; true when it was delivered. Never rejects.
 */
export function cancelRequest(client: pg.Client, timeoutMs = CANCEL_TIMEOUT_MS): Promise<boolean> {
  const { processID, secretKey } = client as unknown as { processID?: unknown; secretKey?: unknown };
  const stream = (client as unknown as { connection?: { stream?: net.Socket } }).connection?.stream;
  const params = (client as unknown as { connectionParameters?: { host?: unknown; port?: unknown } })
    .connectionParameters;
  if (typeof processID !== 'number' || typeof secretKey !== 'number') return Promise.resolve(false);
  const address: net.NetConnectOpts | undefined =
    stream?.remoteAddress !== undefined && stream.remotePort !== undefined
      ? { host: stream.remoteAddress, port: stream.remotePort }
      : typeof params?.host === 'string' && params.host.startsWith('/') && typeof params.port === 'number'
        ? { path: `${params.host}/.s.PGSQL.${params.port}` }
        : undefined;
  if (!address) return Promise.resolve(false);
  const packet = Buffer.alloc(16);
  packet.writeInt32BE(16, 0);
  packet.writeInt32BE(CANCEL_REQUEST_CODE, 4);
  packet.writeInt32BE(processID, 8);
  packet.writeInt32BE(secretKey, 12);
  return new Promise((resolve) => {
    let written = false;
    const socket = net.connect(address);
    const timer = setTimeout(() => socket.destroy(), timeoutMs);
    socket.once('connect', () => socket.write(packet, () => (written = true)));
    socket.on('error', () => undefined);
    socket.once('close', () => {
      clearTimeout(timer);
      resolve(written);
    });
  });
}
