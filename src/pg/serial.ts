import { AsyncLocalStorage } from 'node:async_hooks';
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
  const turn = <T>(fn: () => Promise<T>): Promise<T> => {
    const result = last.then(fn);
    // The next query waits for this one to end, whatever its outcome; the caller sees the outcome.
    last = result.catch(() => undefined);
    return result;
  };
  const inTurn = (...args: unknown[]): unknown => {
    const first = args[0] as { submit?: unknown } | null | undefined;
    if (typeof first?.submit === 'function' || typeof args.at(-1) === 'function') return run(...args);
    // A query of the turn that holds the session goes at once (inOneTurn).
    if (holding(client)) return run(...args);
    return turn(() => run(...args) as Promise<unknown>);
  };
  (client as unknown as { query: typeof inTurn }).query = inTurn;
  (client as unknown as Turns)[TURN] = (fn) =>
    turn(async () => {
      const held: Held = { client, open: true };
      try {
        return await turns.run([...(turns.getStore() ?? []), held], fn);
      } finally {
        held.open = false;
      }
    });
}

const TURN = Symbol('shardctl.turn');

interface Held {
  readonly client: object;
  open: boolean;
}

/** The sessions the running code holds a turn of (inOneTurn), across its awaits. */
const turns = new AsyncLocalStorage<readonly Held[]>();

function holding(client: object): boolean {
  return turns.getStore()?.some((h) => h.client === client && h.open) ?? false;
}

interface Turns {
  [TURN]?: <T>(fn: () => Promise<T>) => Promise<T>;
}

/**
 * `fn` with the session to itself: the queries fn makes on `client` (itself, or through what it
 * calls) go one after another, and the queries of the session's other callers wait until fn is
 * done. A transaction on a session that other parts of a command use at the same time needs it:
 * one that fails stays aborted until its ROLLBACK, and a query another caller queued meanwhile
 * would run first and fail with 25P02 (seen: a move's copy behind its early subscription, whose
 * lock wait ran out); one of several statements would take another caller's query into it. A
 * client that keeps no queue (not serializeQueries's) is used as it is. What fn starts without
 * awaiting it (a timer, a background read) and that queries the same session while fn runs counts as
 * fn's own: start such work outside the turn.
 */
export function inOneTurn<T>(client: object, fn: () => Promise<T>): Promise<T> {
  const turn = (client as Turns)[TURN];
  return turn && !holding(client) ? turn(fn) : fn();
}
