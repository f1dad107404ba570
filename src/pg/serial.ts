import type pg from 'pg';

/**
 * Makes `client` run the queries it is given one after another by itself. node-postgres queues
 * calls made while a query runs, but deprecates that (a warning on stderr now, an error in pg 9);
 * shardctl starts independent reads of one session at once (the preflight, the clean-up, a move's
 * creation beside its copy), so each session keeps its own queue and hands node-postgres one query
 * at a time, in the order they were made. COPY streams (submittables) and callback calls are
 * passed through: their callers never overlap them with other queries.
 */
export function serializeQueries(client: pg.Client): void {
  const run = client.query.bind(client) as (...args: unknown[]) => unknown;
  let last: Promise<unknown> = Promise.resolve();
  const inTurn = (...args: unknown[]): unknown => {
    const first = args[0] as { submit?: unknown } | null | undefined;
    if (typeof first?.submit === 'function' || typeof args.at(-1) === 'function') return run(...args);
    const result = last.then(() => run(...args));
    // The next query waits for this one to end, whatever its outcome; the caller sees the outcome.
    last = result.catch(() => undefined);
    return result;
  };
  (client as unknown as { query: typeof inTurn }).query = inTurn;
}
