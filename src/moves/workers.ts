import pg from 'pg';
import { ASYNC_COMMIT_SQL, DURABLE_FLUSH_SQL } from '../fleet/control.js';
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
 * Runs fn over items with `workers` worker connections to `host`, each item on one of them. The
 * workers commit without waiting for the WAL flush; one durable commit at the end covers them all
 * (DURABLE_FLUSH_SQL), before the caller records its step.
 */
export async function withWorkers<T>(
  ctx: MoveContext,
  side: Side,
  items: readonly T[],
  fn: (client: pg.Client, item: T) => Promise<void>,
): Promise<void> {
  let next = 0;
  let failed: unknown = null;
  const worker = async (): Promise<void> => {
    const client = await openWorker(side.host, 'shardctl move worker');
    try {
      await client.query(ASYNC_COMMIT_SQL);
      while (failed === null && next < items.length) await fn(client, items[next++]!);
    } catch (error) {
      failed ??= error;
    } finally {
      // A worker whose connection broke is closed already; `failed` keeps the error that matters.
      await endQuietly(client);
    }
  };
  await Promise.all(Array.from({ length: concurrency(ctx, items.length) }, worker));
  // eslint-disable-next-line @typescript-eslint/only-throw-error -- the first error a worker caught, rethrown as caught
  if (failed !== null) throw failed;
  if (items.length > 0) await side.client.query(DURABLE_FLUSH_SQL);
}
