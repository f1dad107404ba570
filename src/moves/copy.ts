import type { Sql } from '../pg/sql-template.js';
import { pipeline } from 'node:stream/promises';
import { setTimeout as delay } from 'node:timers/promises';
import pg from 'pg';
import type copyStreamsModule from 'pg-copy-streams';
import { shardSchemaName } from '../config/types.js';
import { HostError, resumeOrAbort, ShardctlError } from '../errors.js';
import { checkClientConnection, connectedUrl, describePgError } from '../fleet/connect.js';
import { WORKER_TRANSACTION_SQL, ASYNC_COMMIT_SQL, DURABLE_FLUSH_SQL } from '../fleet/control.js';
import { errorHost } from '../fleet/session.js';
import { hostClientSettings, watchSilence } from '../fleet/silence.js';
import { createShardSql, dropShardSql } from '../fleet/sql.js';
import { migrationSql, noTransactionMigrationSteps } from '../migrations/sql.js';
import { privilegeVersions, syncPrivilegesSql, type PrivilegeObject } from './privileges.js';
import { APPLIED_VERSIONS_SQL } from './sql/control.js';
import {
  BEGIN_COPY_SQL,
  nonEmptyTablesSql,
  truncateSql,
  copyOutSql,
  copyInSql,
  dropIndexForCopySql,
  rebuildIndexSql,
  type RebuildableIndex,
} from './sql/copy.js';
import { XID_HOLDERS_SQL } from './sql/locks.js';
import { qualified } from './sql/names.js';
import { BACKEND_PID_SQL, TERMINATE_BACKEND_SQL, setTransactionSnapshotSql } from './sql/session.js';
import {
  groupBySchema,
  shardPrivileges,
  type ShardTable,
  EXISTING_SCHEMAS_SQL,
  REBUILDABLE_INDEXES_SQL,
} from './catalog.js';
import { type MoveContext, schemasOf, notice, sameMajorVersion } from './context.js';
import { leafTablesOf } from './checksum-methods.js';
import { concurrency, COPY_WORKER, moveWorker, Workers } from './workers.js';
import { dropMoveSlot, publish, subscribeEarly } from './replication.js';
import { createMoveSlotCommand } from './sql/failover.js';
import { stopDeltas, stopTracking } from './tail.js';
import { faultAfter, faultAfterChunk } from './state.js';
import { endQuietly, rollbackQuietly } from '../pg/quiet.js';
import { allOrNone, awaitedLater } from '../promises.js';
import { libpqCompatible } from '../pg/tls.js';
import { sleep } from '../clock.js';
import { CopyMeter, tableEstimates } from './copy-meter.js';
import { SLOT_WAL_BOUND, slotWalCheck } from './wal-guard.js';
import { allPageless } from './pageless.js';
import { BLOCK_CHUNKS_FROM, planBlockChunks } from './block-chunks.js';
import { type CopyLogs, startCopyLogs } from './copy-logs.js';
import {
  BLOCK_KEY,
  CHUNK_TEXT_SETTINGS,
  DELETE_CHUNKS_SQL,
  chunkMatches,
  copyChunk,
  keysAndColumns,
  planChunks,
  recordedChunks,
  type ChunkRecord,
} from './chunks.js';

/**
 * The copy of a move: the target's schemas at the source's migration level, then every table of
 * every shard copied, online from the slot's exported snapshot, offline with writes fenced.
 */

/**
 * Every shard's schema on the target, at the source's migration level for that shard, marked
 * incoming, with the source's owners and grants (carryPrivileges). With `onChunk` (createAndCopy)
 * the shards are built in chunks, and each chunk is handed over once it has its owners and grants,
 * while the next is being built; onChunk returning false stops the building (the copy failed).
 */
