import type pg from 'pg';
import { describePgError } from '../fleet/connect.js';
import { ensureMethods, leafTablesOf } from './checksum-methods.js';
import { keysAndColumns, recordedChunks, type Sums } from './chunks.js';
import { schemasOf, notice, type MoveContext } from './context.js';
import { tableEstimates } from './copy-meter.js';
import { lockWaitFor } from './fence-locks.js';
import { qualified } from './sql/names.js';
import { copyLogOnTargetSql, copyLogRowsOnTargetSql, type LoggedTable } from './sql/tail.js';
import { runTransaction } from '../pg/quiet.js';
import { readLogSums, startSourceDeltas, stopDeltas, type LogSums } from './tail.js';
import type { CopyFigure, HashMethod } from './verify.js';
import type { Sql } from '../pg/sql-template.js';

/**
 * The verification's head start for the large keyed tables, taken from the copy, so that the work
 * before a wave's fence grows with what changed since the copy, not with the tables' size.
 *
 * The wave's verification (tail.ts) needs each table's count and checksum at its snapshot P on both
 * hosts. For a table copied in chunks these come from the copy instead of a read of every row at P:
 *
 * - on the source, the change log of the table (sql/move_deltas.sql, the wave's function and
 *   triggers) is started before the slot, so before the copy's snapshot S; the table's count and
 *   checksum is taken in S once its last chunk is in (one scan, on a connection of the copy), and
 *   the log's sums as of S once. A log entry commits with its change, so the entries visible at P
 *   and not at S are exactly the changes committed between:
 *     at P = sum at S + (log at P - log at S)          (tail.ts fromLog)
 * - on the target, the same log is created with the table's chunk plan, before its first chunk, by
 *   statement triggers that leave out the copy's own transactions (COPYING_SETTING): any other
 *   write marks it, at one call per statement (row triggers, even skipped by a WHEN condition,
 *   made the copy of a 338 MB table about 1.5x slower). The table's count and checksum is taken
 *   once its last chunk has committed (one scan, no index needed: the copy loads the table without
 *   its indexes). After the copy, before the subscription starts, the
 *   triggers become row triggers, and the log must still be empty (nothing but the copy wrote
 *   there); every write since (the apply worker's, and any other's, a change made by hand too) is
 *   logged:
 *     at P = sum after the chunks + log at P
 *
 * Exact as the checksums at P it replaces: a row lost by replication is in the source's log and not
 * in the target's, a row changed on the target behind the move's back is in the target's log only.
 * A table an earlier run planned (a resumed copy) is summed the same way under the new slot, whose
 * snapshot S is the one every kept chunk was reconciled against: its source log is set up again
 * before that slot (the earlier run's entries kept: what changed since each chunk's snapshot,
 * chunks.ts reconcileByLog), its target log created again before its
 * chunks are reconciled, each chunk it copied before kept only if no change logged on the source
 * since its snapshot falls in its range (chunks.ts reconcileByLog), or, when the log cannot tell,
 * only if its count and checksum at S on the source equal the target's (reconcileChunks), copied
 * again from S if not, and the table summed as above once its last chunk is in. A write on the
 * target before the new log is in the reconciliation's read or its target log (a chunk it changed
 * differs, or the chunks are read); one after it marks the log.
 * A table is taken whole at P as before when anything breaks the chain: the target's log not empty
 * after the copy, the logs not set up in time on the source (busy tables), or the wave's own set-up
 * of its logs failing or running a second time (a cut-over retried). The source's triggers run in application transactions from
 * the slot's creation to the wave's cut-over; the wave's logs take them over, and the same
 * unfence, abort and clean-up switch them off.
 */

/**
 * Only the first wave's tables: a wave's verification, its switch and an unfence delete the move's
 * log entries wholesale (logsOffSql), which would take from a later wave's what its figures need.
 * A move of one large shard is one wave (waves.ts: a shard over the wave's rows goes alone).
 */
