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