export async function createTargets(ctx: MoveContext, onChunk?: (shards: readonly number[]) => boolean): Promise<void> {
  const { source, target, config } = ctx;
  const schemas = schemasOf(ctx, ctx.shards);
  // The source's owners and grants are read once for every chunk (each read scans the catalog
  // whole), by this run's preflight if it had one.
  const [applied, existing, done, wanted] = await Promise.all([
    source.client.query<{ shard: number; version: number }>(APPLIED_VERSIONS_SQL, [ctx.shards]),
    target.client.query<{ nspname: string }>(EXISTING_SCHEMAS_SQL, [schemas]),
    target.client.query<{ shard: number; version: number }>(APPLIED_VERSIONS_SQL, [ctx.shards]),
    ctx.sourcePrivileges ?? shardPrivileges(source.client, schemas),
  ]);
  const wantedBySchema = groupBySchema(wanted, (o) => o.schema);
  const files = new Map(ctx.migrations.map((m) => [m.version, m]));
  const exists = new Set(existing.rows.map((r) => r.nspname));
  const have = new Set(done.rows.map((r) => `${r.shard}:${r.version}`));
  const work = ctx.shards.map((shard) => {
    const statements: string[] = [];
    if (!exists.has(shardSchemaName(config, shard))) statements.push(createShardSql(config, shard, true, 'incoming'));
    for (const { version } of applied.rows.filter((r) => r.shard === shard)) {
      if (have.has(`${shard}:${version}`)) continue;
      const file = files.get(version);
      if (!file) {
        throw new HostError(
          source.host.name,
          `migration version ${version} is applied but has no file; restore it and resume the move`,
          { shard, code: 'MIGRATION_DRIFT', next: [{ action: 'resume', shards: ctx.shards }] },
        );
      }
      if (file.noTransaction) statements.push(...noTransactionMigrationSteps(config, shard, file));
      else statements.push(migrationSql(config, shard, file));
    }
    return { shard, statements };
  });
  const workers = new Workers(ctx, target);
  // The privileges of a chunk are carried on the move's own session while the workers build the
  // next; a failure there, or a copy that stopped, ends the building.
  let carried: Promise<void> = Promise.resolve();
  let stop = false;
  try {
    const chunks = onChunk ? chunksOf(ctx.shards, CREATE_CHUNKS, concurrency(ctx, ctx.shards.length)) : [ctx.shards];
    for (const [i, chunk] of chunks.entries()) {
      if (stop) break;
      const inChunk = new Set(chunk);
      await workers.run(
        work.filter((w) => inChunk.has(w.shard) && w.statements.length > 0),
        (client, { shard, statements }) => migrateTarget(ctx, client, shard, statements),
      );
      if (i === 0) faultAfter('target-migrations');
      carried = carried.then(async () => {
        await carryPrivileges(ctx, chunk, wantedBySchema);
        if (onChunk && !onChunk(chunk)) stop = true;
      });
      // Seen where it is awaited, after the last chunk.
      carried.catch(() => (stop = true));
    }
    await carried;
  } catch (error) {
    // A chunk's migrations failed: the carry still running on the move's session ends first.
    await carried.catch(() => undefined);
    throw error;
  } finally {
    await workers.close();
  }
  // The workers committed without waiting for the WAL flush: made durable before the step is recorded.
  await target.client.query(DURABLE_FLUSH_SQL);
}

/** Online, the copy starts on the first chunk of target shards while the next ones are built (createTargets). */
const CREATE_CHUNKS = 8;

/**
 * `list` in `count` chunks (fewer for a short list), in order, the last one split in halves down to
 * `least` items (the workers building it): the copy of the last chunk is what is left once the
 * creation ends, so it is kept short.
 */
export function chunksOf<T>(list: readonly T[], count: number, least = 1): T[][] {
  const size = Math.max(1, Math.ceil(list.length / count));
  const chunks: T[][] = [];
  for (let i = 0; i < list.length; i += size) chunks.push(list.slice(i, i + size));
  const last = chunks.pop() ?? [];
  while (last.length >= 2 * Math.max(1, least)) chunks.push(last.splice(0, Math.ceil(last.length / 2)));
  if (last.length > 0) chunks.push(last);
  return chunks;
}

/** One shard's creation and migrations: whole transactions in one round trip when they can share one; no-transaction steps alone. */
async function migrateTarget(
  ctx: MoveContext,
  client: pg.Client,
  shard: number,
  statements: readonly string[],
): Promise<void> {
  const batch: string[] = [];
  const flush = async (): Promise<void> => {
    if (batch.length > 0) await client.query(batch.splice(0).join('\n'));
  };
  try {
    for (const sql of statements) {
      if (sql.startsWith('BEGIN;')) batch.push(sql);
      else {
        await flush();
        await client.query(sql);
      }
    }
    await flush();
  } catch (error) {
    await rollbackQuietly(client);
    throw new HostError(ctx.target.host.name, `cannot create the target copy: ${describePgError(error)}`, {
      shard,
      code: 'MOVE_FAILED',
      cause: error,
    });
  }
}

