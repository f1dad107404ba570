import { pipeline } from 'node:stream/promises';
import type pg from 'pg';
import type copyStreamsModule from 'pg-copy-streams';
import { CONTROL } from '../fleet/control.js';
import { quoteIdent, quoteLiteral } from '../pg/quote.js';
import type { CopyMeter } from './copy-meter.js';
import { BEGIN_COPY_SQL } from './sql/copy.js';
import { HASH_SQL, STABLE_TEXT_SETTINGS, type HashMethod } from './sql/verify.js';

/**
 * The chunks of a move's online copy: a table of more than `chunkRows` estimated rows with a primary
 * key is copied in ranges of the key's first column (one without, in ranges of its blocks:
 * block-chunks.ts), each range in a target transaction of its own
 * that also marks its row of `shardctl.move_chunks` copied. A run cut off keeps every chunk it
 * committed; the next run (a new slot, so a new snapshot: the exported snapshot died with the
 * killed run's connection) copies the chunks not copied yet from the new snapshot, and reconciles
 * those copied before: each one's count and checksum of its range are compared, the source's as of
 * the new snapshot, the target's as it is (nothing else writes there before the subscription
 * starts), and a range that differs (rows changed on the source between the two snapshots) is
 * deleted and copied again from the new snapshot. Then every range holds the source's rows as of
 * the new slot's snapshot, and the subscription streams exactly the changes after it. The whole
 * argument is in docs/moves.md (step 4, "A copy that resumes").
 */

/**
 * The key of a table without a primary key, copied by ranges of the source's blocks
 * (block-chunks.ts): `ctid`, a system column no user column can be named after.
 */
export const BLOCK_KEY = 'ctid';

/** A chunk's range: lo <= key < hi, either end open (null). */
export interface ChunkRange {
  /** The key column, quoted, or BLOCK_KEY. */
  readonly key: string;
  readonly lo: string | null;
  readonly hi: string | null;
}

export interface ChunkRecord extends ChunkRange {
  readonly table: string;
  readonly chunk: number;
  readonly copied: boolean;
  /** Once copied: the rows and the COPY stream's bytes. */
  readonly rows: number | null;
  readonly bytes: number | null;
}

/** The WHERE condition of a range; the bounds as literals (COPY takes no parameters), typed by the column they meet. */
export function rangeConditionSql(range: ChunkRange): string {
  const parts = [
    ...(range.lo === null ? [] : [`${range.key} >= ${quoteLiteral(range.lo)}`]),
    ...(range.hi === null ? [] : [`${range.key} < ${quoteLiteral(range.hi)}`]),
  ];
  return parts.length === 0 ? 'true' : parts.join(' AND ');
}

/** The COPY of one range out of the source (`table` quoted, `columns` quoted: every stored column). */
export function chunkCopyOutSql(table: string, columns: readonly string[], range: ChunkRange, binary: boolean): string {
  return `COPY (SELECT ${columns.join(', ')} FROM ${table} WHERE ${rangeConditionSql(range)}) TO STDOUT${binary ? ' (FORMAT binary)' : ''}`;
}

export function chunkCopyInSql(table: string, columns: readonly string[], binary: boolean): string {
  return `COPY ${table} (${columns.join(', ')}) FROM STDIN${binary ? ' (FORMAT binary)' : ''}`;
}

/**
 * A range's count and checksum: of its rows' text by default (the settings of STABLE_TEXT_SETTINGS
 * on the session), or by the verification's method of the table (copy-logs.ts).
 */
export function rangeChecksumSql(table: string, range: ChunkRange, method: HashMethod = 'text'): string {
  return `SELECT count(*)::text AS rows, coalesce(sum(${HASH_SQL[method]}), 0)::text AS checksum FROM ${table} t WHERE ${rangeConditionSql(range)}`;
}

/**
 * The bounds that cut `table` into ranges of about `rows` rows by `key`: every rows-th key in key
 * order, distinct (a composite key's first column may repeat), in one scan of the key.
 */
export function chunkBoundsSql(table: string, key: string, rows: number): string {
  if (!Number.isSafeInteger(rows) || rows < 1) throw new Error(`internal error: chunk rows ${rows}`);
  return `SELECT DISTINCT b::text AS bound, b FROM (SELECT ${key} AS b, row_number() OVER (ORDER BY ${key}) AS n FROM ${table}) s
      WHERE n % ${rows} = 0 ORDER BY b`;
}

