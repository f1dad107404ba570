/** Why the server ended a connection, by connection (connectionEnded). */
const endedBy = new WeakMap<object, Error>();

/**
 * Records the error with which the server ended `client` (the client's 'error' event: a FATAL such
 * as an idle-in-transaction timeout, or the socket's end). A query made on it afterwards only hears
 * that the connection is not queryable; endedBy tells the caller why.
 */
export function connectionEnded(client: object, error: Error): void {
  if (!endedBy.has(client)) endedBy.set(client, error);
}

/** The error with which the server ended `client`, if it did. */
export function whyEnded(client: object): Error | undefined {
  return endedBy.get(client);
}

const SHUTDOWN_SQLSTATES = new Set(['57P01', '57P02', '57P03']);
const NETWORK_CODES = new Set(['ECONNREFUSED', 'ECONNRESET', 'EPIPE', 'ETIMEDOUT', 'EHOSTUNREACH', 'ENETUNREACH']);
/** What the pg driver says when the socket went away (or a query came after that). */
const DRIVER_LOSS = /Connection terminated|connection ended|Client has encountered a connection error|not queryable/i;

/**
 * A server error of severity ERROR: the statement failed and the session goes on. The server sends
 * some connection exceptions that way: a Bind with the wrong number of parameters is 08P01
 * (protocol_violation) as an ERROR, the connection fine; the ones that end it are FATAL.
 */
function sessionGoesOn(error: unknown): boolean {
  return (error as { severity?: unknown } | null)?.severity === 'ERROR';
}

/**
 * Whether a driver or server error says the connection went away: the server shut down (57P01-3),
 * a connection exception (08xxx) unless the server sent it as a plain ERROR, the network
 * (ECONNRESET, …), or the driver's own words for it.
 * `worded`: only the driver's and the network's, which do not say so in words a reader knows.
 */
export function isLostConnection(error: unknown, { worded = false }: { readonly worded?: boolean } = {}): boolean {
  const code = (error as { code?: unknown } | null)?.code;
  if (typeof code === 'string') {
    if (NETWORK_CODES.has(code)) return true;
    if (!worded && (SHUTDOWN_SQLSTATES.has(code) || (code.startsWith('08') && !sessionGoesOn(error)))) return true;
  }
  return DRIVER_LOSS.test(error instanceof Error ? error.message : '');
}