/**
 * The source's owners, ACLs and default privileges (`wantedBySchema`, as the preflight or
 * createTargets read them) given to the target's copies of `shards`, one transaction per shard
 * whose copy differs (none when the same role built both and nothing was granted by hand), on the
 * move's session, each committed without waiting for the WAL flush (the caller's flush covers
 * them). After the migrations: what to change depends on what the migrations built, read from the
 * target's catalog. Run on every attempt, so a run killed between the migrations and this still
 * carries them on --resume; the copies are incoming, so no client sees them before.
 */
async function carryPrivileges(
  ctx: MoveContext,
  shards: readonly number[],
  wantedBySchema: ReadonlyMap<string, readonly PrivilegeObject[]>,
): Promise<void> {
  const { source, target } = ctx;
  const current = await shardPrivileges(target.client, schemasOf(ctx, shards));
  const currentBySchema = groupBySchema(current, (o) => o.schema);
  const versions = privilegeVersions(source.serverVersionNum, target.serverVersionNum);
  for (const shard of shards) {
    const schema = shardSchemaName(ctx.config, shard);
    const statements = syncPrivilegesSql(wantedBySchema.get(schema) ?? [], currentBySchema.get(schema) ?? [], versions);
    if (statements.length === 0) continue;
    try {
      await target.client.query(['BEGIN;', WORKER_TRANSACTION_SQL, ...statements, 'COMMIT;'].join('\n'));
    } catch (error) {
      await rollbackQuietly(target.client);
      throw new HostError(
        target.host.name,
        `cannot give the target copy the source's owners and grants: ${describePgError(error)}`,
        { shard, code: 'MOVE_FAILED', cause: error },
      );
    }
  }
}

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
 * createTargets' undo (abortMove): the target's copies dropped, only those this move created
 * (incoming, never active: abortMove refuses a move that activated any). The tracking of the
 * fence's verification sits on these copies, so it goes with them; its rows are removed after them,
 * where no trigger is left to drop.
 */
