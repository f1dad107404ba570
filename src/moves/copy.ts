import { setTimeout as delay } from 'node:timers/promises';
import pg from 'pg';
import { HostError, resumeOrAbort, ShardctlError } from '../errors.js';
import { checkClientConnection, connectedUrl, describePgError } from '../fleet/connect.js';
import { hostClientSettings, watchSilence } from '../fleet/silence.js';
import { XID_HOLDERS_SQL } from './sql/locks.js';
import { BACKEND_PID_SQL, TERMINATE_BACKEND_SQL } from './sql/session.js';
import { type MoveContext, notice } from './context.js';
import { dropMoveSlot, publish, subscribeEarly } from './replication.js';
import { createMoveSlotCommand } from './sql/failover.js';
import { endQuietly } from '../pg/quiet.js';
import { awaitedLater } from '../promises.js';
import { libpqCompatible } from '../pg/tls.js';
import { SLOT_WAL_BOUND } from './wal-guard.js';
import { startCopyLogs } from './copy-logs.js';
import { createTargets } from './targets.js';
import { copyShards } from './table-copy.js';

/**
 * The copy of a move: the target's schemas at the source's migration level, then every table of
 * every shard copied, online from the slot's exported snapshot, offline with writes fenced.
 */

/**
 * Online: the target's copies created and filled in one pass. The copy (publication, slot, then
 * copyShards) starts at once and takes each shard as soon as its chunk is built with its owners and
 * grants (createTargets), while the next chunks are being built: the two keep both hosts busy
 * where one after the other each left them partly idle. Nothing is recorded before both are done:
 * a run cut off in between is carried on from `prepared` (each part redone or skipped) or undone
 * with the replication and the copies (target-created's undo, move.ts).
 */
export async function createAndCopy(ctx: MoveContext): Promise<void> {
  const gate = new ShardGate();
  const creating = createTargets(ctx, (chunk) => gate.open(chunk)).catch((error: unknown) => {
    gate.fail(error);
    throw error;
  });
  const published = awaitedLater(publish(ctx));
  const copying = (async () => {
    await published;
    await copyFromSnapshot(ctx, (shard) => gate.wait(shard));
  })().catch((error: unknown) => {
    gate.stop();
    throw error;
  });
  // Once every target table exists (and the publication that lists them), the subscription is
  // created disabled on the target's session while the last shards are copied (best effort; the
  // `subscribed` step enables it, or creates it).
  const subscribing = Promise.all([creating, published]).then(
    () => subscribeEarly(ctx),
    () => undefined,
  );
  const [created, copied] = await Promise.allSettled([creating, copying, subscribing]);
  // The creation's failure first: the copy waiting for its shards failed because of it.
  if (created.status === 'rejected') throw created.reason;
  if (copied.status === 'rejected') throw copied.reason;
  ctx.copied = true;
}

/** The shards the copy may take (createAndCopy): opened chunk by chunk, or failed with the creation. */
class ShardGate {
  readonly #open = new Set<number>();
  #failure: { error: unknown } | null = null;
  #stopped = false;
  #waiting: (() => void)[] = [];

  /** Opens shards for the copy; false once the copy has stopped (nothing more to build for it). */
  open(shards: readonly number[]): boolean {
    for (const shard of shards) this.#open.add(shard);
    this.#wake();
    return !this.#stopped;
  }

  fail(error: unknown): void {
    this.#failure = { error };
    this.#wake();
  }

  stop(): void {
    this.#stopped = true;
  }