/** The first column of each table's primary key, and its stored columns (not generated), for the tables given (quoted names). */
export async function keysAndColumns(
  client: pg.Client,
  tables: readonly string[],
): Promise<Map<string, { key: string | null; columns: string[] }>> {
  if (tables.length === 0) return new Map();
  const r = await client.query<{ name: string; key: string | null; columns: string[] }>(
    `SELECT t.name,
            (SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
              WHERE i.indrelid = t.name::regclass AND i.indisprimary) AS key,
            ARRAY(SELECT a.attname FROM pg_attribute a WHERE a.attrelid = t.name::regclass AND a.attnum > 0
                   AND NOT a.attisdropped AND a.attgenerated = '' ORDER BY a.attnum)::text[] AS columns
       FROM unnest($1::text[]) AS t(name)`,
    [tables],
  );
  return new Map(
    r.rows.map((row) => [
      row.name,
      { key: row.key === null ? null : quoteIdent(row.key), columns: row.columns.map(quoteIdent) },
    ]),
  );
}

/** The chunks of move $1 recorded on the target. */
const CHUNKS_SQL = `SELECT table_name, chunk, key_column, lo, hi, copied, rows::float8 AS rows, bytes::float8 AS bytes FROM ${CONTROL}.move_chunks WHERE move_id = $1 ORDER BY table_name, chunk`;

export async function recordedChunks(target: pg.Client, moveId: string): Promise<ChunkRecord[]> {
  const r = await target.query<{
    table_name: string;
    chunk: number;
    key_column: string;
    lo: string | null;
    hi: string | null;
    copied: boolean;
    rows: number | null;
    bytes: number | null;
  }>(CHUNKS_SQL, [moveId]);
  return r.rows.map((row) => ({
    table: row.table_name,
    chunk: row.chunk,
    key: row.key_column,
    lo: row.lo,
    hi: row.hi,
    copied: row.copied,
    rows: row.rows,
    bytes: row.bytes,
  }));
}

/** The chunks of a move, once it no longer needs them (clean-up, abort). */
export const DELETE_CHUNKS_SQL = `DELETE FROM ${CONTROL}.move_chunks WHERE move_id = $1`;

/**
 * Plans `table`'s chunks by ranges of `key` as the reader sees it (the copy's snapshot), recorded
 * on the writer (recordPlan).
 */
export async function planChunks(
  reader: pg.Client,
  writer: pg.Client,
  moveId: string,
  table: string,
  key: string,
  rows: number,
  after: string | null = null,
): Promise<ChunkRecord[]> {
  const bounds = (await reader.query<{ bound: string }>(chunkBoundsSql(table, key, rows))).rows.map((r) => r.bound);
  return recordPlan(writer, moveId, table, key, bounds, { after });
}

/**
 * The chunks cut at `bounds` (in order; the first and the last open-ended) recorded on the writer
 * in one transaction, none copied, with the table emptied first (a migration's seed rows give way
 * to the source's, an earlier run's rows to this run's; TRUNCATE leaves no dead rows), then `after`
 * (the table's change log on the target: copy-logs.ts). `replace`: the table's records of an earlier
 * plan are deleted in the same transaction.
 */
export async function recordPlan(
  writer: pg.Client,
  moveId: string,
  table: string,
  key: string,
  bounds: readonly string[],
  { replace = false, after }: { readonly replace?: boolean; readonly after?: string | null } = {},
): Promise<ChunkRecord[]> {
  const edges = [null, ...bounds, null];
  const chunks: ChunkRecord[] = edges
    .slice(0, -1)
    .map((lo, i) => ({ table, chunk: i, key, lo, hi: edges[i + 1]!, copied: false, rows: null, bytes: null }));
  await writer.query('BEGIN');
  try {
    await writer.query(`TRUNCATE ${table}`);
    if (after) await writer.query(after);
    if (replace)
      await writer.query(`DELETE FROM ${CONTROL}.move_chunks WHERE move_id = $1 AND table_name = $2`, [moveId, table]);
    await writer.query(
      `INSERT INTO ${CONTROL}.move_chunks (move_id, table_name, chunk, key_column, lo, hi)
       SELECT $1, $2, c.i, $3, c.lo, c.hi FROM unnest($4::int[], $5::text[], $6::text[]) AS c(i, lo, hi)`,
      [moveId, table, key, chunks.map((c) => c.chunk), chunks.map((c) => c.lo), chunks.map((c) => c.hi)],
    );
    await writer.query('COMMIT');
  } catch (error) {
    await writer.query('ROLLBACK').catch(() => undefined);
    throw error;
  }
  return chunks;
}