const FIRST_WAVE = 0;

/** How long the source's log triggers may wait for its writers before the slot, in all. */
const SETUP_LIMIT_MS = 5_000;

interface Logged {
  /** `schema.table` */
  readonly name: string;
  readonly wave: number;
  readonly logged: LoggedTable;
  /** Whether this run plans or carries its chunks, and whether its sums were taken (summed). */
  state: 'unplanned' | 'planned' | 'summed';
  source: { rows: bigint; checksum: bigint };
  target: { rows: bigint; checksum: bigint };
}

/** The large keyed tables of one copy whose logs run since before its snapshot, by quoted name. */
export class CopyLogs {
  readonly #tables: Map<string, Logged>;
  #atS: Promise<Map<string, LogSums>> | null = null;

  constructor(tables: Map<string, Logged>) {
    this.#tables = tables;
  }

  /** The checksum method of a logged table (quoted name) whose sums are still to be taken, or undefined. */
  method(table: string): HashMethod | undefined {
    const t = this.#tables.get(table);
    return t?.state === 'planned' ? t.logged.method : undefined;
  }

  /**
   * The statement creating the target's log of a table, or null: in the transaction that plans its
   * chunks (`planned`, with a start marker), or before an earlier run's chunks are reconciled.
   */
  targetSql(moveId: string, table: string, planned = false): Sql | null {
    const t = this.#tables.get(table);
    return t ? copyLogOnTargetSql(moveId, t.wave, t.logged, planned) : null;
  }

  /** Whether a table's log runs on the source since before the slot (its entries tell what changed since a chunk's snapshot). */
  logged(table: string): boolean {
    return this.#tables.has(table);
  }

  /** A table whose chunks this run planned, or carried from an earlier one: its sums are to be taken. */
  planned(table: string): void {
    const t = this.#tables.get(table);
    if (t) t.state = 'planned';
  }

  /**
   * A table's sums once its last chunk is in: the source's in the copy's snapshot (the sum of its
   * chunks'), the target's as the chunks left it (table-copy.ts tableCopied).
   */
  summed(table: string, source: Sums, target: Sums): void {
    const t = this.#tables.get(table);
    if (t?.state !== 'planned') return;
    t.state = 'summed';
    t.source = { rows: BigInt(source.rows), checksum: BigInt(source.checksum) };
    t.target = { rows: BigInt(target.rows), checksum: BigInt(target.checksum) };
  }

  /** The source's log as of the copy's snapshot, read once by the first reader (in that snapshot). */
  readAtSnapshot(reader: pg.Client, moveId: string): Promise<unknown> {
    this.#atS ??= readLogSums(reader, moveId);
    return this.#atS;
  }

