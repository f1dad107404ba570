import { Transform, type TransformCallback } from 'node:stream';
import type pg from 'pg';
import { sleep } from '../clock.js';
import { CONTROL } from '../fleet/control.js';
import { qualified } from './sql/names.js';

/**
 * What a move's copy has done and has left (CopyMeter), reported through MoveOptions.onProgress, and
 * the copy's pace: --max-rate (a bound on the COPY stream's bytes a second), and a guard called
 * every second (the WAL guard, wal-guard.ts). The figures are the COPY stream's bytes,
 * the bytes that cross between the hosts and that --max-rate bounds. The total is an estimate: the
 * tables' size on the source (pg_table_size: heap and TOAST, no indexes) scaled by what the tables
 * already copied gave (stream bytes per table byte); a table copied is counted at its exact figure.
 */

/** One event of a move's copy: bytes and rows copied of the estimated total, the rate, the time left. */
export interface CopyProgressEvent {
  readonly kind: 'copy';
  readonly moveId: string;
  readonly source: string;
  readonly target: string;
  /** COPY stream bytes copied so far by this run: never decreases between events of one move. */
  readonly bytes: number;
  /** The estimated stream bytes of the whole copy of this run (at least `bytes`). */
  readonly totalBytes: number;
  /** Rows copied: exact for the tables done, estimated for those being copied. */
  readonly rows: number;
  /** The estimated rows (reltuples) of the whole copy of this run. */
  readonly totalRows: number;
  /** Over the last few seconds; null until measured. */
  readonly bytesPerSecond: number | null;
  /** At that rate; 0 once done; null until a rate is measured. */
  readonly etaMs: number | null;
  readonly elapsedMs: number;
  readonly done: boolean;
}

/** The replication lag while the target catches up, and how it changes. */
export interface CatchUpProgressEvent {
  readonly kind: 'catch-up';
  readonly moveId: string;
  readonly source: string;
  readonly target: string;
  /** WAL bytes between the source's current position and what the target has confirmed. */
  readonly lagBytes: number;
  /** Change of the lag a second since the previous event: negative while the target catches up; null at first. */
  readonly lagBytesPerSecond: number | null;
  readonly elapsedMs: number;
}

export type MoveProgressEvent = CopyProgressEvent | CatchUpProgressEvent;

/** A table to copy: its size on the source and its estimated rows. */
export interface TableEstimate {
  readonly schema: string;
  /** The main fork alone (what decides whether its indexes are built after the COPY). */
  readonly heapBytes: number;
  /** Main fork and TOAST. */
  readonly bytes: number;
  readonly rows: number;
}

/**
 * The tables of `schemas` on the source (partitions included) with their size (main fork and TOAST:
 * what COPY reads) and estimated rows, by quoted name. One stat call per file: the free-space and
 * visibility maps are left out.
 */
export async function tableEstimates(
  source: pg.Client,
  schemas: readonly string[],
): Promise<Map<string, TableEstimate>> {
  const result = await source.query<{ schema: string; table: string; heap: string; toast: string; rows: string }>(
    `SELECT n.nspname AS schema, c.relname AS table, pg_relation_size(c.oid)::text AS heap,
            (CASE WHEN c.reltoastrelid = 0 THEN 0 ELSE pg_relation_size(c.reltoastrelid) END)::text AS toast,
            (CASE WHEN c.reltuples >= 0 THEN c.reltuples ELSE pg_stat_get_live_tuples(c.oid) END)::bigint::text AS rows
       FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
      WHERE n.nspname = ANY($1::text[]) AND c.relkind = 'r'`,
    [schemas],
  );
  return new Map(
    result.rows.map((r) => [
      qualified(r.schema, r.table),
      {
        schema: r.schema,
        heapBytes: Number(r.heap),
        bytes: Number(r.heap) + Number(r.toast),
        rows: Number(r.rows),
      },
    ]),
  );
}

/** How often the meter reports while bytes flow, and the window its rate is measured over. */
const EVENT_EVERY_MS = 500;
const RATE_WINDOW_MS = 10_000;

export interface MeterOptions {
  readonly moveId: string;
  readonly source: string;
  readonly target: string;
  /** The tables this run copies (quoted names) with their estimates. */
  readonly tables: ReadonlyMap<string, TableEstimate>;
  readonly onProgress?: ((event: MoveProgressEvent) => void) | undefined;
  /** Bytes a second the COPY streams may carry in all (--max-rate); none when undefined. */
  readonly maxRate?: number | undefined;
  /** Called about once a second while bytes flow (the WAL guard); what it throws stops the copy. */
  readonly check?: (() => Promise<void>) | undefined;
}

