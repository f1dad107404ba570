import type pg from 'pg';
import { quoteLiteral } from '../pg/quote.js';
import { BLOCK_KEY, recordPlan, type ChunkRecord } from './chunks.js';

/**
 * Tables without a primary key copied in chunks (chunks.ts): ranges of the source's blocks, read as
 * `ctid >= '(a,0)' AND ctid < '(b,0)'` under the copy's one snapshot (a TID range scan, PostgreSQL
 * 14 and later: each chunk reads only its blocks). Every row the snapshot sees is one tuple at one
 * ctid (the snapshot holds back the pruning of its versions), and the ranges cover every block, the
 * last one open-ended: the chunks hold each row once. Progress, --max-rate and the parallel pairs
 * then work for such a table as for a keyed one.
 *
 * What a resume cannot do for them: a block range means nothing on the target, where the rows lie
 * elsewhere, and a new snapshot (the killed run's died with its connection) sees rows the old one
 * did not, in blocks already copied. So a run that finds an earlier plan for such a table empties it
 * (TRUNCATE, no dead rows) and copies it again whole, in new chunks from its own snapshot; keyed
 * tables keep their chunk records (chunks.ts reconcileChunks).
 */

/** TID range scans: from PostgreSQL 14 (before, each chunk would read the whole table). */
export const BLOCK_CHUNKS_FROM = 140000;

/** The table's size in blocks, as the server sees it now (the relation's files, not MVCC). */
export function blockCountSql(table: string): string {
  return `SELECT (pg_relation_size(${quoteLiteral(table)}::regclass) / current_setting('block_size')::bigint)::float8 AS blocks`;
}

/**
 * The bounds that cut `blocks` blocks holding about `rows` rows into ranges of about `chunkRows`
 * rows: `(b,0)` every that many blocks, none for a table of one range.
 */
export function blockBounds(blocks: number, rows: number, chunkRows: number): string[] {
  if (!Number.isSafeInteger(chunkRows) || chunkRows < 1) throw new Error(`internal error: chunk rows ${chunkRows}`);
  if (blocks <= 1 || rows <= chunkRows) return [];
  const per = Math.max(1, Math.floor((blocks * chunkRows) / rows));
  const bounds: string[] = [];
  for (let b = per; b < blocks; b += per) bounds.push(`(${b},0)`);
  return bounds;
}

/**
 * Plans a keyless table's block chunks: its blocks counted by the reader (in the copy's snapshot
 * transaction; a block added since holds no row the snapshot sees, and the last range is open
 * anyway), `rows` its estimated rows. `replace`: an earlier run planned it; its records and rows
 * give way (see above).
 */
export async function planBlockChunks(
  reader: pg.Client,
  writer: pg.Client,
  moveId: string,
  table: string,
  rows: number,
  chunkRows: number,
  replace: boolean,
): Promise<ChunkRecord[]> {
  const blocks = (await reader.query<{ blocks: number }>(blockCountSql(table))).rows[0]!.blocks;
  return recordPlan(writer, moveId, table, BLOCK_KEY, blockBounds(blocks, rows, chunkRows), { replace });
}
