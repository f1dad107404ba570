import pg from 'pg';
import type { HostConfig } from '../config/types.js';
import { ASYNC_COMMIT_SQL } from '../fleet/control.js';
import { openWorker } from '../fleet/session.js';
import { endQuietly } from '../pg/quiet.js';
import { awaitedLater } from '../promises.js';
import type { MoveContext, Side } from './context.js';

/**
 * The worker connections a move spreads its work over (creating the target shards, copying).
 */

export function concurrency(ctx: Pick<MoveContext, 'config' | 'options'>, items: number): number {
  return Math.max(1, Math.min(ctx.options.concurrency ?? ctx.config.concurrency, items));
}

/** The application names of a move's worker connections: what each is for, in pg_stat_activity. */
export const CREATE_WORKER = 'shardctl move worker';
export const COPY_WORKER = 'shardctl move copy';
export const CLEANUP_WORKER = 'shardctl move clean-up';

/** The clean-up's renames (or drops) sent per round trip (move.ts): each a small transaction of its own. */
export const CLEANUP_CHUNK = 16;

/**
 * Worker connections opened ahead of the work that takes them: a new move's creation workers,
 * connected while its preflight runs (run.ts), so that the creation starts without waiting for its
 * connections. Each is recorded as a worker like any other (openWorker), so they are opened
 * once the runner locks are held. One that failed to open is opened again by the work that takes
 * it, which reports the failure; those not taken are closed with the move's sessions.
 */
export class Spares {
  readonly #opening = new Map<string, Promise<pg.Client>[]>();
  /** Ends the spares still connecting when the move closes them (a host that stopped answering). */
  readonly #closing = new AbortController();

  open(host: HostConfig, applicationName: string, count: number): void {
    const key = spareKey(host, applicationName);
    // A failure is seen where the spare is taken (or closed).
    const list = Array.from({ length: count }, () =>
      awaitedLater(openWorker(host, applicationName, this.#closing.signal)),
    );
    this.#opening.set(key, [...(this.#opening.get(key) ?? []), ...list]);
  }

  /**
   * A spare connection to `host` for this use, else a new one. A spare that no longer answers (the
   * server ended it while it waited: idle_session_timeout, a restart) is closed and replaced.
   */
  async take(host: HostConfig, applicationName: string): Promise<pg.Client> {
    const spare = this.#opening.get(spareKey(host, applicationName))?.shift();
    const client = spare ? await spare.catch(() => null) : null;
    if (client && (await answers(client))) return client;
    if (client) await endQuietly(client);
    return openWorker(host, applicationName);
  }

  /** Closes the spares never taken; those still connecting (or registering) are ended at once, not waited for. */
  async close(): Promise<void> {
    const left = [...this.#opening.values()].flat();
    this.#opening.clear();
    this.#closing.abort();
    await Promise.all(left.map((opening) => opening.then(endQuietly, () => undefined)));
  }
}

/** Whether a connection still runs a statement. */
async function answers(client: pg.Client): Promise<boolean> {
  try {
    await client.query('SELECT 1');
    return true;
  } catch {
    return false;
  }
}

function spareKey(host: HostConfig, applicationName: string): string {
  return `${host.name}\0${applicationName}`;
}

/** A worker connection for the move: a spare opened ahead if there is one (Spares), else a new one. */
export function moveWorker(ctx: MoveContext, host: HostConfig, applicationName: string): Promise<pg.Client> {
  return ctx.spares ? ctx.spares.take(host, applicationName) : openWorker(host, applicationName);
}

/**
 * The target's copies are built by the migrations that built the source's, whose function bodies
 * were checked there: not checked again (as pg_dump's restores do), which spares the creation the
 * parsing of every shard's next_id bodies, an eighth of its time.
 */
const NO_BODY_CHECKS_SQL = 'SET check_function_bodies = off';

/** A creating worker's own session settings: set when it opens, and again after each migration's reset (sessionResetSql). */
export const CREATE_WORKER_SESSION_SQL = `${ASYNC_COMMIT_SQL}; ${NO_BODY_CHECKS_SQL}`;

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
        const client = await moveWorker(this.#ctx, this.#side.host, CREATE_WORKER);
        this.#clients.push(client);
        await client.query(CREATE_WORKER_SESSION_SQL);
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