  /**
   * After the copy: the figures of every table whose chunks were all summed and whose target log is
   * still empty, kept for the waves' pre-verifications.
   */
  async finish(ctx: MoveContext): Promise<void> {
    if (!this.#atS || ![...this.#tables.values()].some((t) => t.state === 'summed')) return;
    // Each table's log on the target by row from now on; a write its statement triggers marked
    // during the copy (any entry) leaves it to the read at P.
    for (const t of this.#tables.values())
      if (t.state === 'summed')
        await runTransaction(ctx.target.client, copyLogRowsOnTargetSql(ctx.moveId, t.wave, t.logged));
    const [atS, onTarget] = await Promise.all([this.#atS, readLogSums(ctx.target.client, ctx.moveId)]);
    const figures = new Map<string, CopyFigure>();
    for (const t of this.#tables.values()) {
      if (t.state !== 'summed' || (onTarget.get(t.name)?.entries ?? 0n) > 0n) continue;
      figures.set(t.name, {
        source: { rows: t.source.rows, checksum: t.source.checksum.toString() },
        target: { rows: t.target.rows, checksum: t.target.checksum.toString() },
        sourceLogAtS: atS.get(t.name),
      });
    }
    ctx.copyFigures = figures;
  }
}

/**
 * Online, before the slot: the source's change logs of the first wave's tables the copy will take
 * in chunks with a key (more estimated rows than copyChunkRows, or chunks recorded by an earlier
 * run), their triggers calling the first wave's function. Null when there are none, or when the
 * logs cannot be had (older than PostgreSQL 14, the tables kept busy past SETUP_LIMIT_MS): then what
 * was created is switched off, and the waves checksum those tables whole at P.
 */
export async function startCopyLogs(ctx: MoveContext): Promise<CopyLogs | null> {
  if (ctx.mode !== 'online' || Math.min(ctx.source.serverVersionNum, ctx.target.serverVersionNum) < 140000) return null;
  const schemas = schemasOf(ctx, ctx.shards);
  const [estimates, recorded, tables] = await Promise.all([
    tableEstimates(ctx.source.client, schemas),
    recordedChunks(ctx.target.client, ctx.moveId),
    leafTablesOf(ctx, schemas),
  ]);
  const earlier = new Set(recorded.map((c) => c.table));
  const first = new Set(schemasOf(ctx, ctx.waves[FIRST_WAVE] ?? ctx.shards));
  const byName = new Map(
    tables.filter((t) => first.has(t.schema)).map((t) => [qualified(t.schema, t.table) as string, t]),
  );
  const large = [...estimates]
    .filter(([name, e]) => (e.rows > ctx.settings.copyChunkRows || earlier.has(name)) && byName.has(name))
    .map(([name]) => name);
  const keyed = [...(await keysAndColumns(ctx.source.client, large))].filter(([, s]) => s.keyName !== null);
  if (keyed.length === 0) return null;
  const methods = await ensureMethods(ctx);
  const logged = new Map<string, Logged>();
  for (const [quoted, shape] of keyed) {
    const t = byName.get(quoted)!;
    const name = `${t.schema}.${t.table}`;
    logged.set(quoted, {
      name,
      wave: FIRST_WAVE,
      logged: { table: { schema: t.schema, table: t.table }, method: methods.get(name) ?? 'text', key: shape.keyName! },
      state: 'unplanned',
      source: { rows: 0n, checksum: 0n },
      target: { rows: 0n, checksum: 0n },
    });
  }
  const lockWaitMs = await lockWaitFor(ctx);
  try {
    const all = [...logged.values()].map((t) => t.logged);
    // An earlier run's entries are kept when it left chunks: what changed since their snapshots
    // (chunks.ts reconcileByLog). The sums take differences between snapshots, which the older
    // entries do not change.
    await startSourceDeltas(
      ctx.source.client,
      ctx.moveId,
      all,
      lockWaitMs,
      SETUP_LIMIT_MS,
      FIRST_WAVE,
      earlier.size > 0,
    );
  } catch (error) {
    const logSchemas = [...new Set([...logged.values()].map((t) => t.logged.table.schema))];
    await stopDeltas(ctx.source.client, ctx.moveId, logSchemas, { drop: false }).catch(() => undefined);
    notice(
      ctx,
      `host ${ctx.source.host.name}: no change logs during the copy (${describePgError(error)}); its large tables are checksummed whole before the fence`,
    );
    return null;
  }
  return new CopyLogs(logged);
}

/**
 * The copy's figures of `tables` (`schema.table`), taken once: a second pre-verification of the
 * same wave (a cut-over retried) found the logs switched off in between, and checksums whole.
 */
export function takeCopyFigures(ctx: MoveContext, tables: readonly string[]): Map<string, CopyFigure> {
  const all = ctx.copyFigures;
  const taken = new Map<string, CopyFigure>();
  if (!all) return taken;
  for (const name of tables) {
    const figure = all.get(name);
    if (figure) taken.set(name, figure);
    all.delete(name);
  }
  return taken;
}