/** The copy's bytes and rows as they pass, reported as events; paces the streams (maxRate) and calls the guard (check). */
export class CopyMeter {
  readonly #options: MeterOptions;
  readonly #started = performance.now();
  #bytes = 0;
  /**
   * Per table: stream bytes so far, the exact rows of its pieces copied (the table, or its chunks),
   * the bytes of chunks an earlier run copied that this one keeps, and whether it is done.
   */
  readonly #progress = new Map<string, { bytes: number; rows: number; kept: number; done: boolean }>();
  readonly #samples: { at: number; bytes: number }[] = [];
  #lastEvent = -Infinity;
  #lastCheck = performance.now();
  #checking: Promise<void> | null = null;
  /** Rows reported never go back when a table's exact count replaces its estimate. */
  #rowsShown = 0;

  constructor(options: MeterOptions) {
    this.#options = options;
    this.#samples.push({ at: this.#started, bytes: 0 });
  }

  /** The first event, before any byte: the totals. */
  start(): void {
    this.#emit(true);
  }

  #entry(table: string): { bytes: number; rows: number; kept: number; done: boolean } {
    let entry = this.#progress.get(table);
    if (!entry) this.#progress.set(table, (entry = { bytes: 0, rows: 0, kept: 0, done: false }));
    return entry;
  }

  /**
   * A pass-through for a COPY stream of a table (the whole table, or one of its chunks): counts its
   * bytes, and holds them back while the copy runs ahead of maxRate (all the move's streams
   * together, from the copy's start).
   */
  stream(table: string): Transform {
    const entry = this.#entry(table);
    return new Transform({
      transform: (chunk: Buffer, _encoding, callback: TransformCallback) => {
        entry.bytes += chunk.length;
        this.#bytes += chunk.length;
        this.#emit(false);
        this.#pace().then(
          () => callback(null, chunk),
          (error: unknown) => callback(error as Error),
        );
      },
    });
  }

  /** The stream bytes of `table` so far. */
  streamed(table: string): number {
    return this.#progress.get(table)?.bytes ?? 0;
  }

  /** A piece of a table copied (a chunk, or the whole table), with the rows its COPY reported. */
  piece(table: string, rows: number): void {
    this.#entry(table).rows += rows;
    this.#emit(true);
  }

  /** Chunks of `table` an earlier run copied and this one keeps: their bytes are not to be copied. */
  kept(table: string, bytes: number): void {
    this.#entry(table).kept += bytes;
  }

  /** A table copied whole, with the rows its COPY reported. */
  finished(table: string, rows: number): void {
    const entry = this.#entry(table);
    entry.rows += rows;
    entry.done = true;
    this.#emit(true);
  }

  /** A chunked table done (its chunks reported with piece). */
  tableDone(table: string): void {
    this.#entry(table).done = true;
    this.#emit(true);
  }

  /** The last event: done. */
  end(): void {
    this.#emit(true, true);
  }

  /** Stream bytes a second since the copy started: what the run reached. */
  get averageRate(): number | null {
    const seconds = (performance.now() - this.#started) / 1000;
    return seconds > 0 && this.#bytes > 0 ? this.#bytes / seconds : null;
  }

  get bytes(): number {
    return this.#bytes;
  }

  async #pace(): Promise<void> {
    const { maxRate, check } = this.#options;
    if (check && performance.now() - this.#lastCheck >= CHECK_EVERY_MS) {
      this.#lastCheck = performance.now();
      // One look at a time for all the streams of the move.
      this.#checking ??= check().finally(() => (this.#checking = null));
    }
    if (this.#checking) await this.#checking;
    if (maxRate !== undefined) {
      const ahead = (this.#bytes / maxRate) * 1000 - (performance.now() - this.#started);
      if (ahead > 0) await sleep(ahead);
    }
  }

  #emit(force: boolean, done = false): void {
    const now = performance.now();
    if (!force && now - this.#lastEvent < EVENT_EVERY_MS) return;
    this.#lastEvent = now;
    this.#samples.push({ at: now, bytes: this.#bytes });
    while (this.#samples.length > 2 && now - this.#samples[1]!.at >= RATE_WINDOW_MS) this.#samples.shift();
    const { onProgress } = this.#options;
    if (!onProgress) return;
    const first = this.#samples[0]!;
    const span = (now - first.at) / 1000;
    const rate = span >= 0.2 && this.#bytes > 0 ? (this.#bytes - first.bytes) / span : null;
    const totals = this.#totals();
    const { totalBytes } = totals;
    const rows = (this.#rowsShown = Math.max(this.#rowsShown, totals.rows));
    const totalRows = Math.max(totals.totalRows, rows);
    onProgress({
      kind: 'copy',
      moveId: this.#options.moveId,
      source: this.#options.source,
      target: this.#options.target,
      bytes: this.#bytes,
      totalBytes: done ? this.#bytes : totalBytes,
      rows,
      totalRows: done ? rows : totalRows,
      bytesPerSecond: rate === null ? null : Math.round(rate),
      etaMs: done ? 0 : rate ? Math.round(((totalBytes - this.#bytes) / rate) * 1000) : null,
      elapsedMs: Math.round(now - this.#started),
      done,
    });
  }

  /** The estimated totals: a table done at its exact figures, the others at their size scaled by what the done ones gave. */
  #totals(): { totalBytes: number; rows: number; totalRows: number } {
    let doneStream = 0;
    let doneSize = 0;
    for (const [table, p] of this.#progress) {
      if (!p.done) continue;
      doneStream += p.bytes + p.kept;
      doneSize += this.#options.tables.get(table)?.bytes ?? 0;
    }
    const ratio = doneSize > 0 && doneStream > 0 ? doneStream / doneSize : 1;
    let totalBytes = 0;
    let rows = 0;
    let totalRows = 0;
    for (const [table, estimate] of this.#options.tables) {
      const p = this.#progress.get(table);
      if (p?.done) {
        totalBytes += p.bytes;
        rows += p.rows;
        totalRows += p.rows;
        continue;
      }
      const expected = Math.max(estimate.bytes * ratio - (p?.kept ?? 0), p?.bytes ?? 0);
      totalBytes += expected;
      totalRows += estimate.rows;
      if (p && expected > 0) rows += Math.max(p.rows, Math.floor(estimate.rows * Math.min(1, p.bytes / expected)));
    }
    return { totalBytes: Math.max(Math.round(totalBytes), this.#bytes), rows, totalRows: Math.max(totalRows, rows) };
  }
}

/** How often the guard (check) is called while the copy runs. */
const CHECK_EVERY_MS = 1000;

/** The rate a dry run assumes when no move on the hosts measured one: stated in its output. */
export const DEFAULT_COPY_BYTES_PER_SECOND = 50 * 1024 * 1024;

/** What a move's copy is expected to take: each shard's size and rows, and the time at a rate. */
export interface CopyEstimate {
  readonly shards: readonly { readonly shard: number; readonly bytes: number; readonly rows: number }[];
  readonly bytes: number;
  readonly rows: number;
  readonly bytesPerSecond: number;
  /** `measured`: the last copy recorded on either host; `default`: DEFAULT_COPY_BYTES_PER_SECOND. */
  readonly rateFrom: 'measured' | 'default';
  readonly seconds: number;
}

/** The COPY rate the latest move recorded on `client`'s host reached, if any (its record's detail). */
const LAST_COPY_RATE_SQL = `SELECT (detail->>'copyBytesPerSecond')::float8 AS rate, updated_at
       FROM ${CONTROL}.moves WHERE detail ? 'copyBytesPerSecond' ORDER BY updated_at DESC LIMIT 1`;

export async function estimateCopy(
  source: pg.Client,
  target: pg.Client,
  schemaOf: (shard: number) => string,
  shards: readonly number[],
): Promise<CopyEstimate> {
  const lastRate = async (client: pg.Client): Promise<{ rate: number; updated_at: Date } | null> => {
    // A host whose control schema is older or missing has no rate to give.
    const r = await client.query<{ rate: number; updated_at: Date }>(LAST_COPY_RATE_SQL).catch(() => null);
    return r?.rows[0] ?? null;
  };
  const [tables, ...rates] = await Promise.all([
    tableEstimates(source, shards.map(schemaOf)),
    lastRate(source),
    lastRate(target),
  ]);
  const latest = rates
    .filter((r): r is { rate: number; updated_at: Date } => r !== null && r.rate > 0)
    .sort((a, b) => b.updated_at.getTime() - a.updated_at.getTime())[0];
  const bySchema = new Map<string, { bytes: number; rows: number }>();
  for (const t of tables.values()) {
    const sum = bySchema.get(t.schema) ?? { bytes: 0, rows: 0 };
    sum.bytes += t.bytes;
    sum.rows += t.rows;
    bySchema.set(t.schema, sum);
  }
  const perShard = shards.map((shard) => ({ shard, ...(bySchema.get(schemaOf(shard)) ?? { bytes: 0, rows: 0 }) }));
  const bytes = perShard.reduce((n, s) => n + s.bytes, 0);
  const rate = latest?.rate ?? DEFAULT_COPY_BYTES_PER_SECOND;
  return {
    shards: perShard,
    bytes,
    rows: perShard.reduce((n, s) => n + s.rows, 0),
    bytesPerSecond: Math.round(rate),
    rateFrom: latest ? 'measured' : 'default',
    seconds: Math.round((bytes / rate) * 10) / 10,
  };
}
