import pg from 'pg';
import { ASYNC_COMMIT_SQL } from '../fleet/control.js';
import { openWorker } from '../fleet/session.js';
import { endQuietly } from '../pg/quiet.js';
import type { MoveContext, Side } from './context.js';

/**
 * The worker connections a move spreads its work over (creating the target shards, copying).
 */

export function concurrency(ctx: MoveContext, items: number): number {
  return Math.max(1, Math.min(ctx.options.concurrency ?? ctx.config.concurrency, items));
}

/**
 * Worker connections to one host, kept open over several batches of work (the target's copies are
 * created in chunks: createTargets), opened as a batch first needs them. They commit without waiting
 * for the WAL flush: the caller makes the work durable (DURABLE_FLUSH_SQL) before it records its step.
 */
export class Workers {
  readonly #ctx: MoveContext;
  readonly #side: Side;
  readonly #clients: pg.Client[] = [];

  constructor(ctx: MoveContext, side: Side) {
    this.#ctx = ctx;
    this.#side = side;
  }

  /** fn over items, each item on one of the connections; the first error, once all have stopped. */
  async run<T>(items: readonly T[], fn: (client: pg.Client, item: T) => Promise<void>): Promise<void> {
    if (items.length === 0) return;
    const wanted = concurrency(this.#ctx, items.length);
    const opened = await Promise.allSettled(
      Array.from({ length: Math.max(0, wanted - this.#clients.length) }, async () => {
        const client = await openWorker(this.#side.host, 'shardctl move worker');
        this.#clients.push(client);
        await client.query(ASYNC_COMMIT_SQL);
      }),
    );
    const refused = opened.find((o): o is PromiseRejectedResult => o.status === 'rejected');
    if (refused) throw refused.reason;
    let next = 0;
    let failed: unknown = null;
    await Promise.all(
      this.#clients.slice(0, wanted).map(async (client) => {
        try {
          while (failed === null && next < items.length) await fn(client, items[next++]!);
        } catch (error) {
          failed ??= error;
        }
      }),
    );
    // eslint-disable-next-line @typescript-eslint/only-throw-error -- the first error a worker caught, rethrown as caught
    if (failed !== null) throw failed;
  }

  /** A connection that broke is closed already. */
  async close(): Promise<void> {
    await Promise.all(this.#clients.splice(0).map((client) => endQuietly(client)));
  }
}
