import type { Sql } from '../pg/sql-template.js';
import { pipeline } from 'node:stream/promises';
import pg from 'pg';
import type copyStreamsModule from 'pg-copy-streams';
import { shardSchemaName } from '../config/types.js';
import { HostError, ShardctlError } from '../errors.js';
import { describePgError } from '../fleet/connect.js';
import { ASYNC_COMMIT_SQL, DURABLE_FLUSH_SQL } from '../fleet/control.js';
import { errorHost } from '../fleet/session.js';
import {
  nonEmptyTablesSql,
  truncateSql,
  copyOutSql,
  copyInSql,
  dropIndexForCopySql,
  rebuildIndexSql,
  type RebuildableIndex,
} from './sql/copy.js';
import { qualified } from './sql/names.js';
import { setTransactionSnapshotSql } from './sql/session.js';
import { type ShardTable, REBUILDABLE_INDEXES_SQL, TABLE_INDEXES_SQL } from './catalog.js';
import type { HashMethod } from './sql/verify.js';
import { type MoveContext, notice, schemasOf, sameMajorVersion } from './context.js';
import { leafTablesOf } from './checksum-methods.js';
import { concurrency, COPY_WORKER, moveWorker } from './workers.js';
import { faultAfterChunk } from './state.js';
import { endQuietly, rollbackQuietly, runTransaction } from '../pg/quiet.js';
import { allOrNone } from '../promises.js';
import { sleep } from '../clock.js';
import { CopyMeter, tableEstimates } from './copy-meter.js';
import { slotWalCheck } from './wal-guard.js';
import { allPageless } from './pageless.js';
import { BLOCK_CHUNKS_FROM, planBlockChunks } from './block-chunks.js';
import { type CopyLogs } from './copy-logs.js';
import {
  beginCopy,
  BLOCK_KEY,
  CHUNK_TEXT_SETTINGS,
  copyChunk,
  keysAndColumns,
  planChunks,
  copySnapshotText,
  SOURCE_INCARNATION_SQL,
  FORGET_ATTEMPTS_SQL,
  vacuumCleared,
  needsVacuum,
  reconcileByLog,
  reconcileChunks,
  recordedChunks,
  type SettledChunks,
  tableSums,
  type Sums,
  type ChunkRecord,
} from './chunks.js';