  async wait(shard: number): Promise<void> {
    while (!this.#open.has(shard)) {
      if (this.#failure) throw this.#failure.error;
      await new Promise<void>((resolve) => this.#waiting.push(resolve));
    }
  }

  #wake(): void {
    for (const resolve of this.#waiting.splice(0)) resolve();
  }
}

/**
 * Online copy: a logical slot created with an exported snapshot, and every table of every shard
 * copied as of that snapshot, so the subscription created next streams exactly the changes after
 * the copy. Measured faster than the subscription's own initial copy (PostgreSQL 15: 1.2-1.4 s vs
 * 1.8 s for a million rows). A slot left by an interrupted copy lost its snapshot with its
 * connection: dropped, copied again.
 */
export async function copyFromSnapshot(ctx: MoveContext, ready?: (shard: number) => Promise<void>): Promise<void> {
  await dropMoveSlot(ctx);
  // node-postgres supports replication connections; its type definitions do not list the option.
  const config: pg.ClientConfig & { replication: string } = {
    // The source session's own address (a host's URL may list several: src/pg/multihost.ts).
    connectionString: libpqCompatible(connectedUrl(ctx.source.host, ctx.source.client)),
    replication: 'database',
    application_name: 'shardctl move',
    ...hostClientSettings(ctx.source.host),
  };
  const replication = new pg.Client(config);
  replication.on('error', () => undefined);
  try {
    await replication.connect();
    watchSilence(replication, ctx.source.host);
    await checkClientConnection(replication);
  } catch (error) {
    const refused = describePgError(error);
    // PgBouncer (and other poolers) refuse the startup parameter a replication connection needs.
    const hint = /unsupported startup parameter/i.test(refused)
      ? `; ${ctx.source.host.name}'s address looks like a connection pooler's: set hosts[].directUrl to the server's own address`
      : '';
    throw new HostError(ctx.source.host.name, `cannot open a replication connection: ${refused}${hint}`, {
      shard: ctx.shards[0]!,
      code: 'MOVE_FAILED',
    });
  }
  try {
    // The large tables' change logs start before the slot, so before its snapshot (copy-logs.ts).
    const logs = await startCopyLogs(ctx);
    const snapshot = await createSlotWatched(ctx, replication);
    await copyShards(ctx, ctx.shards, snapshot, ready, logs);
  } catch (error) {
    if (error instanceof ShardctlError && error.code === SLOT_WAL_BOUND) {
      // The slot's WAL is what the guard protects the source from: released now, not at the resume.
      await endQuietly(replication);
      await dropMoveSlot(ctx);
    }
    throw error;
  } finally {
    await endQuietly(replication);
  }
}

/**
 * Creating a logical slot waits for every transaction that holds a transaction id on the source
 * server, in any database. Says which ones every few seconds, and gives up after waitTimeoutMs
 * (the step is not recorded: --resume tries again).
 */
async function createSlotWatched(ctx: MoveContext, replication: pg.Client): Promise<string> {
  const pid = Number((await replication.query<{ pid: number }>(BACKEND_PID_SQL)).rows[0]!.pid);
  const limit = ctx.settings.waitTimeoutMs;
  const started = performance.now();
  let done = false;
  // Its outcome is read after the loop below, which waits for it.
  const creating = awaitedLater(
    replication
      .query<{ snapshot_name: string }>(createMoveSlotCommand(ctx.name, ctx.source.serverVersionNum))
      .finally(() => (done = true)),
  );
  let blockers = '';
  while (!done) {
    // The 2 s look-round is cancelled as soon as the slot exists: a pending timer would keep the
    // process alive after the move has finished.
    const pause = new AbortController();
    // Only waits: the creation's outcome is read where it is awaited, and the pause's abort rejects delay()
    // on purpose.
    await Promise.race([
      creating.then(
        () => undefined,
        () => undefined,
      ),
      delay(2000, undefined, { signal: pause.signal }).catch(() => undefined),
    ]);
    pause.abort();
    if (done) break;
    blockers = await xidHolders(ctx.source.client, pid);
    const waited = Math.round((performance.now() - started) / 1000);
    if (performance.now() - started > limit) {
      // Cancels the slot's creation; a backend that has ended already needs no cancelling.
      await ctx.source.client.query(TERMINATE_BACKEND_SQL, [pid]).catch(() => undefined);
      // It fails with the termination just sent: the timeout below is what is reported.
      await creating.catch(() => undefined);
      throw new HostError(
        ctx.source.host.name,
        `creating the replication slot waited ${waited} s for transactions to finish (${blockers || 'none visible any more'}); ` +
          `nothing is fenced. End or commit them and resume the move, or abort it`,
        { shard: ctx.shards[0]!, code: 'SLOT_WAIT_TIMEOUT', next: resumeOrAbort(ctx.shards) },
      );
    }
    notice(
      ctx,
      `host ${ctx.source.host.name}: creating the replication slot waits for open transactions to finish (${waited} s): ${blockers || 'none visible'}`,
    );
  }
  try {
    return (await creating).rows[0]!.snapshot_name;
  } catch (error) {
    throw new HostError(ctx.source.host.name, `cannot create the replication slot: ${describePgError(error)}`, {
      shard: ctx.shards[0]!,
      code: 'MOVE_FAILED',
      cause: error,
    });
  }
}

/** The transactions holding a transaction id on the server (any database), oldest first. */
async function xidHolders(client: pg.Client, except: number): Promise<string> {
  const result = await client.query<{
    pid: number;
    datname: string | null;
    application_name: string;
    age: number;
    query: string;
  }>(XID_HOLDERS_SQL, [except]);
  return result.rows
    .map(
      (r) =>
        `pid ${r.pid} (database ${r.datname ?? '?'}, ${r.application_name || 'no application name'}, open ${r.age} s: ${JSON.stringify(r.query)})`,
    )
    .join('; ');
}

/** The parts of the copy other steps call, where move.ts and the tests look for them. */
export { chunksOf, createTargets, dropTargets } from './targets.js';
export { copyShards, INDEXES_AFTER_BYTES } from './table-copy.js';