/**
 * Whether a chunk copied by an earlier run still holds the source's rows as the reader sees them:
 * the range's count and checksum on both (by `method`, the verification's of the table when its
 * figures are kept: copy-logs.ts), returned with the answer. The reader's and the writer's sessions
 * have the stable text settings (STABLE_TEXT_SETTINGS).
 */
export async function chunkMatches(
  reader: pg.Client,
  writer: pg.Client,
  chunk: ChunkRecord,
  method: HashMethod = 'text',
): Promise<{ matches: boolean; sums: ChunkSums }> {
  // By the key's index, as copyChunk's sums: the target's table may have no statistics yet, and a
  // seq scan per chunk would read the whole table once for each.
  const sql = `SET LOCAL enable_seqscan = off; ${rangeChecksumSql(chunk.table, chunk, method)}; SET LOCAL enable_seqscan = on`;
  const sum = async (client: pg.Client) =>
    ((await client.query(sql)) as unknown as pg.QueryResult<{ rows: string; checksum: string }>[])[1]!.rows[0]!;
  const [source, target] = await Promise.all([sum(reader), sum(writer)]);
  const sums = { source, target };
  return { matches: sums.source.rows === sums.target.rows && sums.source.checksum === sums.target.checksum, sums };
}

/** The settings under which both sides of chunkMatches give a row the same text. */
export const CHUNK_TEXT_SETTINGS = STABLE_TEXT_SETTINGS;

/** A chunk's count and checksum on each host, as copied. */
export interface ChunkSums {
  readonly source: { readonly rows: string; readonly checksum: string };
  readonly target: { readonly rows: string; readonly checksum: string };
}

/**
 * Copies one chunk in a target transaction of its own: the range deleted first (rows of an earlier
 * run's copy of it, reconciled as different; none otherwise), the COPY, and the chunk's record
 * marked copied, committed together. With `sums` (a checksum method), the range's count and
 * checksum are taken before the commit on both hosts (the source's in the reader's snapshot, the
 * target's in the copy's transaction) and returned (copy-logs.ts).
 */
export async function copyChunk(
  streams: typeof copyStreamsModule,
  reader: pg.Client,
  writer: pg.Client,
  moveId: string,
  chunk: ChunkRecord,
  columns: readonly string[],
  binary: boolean,
  meter: CopyMeter,
  sums?: HashMethod,
): Promise<ChunkSums | null> {
  await writer.query(BEGIN_COPY_SQL).catch(() => writer.query('ROLLBACK TO SAVEPOINT replica_role'));
  try {
    // A block range means nothing on the target (block-chunks.ts): such a chunk is copied once into
    // a table this run emptied.
    if (chunk.key !== BLOCK_KEY) await writer.query(`DELETE FROM ${chunk.table} WHERE ${rangeConditionSql(chunk)}`);
    const out = reader.query(streams.to(chunkCopyOutSql(chunk.table, columns, chunk, binary)));
    const into = writer.query(streams.from(chunkCopyInSql(chunk.table, columns, binary)));
    const before = meter.streamed(chunk.table);
    await pipeline(out, meter.stream(chunk.table), into);
    meter.piece(chunk.table, into.rowCount);
    let summed: ChunkSums | null = null;
    if (sums) {
      // By the key's index: a seq scan per chunk would read the whole table each time (the
      // target's, just truncated, has no statistics to say otherwise).
      const sql = `SET LOCAL enable_seqscan = off; ${rangeChecksumSql(chunk.table, chunk, sums)}; SET LOCAL enable_seqscan = on`;
      const sum = async (client: pg.Client) =>
        (await client.query(sql)) as unknown as pg.QueryResult<{ rows: string; checksum: string }>[];
      const [source, target] = await Promise.all([sum(reader), sum(writer)]);
      summed = { source: source[1]!.rows[0]!, target: target[1]!.rows[0]! };
    }
    await writer.query(
      `UPDATE ${CONTROL}.move_chunks SET copied = true, rows = $4, bytes = $5 WHERE move_id = $1 AND table_name = $2 AND chunk = $3`,
      [moveId, chunk.table, chunk.chunk, into.rowCount, meter.streamed(chunk.table) - before],
    );
    await writer.query('COMMIT');
    return summed;
  } catch (error) {
    await writer.query('ROLLBACK').catch(() => undefined);
    throw error;
  }
}
