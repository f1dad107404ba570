import type pg from 'pg';
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

  /** Ends the transaction the work left open; a connection where even that fails is broken. */
  async rollback(): Promise<void> {
    await this.client.query('ROLLBACK').catch((error: Error) => this.broken(error));
  }

  /** Gives the connection back to its pool (destroyed when broken). Called once, by withConnection. */
  release(): void {
    this.client.release(this.failure);
  }
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
  return checkingOut.then((client) => {
    const lease = new Lease(client);
    const failed = (error: unknown): never => {
      lease.broken(error);
      lease.release();
      throw error;
    };
    let working: Promise<T>;
    try {
      working = work(lease);
    } catch (error) {
      return failed(error);
    }
    return working.then((value) => {
      lease.release();
      return value;
    }, failed);
  });
}