/**
 * The copy of every table of a move's shards over pairs of connections (source reader, target
 * writer): small tables whole in their shard's transaction, large ones in chunks (chunks.ts,
 * block-chunks.ts), each chunk taken by any pair.
 */

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
  /** The chunks to copy, taken by any worker before it takes the next shard. */
  const chunkTasks: { chunk: ChunkRecord; columns: readonly string[]; binary: boolean; again: boolean }[] = [];
  /** Per chunked table: its chunks not done yet. */
  const chunksLeft = new Map<string, number>();
  /** The source's sums of a carried table at this run's snapshot, from its reconciliation (none: nothing carried). */
  const sourceSums = new Map<string, Sums>();
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
  /** Sessions given the stable text settings (the 'text' checksum method). */
  const stableText = new WeakSet<pg.Client>();
  const textSettings = async (method: HashMethod, ...clients: pg.Client[]) => {
    if (method !== 'text') return;
    await Promise.all(
      clients
        .filter((c) => !stableText.has(c))
        .map(async (c) => (await c.query(CHUNK_TEXT_SETTINGS), stableText.add(c))),
    );
  };
  /** A vacuum of this run already waited out an older snapshot on the target: the next ones do not wait again. */
  let snapshotOutwaited = false;
  const queueTableChunks = async (reader: pg.Client, writer: pg.Client, shardTables: readonly ShardTable[]) => {
    for (const t of shardTables) {
      const name = qualified(t.schema, t.table);
      const shape = chunks?.shapes.get(name);
      if (!chunks || !shape) continue;
      let planned = chunks.recorded.filter((c) => c.table === name);
      let toCopy = planned;
      let copiedBefore = new Set<number>();
      /** Whether an earlier run's chunks were reconciled (their indexes dropped there). */
      let carried = false;
      if (shape.key === BLOCK_KEY || (planned.length > 0 && shape.keyType === null)) {
        // An earlier run's plan of a keyless table is not carried on: the table is copied again
        // whole (nor one whose key is not the table's key any more).
        const rows = estimates.get(name)?.rows ?? 0;
        if (shape.key === BLOCK_KEY)
          planned = await planBlockChunks(reader, writer, ctx.moveId, name, rows, chunks.rows, planned.length > 0);
        else {
          const again = logs?.targetSql(ctx.moveId, name, true) ?? null;
          planned = await planChunks(reader, writer, ctx.moveId, name, shape, chunkSizes(name), again, true);
        }
        toCopy = planned;
        logs?.planned(name);
      } else if (planned.length === 0) {
        const after = logs?.targetSql(ctx.moveId, name, true) ?? null;
        planned = await planChunks(reader, writer, ctx.moveId, name, shape, chunkSizes(name), after);
        toCopy = planned;
        logs?.planned(name);
      } else {
        // Its log on the target again before any chunk is reconciled (copy-logs.ts).
        const again = logs?.targetSql(ctx.moveId, name) ?? null;
        if (again) await runTransaction(writer, `BEGIN;\n${again}\nCOMMIT;`);
        logs?.planned(name);
        // From the source's change log when it can tell what changed since each chunk's snapshot
        // (nothing read), else by reading the chunks on both hosts (chunks.ts).
        const fromLog = logs?.logged(name)
          ? await reconcileByLog(reader, writer, ctx.moveId, planned, shape.keyType!, shape.keyCollation)
          : null;
        const settling = planned.filter((c) => c.copied).length;
        let reconciled: SettledChunks;
        if (fromLog) {
          reconciled = fromLog;
          ctx.chunksFromLog += settling;
        } else {
          const method = logs?.method(name) ?? 'text';
          await textSettings(method, reader, writer);
          const read = await reconcileChunks(reader, writer, ctx.moveId, planned, shape.keyType!, method);
          sourceSums.set(name, read.source);
          ctx.chunksCompared += settling;
          reconciled = read;
        }
        ctx.chunksRecopied += reconciled.recopied.size;
        copiedBefore = reconciled.recopied;
        for (const kept of reconciled.kept) {
          meter.kept(name, kept.bytes ?? 0);
          meter.piece(name, kept.rows ?? 0);
        }
        toCopy = reconciled.toCopy;
        carried = true;
        // Loaded without its indexes (the key's too), built after the last chunk (tableCopied).
        if (toCopy.length > 0) await dropIndexesForChunks(writer, name);
        // A chunk cut off by a kill left its rows as dead tuples, and a chunk to copy again had its
        // rows deleted: vacuumed now, before the chunks left are copied (the space is used again,
        // an empty end of the table given back), so that a resumed copy leaves no more dead rows
        // than an uninterrupted one, and the table is read once more only as far as it was copied.
        // Not when neither happened (chunks.ts needsVacuum).
        if (needsVacuum(planned, reconciled.cleared)) {
          // Waited for once per run: a snapshot that outlived one table's wait likely outlives the next.
          const { dead, vacuumed } = await vacuumCleared(writer, name, snapshotOutwaited ? 0 : undefined);
          if (dead > 0 && !vacuumed)
            notice(
              ctx,
              `host ${target.host.name}: ${name} was not vacuumed (the move's role neither owns it nor may maintain it); its ${dead} dead rows are left for autovacuum`,
            );
          else if (dead > 0) {
            snapshotOutwaited = true;
            notice(
              ctx,
              `host ${target.host.name}: ${dead} rows deleted from ${name} to be copied again are still seen by an older snapshot there (a long transaction, a replication slot); left for autovacuum`,
            );
          }
          await writer.query(FORGET_ATTEMPTS_SQL, [ctx.moveId, name]);
        }
      }
      chunksLeft.set(name, toCopy.length);
      if (toCopy.length === 0) {
        await tableCopied(reader, writer, name);
        continue;
      }
      if (!carried) await dropIndexesForChunks(writer, name);
      const binary = sameMajor && t.portable;
      for (const chunk of toCopy)
        chunkTasks.push({ chunk, columns: shape.columns, binary, again: copiedBefore.has(chunk.chunk) });
    }
  };
  /** The chunk sizes of a table: --copy-chunk-rows, and its estimated rows (for the statistics' bounds). */
  const chunkSizes = (name: string) => ({ chunkRows: chunks!.rows, estimatedRows: estimates.get(name)?.rows ?? 0 });
  /**
   * A chunked table whose last chunk is in: its sums on both hosts for the copy's figures (the
   * source's in the reader's snapshot), and the indexes the source has and the target lacks built
   * from the source's definitions, on this pair while the others go on copying.
   */
  const tableCopied = async (reader: pg.Client, writer: pg.Client, name: string) => {
    const method = logs?.method(name);
    if (method) {
      await textSettings(method, reader, writer);
      const [onSource, onTarget] = await Promise.all([
        sourceSums.get(name) ?? tableSums(reader, name, method),
        tableSums(writer, name, method),
      ]);
      logs!.summed(name, onSource, onTarget);
    }
    await indexesAfterChunks(reader, writer, name);
    meter.tableDone(name);
  };
  const runChunk = async (
    reader: pg.Client,
    writer: pg.Client,
    task: (typeof chunkTasks)[number],
    copySnapshot: string | null,
  ): Promise<void> => {
    const { chunk } = task;
    await copyChunk(streams, reader, writer, ctx.moveId, chunk, task.columns, task.binary, meter, copySnapshot);
    // A chunk copied again after its reconciliation is counted as such (chunksRecopied).
    if (!task.again) {
      ctx.chunksCopied += 1;
      faultAfterChunk();
    }
    const left = chunksLeft.get(chunk.table)! - 1;
    chunksLeft.set(chunk.table, left);
    if (left === 0) await tableCopied(reader, writer, chunk.table);
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
      // The snapshot each chunk is recorded with, for a resumed run's reconcileByLog.
      const copySnapshot = snapshot ? await currentSnapshot(reader) : null;
      if (logs) await logs.readAtSnapshot(reader, ctx.moveId);
      for (;;) {
        if (failed !== null) break;
        const task = chunkTasks.shift();
        if (task) {
          try {
            await runChunk(reader, writer, task, copySnapshot);
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
  // The copies committed without waiting for the WAL flush: made durable before `copied` is recorded.
  await runTransaction(target.client, DURABLE_FLUSH_SQL);
  await logs?.finish(ctx);
  meter.end();
  // A copy too short to time tells nothing about the next one's rate.
  const rate = meter.averageRate;
  // A resumed copy's rate counts the chunks it compared and kept as time spent but no bytes.
  if (rate !== null && meter.bytes >= RATE_FROM_BYTES && sourceSums.size === 0)
    ctx.copyBytesPerSecond = Math.round(rate);
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
): Promise<{ rows: number; recorded: ChunkRecord[]; shapes: Map<string, ChunkShape> }> {
  const rows = ctx.settings.copyChunkRows;
  const recorded = await recordedChunks(ctx.target.client, ctx.moveId);
  const planned = new Set(recorded.map((c) => c.table));
  const candidates = [...estimates].filter(([name, t]) => planned.has(name) || t.rows > rows).map(([name]) => name);
  const found = await keysAndColumns(ctx.source.client, candidates);
  const shapes = new Map<string, ChunkShape>();
  const blocks = ctx.source.serverVersionNum >= BLOCK_CHUNKS_FROM;
  for (const [name, shape] of found) {
    const earlier = recorded.find((c) => c.table === name)?.key;
    if (shape.key !== null) {
      // A plan by another column than the key (changed since) cannot be reconciled: planned again.
      const same = earlier === undefined || earlier === shape.key;
      shapes.set(name, { ...shape, key: shape.key, keyType: same ? shape.keyType : null });
    } else if (earlier === BLOCK_KEY || (earlier === undefined && blocks))
      shapes.set(name, { ...shape, key: BLOCK_KEY, keyName: null, keyType: null, keyCollation: null });
  }
  return { rows, recorded, shapes };
}

/** How a chunked table is cut: its key (BLOCK_KEY for a keyless one), the key's name and type (null: not reconcilable), its columns. */
interface ChunkShape {
  readonly key: string;
  readonly keyName: string | null;
  readonly keyType: string | null;
  readonly keyCollation: string | null;
  readonly columns: string[];
}

/** The snapshot of the reader's transaction (the copy's) as a chunk records it (chunks.ts copySnapshotText). */
async function currentSnapshot(reader: pg.Client): Promise<string> {
  const r = await reader.query<{ s: string; incarnation: string }>(
    `SELECT pg_catalog.pg_current_snapshot()::text AS s, (${SOURCE_INCARNATION_SQL}) AS incarnation`,
  );
  return copySnapshotText(r.rows[0]!.incarnation, r.rows[0]!.s);
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
  const [onSource] = await Promise.all([filledTables(reader, maybeFilled), beginCopy(writer)]);
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
 * A chunked table is loaded without its indexes, as a table copied whole is (dropIndexesForCopy),
 * its key's too (one sort per index after the last chunk instead of one insertion per row and
 * index: a million rows of the benchmarks' photos loaded in 1.3 s, plus 0.4-0.6 s to build the key,
 * against 2.5 s into the table with its key, PostgreSQL 15): each chunk
 * commits on its own, so they are dropped in a statement of their own before the first chunk, with
 * the same rules of what can be built again. Nothing reads the target by its key meanwhile (a
 * resume reconciles a table in one scan: chunks.ts reconcileChunks), and nothing needs to remember
 * them across a kill: indexesAfterChunks builds, from the source's definitions, every index the
 * target lacks, in the run that copies the last chunk and in every resumed run after it.
 */
async function dropIndexesForChunks(writer: pg.Client, table: string): Promise<void> {
  const result = await writer.query<RebuildableIndex>(REBUILDABLE_INDEXES_SQL, [[table]]);
  if (result.rows.length > 0) await writer.query(result.rows.map(dropIndexForCopySql).join('\n'));
}

/** The indexes (and the constraints owning them) of a chunked table that the source has and the target lacks, built on the target. */
async function indexesAfterChunks(source: pg.Client, target: pg.Client, table: string): Promise<void> {
  const [wanted, present] = await Promise.all([
    source.query<RebuildableIndex>(TABLE_INDEXES_SQL, [[table]]),
    target.query<RebuildableIndex>(TABLE_INDEXES_SQL, [[table]]),
  ]);
  const have = new Set(present.rows.map((index) => index.index_name));
  for (const index of wanted.rows) if (!have.has(index.index_name)) await target.query(rebuildIndexSql(index));
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
