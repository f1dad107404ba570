import type pg from 'pg';
import { cancelRequest } from '../pg/cancel.js';
import { whyEnded } from '../pg/ended.js';

/**
 * The one path every routed round trip takes on a pooled connection (pg-pool's own `pool.query`
 * shape): check a connection out, run the work, end a transaction the work left open when it asks,
 * and give the connection back, or destroy it when its state is unknown (a BEGIN, COMMIT or
 * ROLLBACK that failed, a connection lost, any error the work threw): a connection in an unknown
 * state must not serve the next call.
 */
export class Lease {
  private failure: Error | undefined;

  constructor(readonly client: pg.PoolClient) {}

  /**
   * What `error` (thrown by a query on this connection) comes from: the error with which the server
   * ended the connection meanwhile (src/pg/ended.ts: say, its idle-in-transaction timeout), when the
   * query's own error only says that the connection can no longer be used; `error` itself otherwise.
   */
  explain(error: unknown): unknown {
    const ended = whyEnded(this.client);
    if (!ended || !(error instanceof Error) || (error as { code?: unknown }).code !== undefined) return error;
    return ended;
  }

  /** The connection's state is unknown: it is destroyed when released, not reused. */
  broken(error: unknown): void {
    this.failure ??= error instanceof Error ? error : new Error(String(error));
  }

  /**
   * Whether a query is still running or queued on the connection (fn gave up on it: its own timeout,
   * an abort). Read from pg's internals; false when they are not there (the caller then waits, as
   * it did before).
   */
  inFlight(): boolean {
    const internals = this.client as unknown as { _getActiveQuery?: () => unknown; _queryQueue?: unknown[] };
    if (typeof internals._getActiveQuery !== 'function') return false;
    return internals._getActiveQuery() != null || (internals._queryQueue?.length ?? 0) > 0;
  }

  /**
   * The work ended while its query still runs: the server is asked to cancel it (a cancel request,
   * as psql's Ctrl-C), and the connection is destroyed rather than rolled back behind that query
   * (the server rolls the transaction back when it goes). Never reused: a cancel that arrives late
   * can reach nothing but this connection's own server session.
   */
  async abandon(reason: unknown): Promise<void> {
    this.broken(reason);
    await cancelRequest(this.client);
  }

  /**
   * Ends the transaction of work that failed: rolled back, once what fn left running is done (a
   * query queued behind the one that failed ends at once in the aborted transaction); when a query
   * still runs after DRAIN_WAIT_MS (fn gave up on it), abandoned instead of waited for.
   */
  async rollbackAfterFailure(reason: unknown): Promise<void> {
    if (this.inFlight() && !(await drained(this.client, DRAIN_WAIT_MS)) && this.inFlight()) {
      await this.abandon(reason);
      return;
    }
    await this.rollback();
  }

  /** Ends the transaction the work left open; a connection where even that fails is broken. */
  async rollback(): Promise<void> {
    await this.client.query('ROLLBACK').catch((error: Error) => this.broken(error));
  }

  /** Gives the connection back to its pool (destroyed when broken). Called once, by withConnection. */
  release(): void {
    this.client.release(this.failure);
  }
}

/** How long a failed call waits for what fn left running on its connection before abandoning it. */
const DRAIN_WAIT_MS = 100;

/** Whether `client` ran out of queries (pg's 'drain') within `ms`. */
function drained(client: pg.PoolClient, ms: number): Promise<boolean> {
  return new Promise((resolve) => {
    const done = (value: boolean): void => {
      clearTimeout(timer);
      client.off('drain', onDrain);
      resolve(value);
    };
    const onDrain = (): void => done(true);
    const timer = setTimeout(() => done(false), ms);
    client.once('drain', onDrain);
  });
}

/** Releases the lease, then settles with `outcome`; a release that throws rejects with its error instead. */
function settleAfterRelease<V>(
  lease: Lease,
  settle: (outcome: V) => void,
  outcome: V,
  reject: (error: unknown) => void,
): void {
  try {
    lease.release();
  } catch (error) {
    reject(error);
    return;
  }
  settle(outcome);
}

/**
 * Checks out a connection (`checkout`, which names the host when it fails), runs `work` on it and
 * releases it: destroyed when `work` threw or marked it broken, back to the pool otherwise. Not an
 * async function: every routed call takes this path, and each async layer costs a promise and
 * microtask turns.
 */
export function withConnection<T>(
  checkout: () => Promise<pg.PoolClient>,
  work: (lease: Lease) => Promise<T>,
): Promise<T> {
  let checkingOut: Promise<pg.PoolClient>;
  try {
    checkingOut = checkout();
  } catch (error) {
    return Promise.reject(error as Error);
  }
  // One promise, settled from the callbacks: a `then` that returned work's chain would make the
  // caller's promise adopt it, two more microtask turns on every routed call.
  return new Promise<T>((resolve, reject) => {
    checkingOut.then((client) => {
      const lease = new Lease(client);
      const failed = (error: unknown): void => {
        lease.broken(error);
        settleAfterRelease(lease, reject, error, reject);
      };
      let working: Promise<T>;
      try {
        working = work(lease);
      } catch (error) {
        failed(error);
        return;
      }
      working.then((value) => settleAfterRelease(lease, resolve, value, reject), failed);
    }, reject);
  });
}
