import type { QueryResult } from 'pg';
import { sleep } from '../clock.js';
import { inOneTurn } from './serial.js';

/**
 * The last word on a connection whose outcome is already decided: after a failure the caller
 * reports, or once its work is done. A ROLLBACK or a close that fails as well says only that the
 * connection is broken or gone (and a transaction or lock with it), which nobody could act on; its
 * error must not replace the failure or the result the caller goes on with. So it is dropped here,
 * in one place.
 */

/** ROLLBACK, ignoring its own failure (see above). */
export async function rollbackQuietly(client: { query(text: string): Promise<unknown> }): Promise<void> {
  await client.query('ROLLBACK').catch(() => undefined);
}

/** Closes a client or pool, ignoring its own failure (see above). */
export async function endQuietly(closable: { end(): Promise<void> }): Promise<void> {
  await closable.end().catch(() => undefined);
}

/**
 * Runs a string of statements (a BEGIN … COMMIT transaction, or several); on failure rolls back
 * (quietly), so the session stays usable, and rethrows. Both in one turn of the session
 * (inOneTurn): no other caller's query runs in between. Resolves to each statement's result.
 */
export async function runTransaction(
  client: { query(text: string): Promise<unknown> },
  sql: string,
): Promise<QueryResult[]> {
  return inOneTurn(client, async () => {
    try {
      return [(await client.query(sql)) as QueryResult | QueryResult[]].flat();
    } catch (error) {
      await rollbackQuietly(client);
      throw error;
    }
  });
}

/**
 * Runs `work` inside a transaction that `begin` (a text starting with BEGIN) opens, and commits it;
 * on failure rolls back (quietly) and rethrows. All in one turn of the session (inOneTurn): no
 * other caller's query runs inside the transaction. For work whose statements take parameters,
 * which runTransaction's one text cannot carry.
 */
export async function inTransaction<T>(
  client: { query(text: string): Promise<unknown> },
  begin: string,
  work: () => Promise<T>,
): Promise<T> {
  return inOneTurn(client, async () => {
    try {
      await client.query(begin);
      const value = await work();
      await client.query('COMMIT');
      return value;
    } catch (error) {
      await rollbackQuietly(client);
      throw error;
    }
  });
}

/** SQLSTATEs of a bounded lock wait that ran out: lock_timeout, and a deadlock this transaction lost. */
export const LOCK_WAIT_CODES: readonly string[] = ['55P03', '40P01'];

/**
 * Runs `attempt` until it succeeds, again after a short random pause while it fails with one of
 * `codes` (a bounded lock wait that ran out: the application went on, try again), until `deadline`
 * (a performance.now() reading); past it, or on any other error, throws that error.
 */
export async function retryLockWaits(
  attempt: () => Promise<unknown>,
  deadline: number,
  codes: readonly string[] = LOCK_WAIT_CODES,
): Promise<void> {
  await retryWhileBusy(async () => {
    try {
      await attempt();
      return undefined;
    } catch (error) {
      const code = (error as { code?: string }).code;
      if (code === undefined || !codes.includes(code) || performance.now() > deadline) throw error;
      return BUSY;
    }
  });
}

/** What an attempt of retryWhileBusy returns when a table was busy (a bounded lock wait ran out): try again. */
export const BUSY: unique symbol = Symbol('busy');

/**
 * The one loop that waits for busy tables: runs `attempt` (numbered from 1) until it returns
 * anything but BUSY, and returns that; after each BUSY, `busy(attempts, waitedMs)` runs (it may
 * throw to give up, or tell the user what it waits for), then a short random pause (10–50 ms, so
 * that retries do not fall into step with the application's transactions).
 */
export async function retryWhileBusy<T>(
  attempt: (n: number) => Promise<T | typeof BUSY>,
  busy: (attempts: number, waitedMs: number) => void | Promise<void> = () => undefined,
): Promise<T> {
  const started = performance.now();
  for (let n = 1; ; n += 1) {
    const result = await attempt(n);
    if (result !== BUSY) return result;
    await busy(n, performance.now() - started);
    await sleep(10 + Math.random() * 40);
  }
}