export async function dropTargets(ctx: MoveContext): Promise<void> {
  for (const shard of ctx.shards)
    await ctx.target.client.query(dropShardSql(shard, [shardSchemaName(ctx.config, shard)]));
  await ctx.target.client.query(DELETE_CHUNKS_SQL, [ctx.moveId]);
  await stopTracking(ctx.target.client, ctx.moveId, schemasOf(ctx, ctx.shards));
  // The change logs the copy started on the source's large tables (copy-logs.ts), where the fence's
  // undo did not already remove them: off, then dropped where their tables are free.
  await stopDeltas(ctx.source.client, ctx.moveId, schemasOf(ctx, ctx.shards)).catch(() => undefined);
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

/**
 * Copies every table of the shards, each shard in one target transaction after a TRUNCATE (a retried
 * copy starts clean, and a migration's seed rows give way to the source's), shards spread over
 * `concurrency` pairs of connections. Online the source side reads the slot's snapshot; offline the
 * source is fenced. Binary COPY only for tables whose types travel in binary (ShardTable.portable)
 * between equal majors. Tables of at least INDEXES_AFTER_BYTES on the source are loaded without
 * their indexes, which are built again after the COPY in the same transaction (see copyShard).
 */
export async function copyShards(
  ctx: MoveContext,
  shards: readonly number[],
  snapshot?: string,
  ready?: (shard: number) => Promise<void>,
  logs: CopyLogs | null = null,
): Promise<void> {
  const { source, target } = ctx;
  const schemas = schemasOf(ctx, shards);
  const tables = await leafTablesOf(ctx, schemas);
  const sameMajor = sameMajorVersion(ctx);
  const estimates = await tableEstimates(source.client, schemas);
  const large = new Set([...estimates].filter(([, t]) => t.heapBytes >= INDEXES_AFTER_BYTES).map(([name]) => name));
  // Read after the snapshot was taken: a table of no page then has no row in it (pageless.ts).
  const pageless = new Set([...estimates].filter(([, t]) => t.heapBytes === 0).map(([name]) => name));
  const meter = new CopyMeter({
    moveId: ctx.moveId,
    source: source.host.name,
    target: target.host.name,
    tables: estimates,
    onProgress: ctx.options.onProgress,
    maxRate: ctx.options.maxRate,
    // The guard looks at the slot the copy reads from: online only.
    check: snapshot ? () => slotWalCheck(ctx) : undefined,
  });
  meter.start();
  const chunks = snapshot ? await chunkedTables(ctx, estimates) : null;
  const byShard = shards.map((shard) => ({
    shard,
    tables: tables.filter((t) => t.schema === shardSchemaName(ctx.config, shard)),
  }));
  const streams = await copyStreams();
  /** The chunks to copy or reconcile, taken by any worker before it takes the next shard. */
  const chunkTasks: { chunk: ChunkRecord; columns: readonly string[]; binary: boolean }[] = [];
  /** Per chunked table: its chunks not done yet. */
  const chunksLeft = new Map<string, number>();
  /** Chunked tables an earlier run wrote to: vacuumed at the end (its cut-off chunk left dead rows). */
  const vacuum = new Set<string>();
  /** Workers planning a table's chunks now: a worker with nothing to do waits for their chunks. */
  let planning = 0;
  const queueChunks = async (reader: pg.Client, writer: pg.Client, shardTables: readonly ShardTable[]) => {
    planning += 1;
    try {
      await queueTableChunks(reader, writer, shardTables);
    } finally {
      planning -= 1;
    }
  };
  const queueTableChunks = async (reader: pg.Client, writer: pg.Client, shardTables: readonly ShardTable[]) => {
    for (const t of shardTables) {
      const name = qualified(t.schema, t.table);
      const shape = chunks?.shapes.get(name);
      if (!chunks || !shape) continue;
      let planned = chunks.recorded.filter((c) => c.table === name);
      if (shape.key === BLOCK_KEY) {
        // An earlier run's plan of a keyless table is not carried on: the table is copied again whole.
        const rows = estimates.get(name)?.rows ?? 0;
        planned = await planBlockChunks(reader, writer, ctx.moveId, name, rows, chunks.rows, planned.length > 0);
      } else if (planned.length === 0) {
        const after = logs?.targetSql(ctx.moveId, name) ?? null;
        planned = await planChunks(reader, writer, ctx.moveId, name, shape.key, chunks.rows, after);
        logs?.planned(name, planned);
      } else {
        vacuum.add(name);
        logs?.planned(name, null);
      }
      chunksLeft.set(name, planned.length);
      const binary = sameMajor && t.portable;
      for (const chunk of planned) chunkTasks.push({ chunk, columns: shape.columns, binary });
    }
  };
  const runChunk = async (
    reader: pg.Client,
    writer: pg.Client,
    task: (typeof chunkTasks)[number],
    textSet: { done: boolean },
  ): Promise<void> => {
    const { chunk } = task;
    if (chunk.copied) {
      // Copied by an earlier run, from its snapshot: kept if the source's rows of its range are
      // still the same as of this run's snapshot.
      if (!textSet.done) {
        await Promise.all([reader.query(CHUNK_TEXT_SETTINGS), writer.query(CHUNK_TEXT_SETTINGS)]);
        textSet.done = true;
      }
      if (await chunkMatches(reader, writer, chunk)) {
        meter.kept(chunk.table, chunk.bytes ?? 0);
        meter.piece(chunk.table, chunk.rows ?? 0);
      } else {
        ctx.chunksRecopied += 1;
        await copyChunk(streams, reader, writer, ctx.moveId, chunk, task.columns, task.binary, meter);
      }
    } else {
      const method = logs?.method(chunk.table);
      if (method && !textSet.done) {
        await Promise.all([reader.query(CHUNK_TEXT_SETTINGS), writer.query(CHUNK_TEXT_SETTINGS)]);
        textSet.done = true;
      }
      const sums = await copyChunk(
        streams,
        reader,
        writer,
        ctx.moveId,
        chunk,
        task.columns,
        task.binary,
        meter,
        method,
      );
      if (sums) logs!.add(chunk.table, sums.source, sums.target);
      ctx.chunksCopied += 1;
      faultAfterChunk();
    }
    const left = chunksLeft.get(chunk.table)! - 1;
    chunksLeft.set(chunk.table, left);
    if (left === 0) meter.tableDone(chunk.table);
  };
  let next = 0;
  let failed: unknown = null;
  const worker = async (): Promise<void> => {
    let reader: pg.Client | null = null;
    let writer: pg.Client | null = null;
    try {
      // Both at once; either fails alone, and the other is closed.
      const opened = await allOrNone(
        Promise.allSettled([moveWorker(ctx, source.host, COPY_WORKER), moveWorker(ctx, target.host, COPY_WORKER)]),
        endQuietly,
      );
      [reader, writer] = [opened[0]!, opened[1]!];
      await writer.query(ASYNC_COMMIT_SQL);
      await reader.query('BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY');
      if (snapshot) await reader.query(setTransactionSnapshotSql(snapshot));
      if (logs) await logs.readAtSnapshot(reader, ctx.moveId);
      const textSet = { done: false };
      for (;;) {
        if (failed !== null) break;
        const task = chunkTasks.shift();
        if (task) {
          try {
            await runChunk(reader, writer, task, textSet);
          } catch (error) {
            await rollbackQuietly(writer);
            if (error instanceof ShardctlError) throw error;
            throw new HostError(
              errorHost(error) ?? target.host.name,
              `copy of ${task.chunk.table} (chunk ${task.chunk.chunk}) failed: ${describePgError(error)}`,
              { shard: ctx.shards[0]!, code: 'MOVE_FAILED', cause: error },
            );
          }
          continue;
        }
        if (next >= byShard.length) {
          // Another worker is planning a table's chunks: they will be queued for all.
          if (planning > 0) {
            await sleep(20);
            continue;
          }
          break;
        }
        const { shard, tables: shardTablesToCopy } = byShard[next++]!;
        await ready?.(shard);
        try {
          const whole = shardTablesToCopy.filter((t) => !chunks?.shapes.has(qualified(t.schema, t.table)));
          await copyShard(writer, reader, whole, sameMajor, large, pageless, meter);
          await queueChunks(reader, writer, shardTablesToCopy);
        } catch (error) {
          await rollbackQuietly(writer);
          // The guard's own errors (wal-guard.ts) say what happened and what to do.
          if (error instanceof ShardctlError) throw error;
          throw new HostError(errorHost(error) ?? target.host.name, `copy failed: ${describePgError(error)}`, {
            shard,
            code: 'MOVE_FAILED',
            cause: error,
          });
        }
      }
      await reader.query('COMMIT');
    } catch (error) {
      failed ??= error;
    } finally {
      // `failed` keeps the error that matters.
      if (reader) await endQuietly(reader);
      if (writer) await endQuietly(writer);
    }
  };
  // Chunks of one table are copied by as many connection pairs as --copy-parallel asks (default:
  // the move's concurrency), more than there are shards.
  const workers = Math.max(
    concurrency(ctx, byShard.length),
    chunks && chunks.shapes.size > 0 ? (ctx.options.copyParallel ?? concurrency(ctx, Infinity)) : 1,
  );
  await Promise.all(Array.from({ length: workers }, worker));
  // eslint-disable-next-line @typescript-eslint/only-throw-error -- the first error a worker caught, rethrown as caught
  if (failed !== null) throw failed;
  // A chunk cut off by a kill left its rows as dead tuples, and a chunk copied again left the
  // earlier copy's: vacuumed, so that a resumed copy leaves no more than an uninterrupted one.
  for (const table of vacuum) await target.client.query(`VACUUM ${table}`);
  // The copies committed without waiting for the WAL flush: made durable before `copied` is recorded.
  await target.client.query(DURABLE_FLUSH_SQL);
  await logs?.finish(ctx);
  meter.end();
  // A copy too short to time tells nothing about the next one's rate.
  const rate = meter.averageRate;
  // A resumed copy's rate counts the chunks it compared and kept as time spent but no bytes.
  if (rate !== null && meter.bytes >= RATE_FROM_BYTES && vacuum.size === 0) ctx.copyBytesPerSecond = Math.round(rate);
}

/**
 * The tables this copy takes in chunks: those an earlier run of the move planned, and those of more
 * estimated rows than copyChunkRows: by ranges of the primary key's first column, or for a table
 * without one by ranges of its blocks on a source that scans TID ranges (block-chunks.ts; copied
 * whole, in one transaction, from an older one).
 */
async function chunkedTables(
  ctx: MoveContext,
  estimates: ReadonlyMap<string, { rows: number }>,
): Promise<{ rows: number; recorded: ChunkRecord[]; shapes: Map<string, { key: string; columns: string[] }> }> {
  const rows = ctx.settings.copyChunkRows;
  const recorded = await recordedChunks(ctx.target.client, ctx.moveId);
  const planned = new Set(recorded.map((c) => c.table));
  const candidates = [...estimates].filter(([name, t]) => planned.has(name) || t.rows > rows).map(([name]) => name);
  const found = await keysAndColumns(ctx.source.client, candidates);
  const shapes = new Map<string, { key: string; columns: string[] }>();
  const blocks = ctx.source.serverVersionNum >= BLOCK_CHUNKS_FROM;
  for (const [name, shape] of found) {
    const key = recorded.find((c) => c.table === name)?.key ?? shape.key ?? (blocks ? BLOCK_KEY : null);
    if (key !== null) shapes.set(name, { key, columns: shape.columns });
  }
  return { rows, recorded, shapes };
}

/** A copy of fewer bytes than this is not taken as the measured rate (connection and catalog costs dominate). */
const RATE_FROM_BYTES = 4 * 1024 * 1024;

/**
 * From this size on the source, a table is loaded without its indexes and they are built after the
 * COPY (one sort per index instead of one insertion per row and index). Below it, dropping and
 * creating them costs more than it saves (bench/move-batch.js, docs/benchmarks.md).
 */
export const INDEXES_AFTER_BYTES = 4 * 1024 * 1024;

/** pg-copy-streams is loaded by the first copy, not by every command that loads the library. */
async function copyStreams(): Promise<typeof copyStreamsModule> {
  return (await import('pg-copy-streams')).default;
}

async function copyShard(
  writer: pg.Client,
  reader: pg.Client,
  tables: readonly ShardTable[],
  sameMajor: boolean,
  large: ReadonlySet<string>,
  pageless: ReadonlySet<string>,
  meter: CopyMeter,
): Promise<void> {
  const { to, from } = await copyStreams();
  const names = tables.map((t) => qualified(t.schema, t.table));
  // Tables of no page on the source have nothing to copy; a shard whose tables have none on either
  // host (an empty shard into its new copy) is left as it is, without a transaction on either host.
  const maybeFilled = names.filter((name) => !pageless.has(name));
  if (maybeFilled.length === 0 && (await allPageless(writer, names))) return;
  // The writer's transaction, with the replica role (refused without superuser: the savepoint undoes
  // the failed SET and the copy goes on without it); meanwhile the reader finds which tables hold
  // rows in its snapshot. An empty one is not copied: two COPY round trips saved, ~5 ms a table.
  const [onSource] = await Promise.all([
    filledTables(reader, maybeFilled),
    writer.query(BEGIN_COPY_SQL).catch(() => writer.query('ROLLBACK TO SAVEPOINT replica_role')),
  ]);
  // Only tables holding rows (seeded by a migration, or a copy redone) are truncated: a TRUNCATE
  // creates and later unlinks new files for the table and each index, ~3 ms a table.
  const truncate = await filledTables(writer, names);
  if (truncate.length > 0) await writer.query(truncateSql(truncate));
  const rebuild = await dropIndexesForCopy(
    writer,
    names.filter((name) => large.has(name)),
  );
  const copied = new Set(onSource);
  for (const t of tables) {
    const name = qualified(t.schema, t.table);
    if (!copied.has(name)) continue;
    const binary = sameMajor && t.portable;
    const out = reader.query(to(copyOutSql(name, binary)));
    const into = writer.query(from(copyInSql(name, binary)));
    await pipeline(out, meter.stream(name), into);
    meter.finished(name, into.rowCount);
  }
  for (const sql of rebuild) await writer.query(sql);
  await writer.query('COMMIT');
}

/** Of `names` (quoted tables), those holding any row, as `client` sees them: one round trip. */
async function filledTables(client: pg.Client, names: readonly Sql[]): Promise<Sql[]> {
  if (names.length === 0) return [];
  const filled = await client.query<Record<string, boolean>>(nonEmptyTablesSql(names));
  return names.filter((_, i) => filled.rows[0]![String(i)]);
}

/**
 * Drops the indexes of the (just truncated) tables that can be built again exactly from their
 * definition, in the copy's transaction, and returns the statements that build them again: a crash
 * or an error before COMMIT leaves every table as it was. Plain indexes and the indexes of primary
 * key, unique and exclusion constraints (pg_get_indexdef / pg_get_constraintdef), in their order of
 * creation. Only on tables the mover may alter (it owns them, as it created them). Left in place,
 * because recreating them would lose something or is not allowed: indexes
 * and constraints anything depends on (a foreign key referencing the key), inherited from a
 * partitioned parent, invalid, the replica identity or clustering index, outside the default
 * tablespace, with a comment, security label or column statistics target.
 */
async function dropIndexesForCopy(writer: pg.Client, tables: readonly string[]): Promise<string[]> {
  if (tables.length === 0) return [];
  const result = await writer.query<RebuildableIndex>(REBUILDABLE_INDEXES_SQL, [tables]);
  if (result.rows.length === 0) return [];
  await writer.query(result.rows.map(dropIndexForCopySql).join('\n'));
  return result.rows.map(rebuildIndexSql);
}
