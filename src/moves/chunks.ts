import { pipeline } from 'node:stream/promises';
import type pg from 'pg';
import { sleep } from '../clock.js';
import type copyStreamsModule from 'pg-copy-streams';
import { CONTROL } from '../fleet/control.js';
import { quoteIdent, quoteLiteral } from '../pg/quote.js';
import type { CopyMeter } from './copy-meter.js';
import { BEGIN_COPY_SQL } from './sql/copy.js';
import { BUILDING_LOCAL_SQL } from './sql/incoming.js';
import { EXACT_KEY_TYPES } from './catalog.js';
import { TIMELINE_SQL } from './sql/failover.js';
import { LOG_START } from './sql/tail.js';
import { STABLE_TEXT_SETTINGS, sumsColumnsSql, type HashMethod } from './sql/verify.js';

/**
 * The chunks of a move's online copy: a table of more than `chunkRows` estimated rows with a primary
 * key is copied in ranges of the key's first column (one without, in ranges of its blocks:
 * block-chunks.ts), each range in a target transaction of its own
 * that also marks its row of `shardctl.move_chunks` copied. A run cut off keeps every chunk it
 * committed; the next run (a new slot, so a new snapshot: the exported snapshot died with the
 * killed run's connection) copies the chunks not copied yet from the new snapshot, and reconciles
 * those copied before: each one's count and checksum of its range are compared (all of a table's
 * in one scan on each host: reconcileChunks), the source's as of the new snapshot, the target's as
 * it is (nothing else writes there before the subscription starts), and a range that differs (rows
 * changed on the source between the two snapshots) is deleted and copied again from the new
 * snapshot. Then every range holds the source's rows as of
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
  /** Once copied: the source's snapshot it was copied from (pg_snapshot's text), when known. */
  readonly snapshot: string | null;
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
 * The bounds that cut `table` into ranges of about `rows` rows by `key`: every rows-th key in key
 * order, distinct (a composite key's first column may repeat), in one scan of the key.
 */
export function chunkBoundsSql(table: string, key: string, rows: number): string {
  if (!Number.isSafeInteger(rows) || rows < 1) throw new Error(`internal error: chunk rows ${rows}`);
  return `SELECT DISTINCT b::text AS bound, b FROM (SELECT ${key} AS b, row_number() OVER (ORDER BY ${key}) AS n FROM ${table}) s
      WHERE n % ${rows} = 0 ORDER BY b`;
}

/** A chunked table's key and columns (keysAndColumns). */
export interface TableShape {
  /** The first column of the primary key, quoted; null without one. */
  readonly key: string | null;
  /**
   * The same column's name as the catalog has it (pg_stats), and its type, qualified (a session of
   * the copy may have any search path) and without a modifier (a cast to compare with, not to store).
   */
  readonly keyName: string | null;
  readonly keyType: string | null;
  /** Every stored column (not generated), quoted, in order. */
  readonly columns: string[];
  /** The key column's collation, qualified and quoted; null for a type without one. */
  readonly keyCollation: string | null;
}

/** The first column of each table's primary key, its type, and the stored columns, for the tables given (quoted names). */
export async function keysAndColumns(client: pg.Client, tables: readonly string[]): Promise<Map<string, TableShape>> {
  if (tables.length === 0) return new Map();
  const r = await client.query<{
    name: string;
    key: string | null;
    key_type: string | null;
    key_collation: string | null;
    columns: string[];
  }>(
    `SELECT t.name, k.attname AS key, (SELECT format('%I.%I', tn.nspname, ty.typname) FROM pg_type ty
              JOIN pg_namespace tn ON tn.oid = ty.typnamespace WHERE ty.oid = k.atttypid) AS key_type,
            (SELECT format('%I.%I', cn.nspname, co.collname) FROM pg_collation co
              JOIN pg_namespace cn ON cn.oid = co.collnamespace WHERE co.oid = k.attcollation) AS key_collation,
            ARRAY(SELECT a.attname FROM pg_attribute a WHERE a.attrelid = t.name::regclass AND a.attnum > 0
                   AND NOT a.attisdropped AND a.attgenerated = '' ORDER BY a.attnum)::text[] AS columns
       FROM unnest($1::text[]) AS t(name)
       LEFT JOIN LATERAL (SELECT a.attname, a.atttypid, a.atttypmod, a.attcollation FROM pg_index i
                            JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
                           WHERE i.indrelid = t.name::regclass AND i.indisprimary) k ON true`,
    [tables],
  );
  return new Map(
    r.rows.map((row) => [
      row.name,
      {
        key: row.key === null ? null : quoteIdent(row.key),
        keyName: row.key,
        keyType: row.key_type,
        keyCollation: row.key_collation,
        columns: row.columns.map(quoteIdent),
      },
    ]),
  );
}

/** The chunks of move $1 recorded on the target. */
const CHUNKS_SQL = `SELECT table_name, chunk, key_column, lo, hi, copied, rows::float8 AS rows, bytes::float8 AS bytes, snapshot FROM ${CONTROL}.move_chunks WHERE move_id = $1 ORDER BY table_name, chunk`;

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
    snapshot: string | null;
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
    snapshot: row.snapshot,
  }));
}

/** The chunks of a move, once it no longer needs them (clean-up, abort). */
export const DELETE_CHUNKS_SQL = `DELETE FROM ${CONTROL}.move_chunks WHERE move_id = $1`;

/**
 * The bounds of about `chunkRows` rows each from the key's statistics (pg_stats.histogram_bounds:
 * buckets of equal rows as of the last ANALYZE, autovacuum's or anyone's), without reading the
 * table: every k-th bound, the first and the last left out (the end ranges are open). Null when the
 * column has no histogram, or one of fewer buckets than the chunks wanted: then the table's keys
 * are read (chunkBoundsSql). Bounds need not be exact, only ordered: the ranges cover every key
 * whatever they are, and stale statistics only make some chunks larger than others.
 */
export async function statisticsBounds(
  reader: pg.Client,
  table: string,
  keyName: string,
  estimatedRows: number,
  chunkRows: number,
): Promise<string[] | null> {
  const r = await reader.query<{ bounds: string[] | null }>(STATISTICS_BOUNDS_SQL, [table, keyName]);
  const histogram = r.rows[0]?.bounds ?? null;
  return histogram === null ? null : boundsFromHistogram(histogram, estimatedRows, chunkRows);
}

/** The key column's histogram as text, of table $1 (quoted) and column $2 (its name). */
const STATISTICS_BOUNDS_SQL = `SELECT s.histogram_bounds::text::text[] AS bounds
   FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
   JOIN pg_stats s ON s.schemaname = n.nspname AND s.tablename = c.relname
  WHERE c.oid = $1::regclass AND s.attname = $2 AND NOT s.inherited`;

/** Every k-th bound of a histogram for chunks of about `chunkRows` of `rows` rows; null if it has too few buckets. */
export function boundsFromHistogram(histogram: readonly string[], rows: number, chunkRows: number): string[] | null {
  if (!Number.isSafeInteger(chunkRows) || chunkRows < 1) throw new Error(`internal error: chunk rows ${chunkRows}`);
  const buckets = histogram.length - 1;
  const wanted = Math.ceil(rows / chunkRows);
  if (wanted <= 1) return [];
  if (buckets < wanted) return null;
  const bounds: string[] = [];
  for (let k = 1; k < wanted; k++) {
    const bound = histogram[Math.round((k * buckets) / wanted)]!;
    if (bounds.at(-1) !== bound) bounds.push(bound);
  }
  return bounds;
}

/**
 * Plans `table`'s chunks by ranges of its key: bounds from the key's statistics where they have
 * enough buckets (statisticsBounds), otherwise read by the reader (the copy's snapshot); recorded
 * on the writer (recordPlan; `replace`: an earlier plan's records give way).
 */
export async function planChunks(
  reader: pg.Client,
  writer: pg.Client,
  moveId: string,
  table: string,
  shape: { readonly key: string; readonly keyName: string | null },
  { chunkRows, estimatedRows }: { readonly chunkRows: number; readonly estimatedRows: number },
  after: string | null = null,
  replace = false,
): Promise<ChunkRecord[]> {
  const fromStatistics =
    shape.keyName === null ? null : await statisticsBounds(reader, table, shape.keyName, estimatedRows, chunkRows);
  const bounds =
    fromStatistics ??
    (await reader.query<{ bound: string }>(chunkBoundsSql(table, shape.key, chunkRows))).rows.map((r) => r.bound);
  return recordPlan(writer, moveId, table, shape.key, bounds, { after, replace });
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
  const chunks: ChunkRecord[] = edges.slice(0, -1).map((lo, i) => ({
    table,
    chunk: i,
    key,
    lo,
    hi: edges[i + 1]!,
    copied: false,
    rows: null,
    bytes: null,
    snapshot: null,
  }));
  // Past the incoming copy's guard (sql/incoming.ts); the copy's own setting would leave the
  // TRUNCATE out of a target log left from an earlier run.
  await writer.query(`BEGIN; ${BUILDING_LOCAL_SQL}`);
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

/** A count and checksum, as text (sum of 64-bit hashes: a numeric). */
export interface Sums {
  readonly rows: string;
  readonly checksum: string;
}

/**
 * The count and checksum of each chunk of `table` as `client` sees it, in one scan: rows grouped by
 * the chunk their key falls in (width_bucket over the bounds, cast to the key's type: the ranges of
 * rangeConditionSql, chunk i holding lo <= key < hi). A chunk of no row is absent.
 */
export function chunkSumsSql(
  table: string,
  key: string,
  keyType: string,
  bounds: readonly string[],
  method: HashMethod,
): string {
  const bucket = chunkOfSql(key, keyType, bounds);
  return `SELECT ${bucket} AS chunk, ${sumsColumnsSql(method)} FROM ${table} t GROUP BY 1`;
}

/**
 * The chunk a row's key falls in, of the chunks cut at `bounds` (literals cast to the key's type).
 * `key` is the column itself (its collation is the ranges'), or an expression of the key's type
 * with the column's collation given (`collation`).
 */
function chunkOfSql(key: string, keyType: string, bounds: readonly string[], collation: string | null = null): string {
  if (bounds.length === 0) return '0';
  const value = collation === null ? key : `(${key} COLLATE ${collation})`;
  return `width_bucket(${value}, ${quoteLiteral(`{${bounds.map(arrayElement).join(',')}}`)}::${keyType}[])`;
}

/**
 * The chunk of a key as the change log records it (`keyText`: its text form, to_jsonb's), read back
 * as the key's type with the column's collation: the chunk of rangeConditionSql's ranges that holds
 * it (test/integration/chunk-sums.test.ts).
 */
export function chunkOfLoggedKeySql(
  keyText: string,
  keyType: string,
  bounds: readonly string[],
  keyCollation: string | null,
): string {
  return chunkOfSql(`(${keyText})::${keyType}`, keyType, bounds, keyCollation);
}

/** An array literal's element: quoted, with its quotes and backslashes escaped. */
function arrayElement(value: string): string {
  return `"${value.replace(/[\\"]/g, (c) => `\\${c}`)}"`;
}

/**
 * Reconciles the chunks of `table` an earlier run copied (its snapshot) with the source as the
 * reader sees it now (this run's snapshot): every chunk's count and checksum on both hosts, one
 * scan each at once (chunkSumsSql; no index needed, the target's may be dropped for the copy). A
 * chunk recorded copied is kept if the two are equal. Any other chunk holding rows on the target (a
 * copied one that differs; one not recorded copied holds none, unless something wrote there behind
 * the move) has them deleted, and is marked not copied, in one transaction: it is copied again.
 * Returns the chunks kept, those to copy (in chunk order) and which of them were copied before, and the source's sums of the whole
 * table in the reader's snapshot (the sum of every chunk's), for the copy's figures (copy-logs.ts).
 * The sessions have the stable text settings (STABLE_TEXT_SETTINGS) when `method` is 'text'.
 */
export async function reconcileChunks(
  reader: pg.Client,
  writer: pg.Client,
  moveId: string,
  chunks: readonly ChunkRecord[],
  keyType: string,
  method: HashMethod,
): Promise<SettledChunks & { source: Sums }> {
  const { table, key } = chunks[0]!;
  const bounds = chunks.slice(1).map((c) => c.lo!);
  const sql = chunkSumsSql(table, key, keyType, bounds, method);
  const byChunk = async (client: pg.Client) =>
    new Map(
      (await client.query<{ chunk: number; rows: string; checksum: string }>(sql)).rows.map((r) => [
        Number(r.chunk),
        { rows: r.rows, checksum: r.checksum },
      ]),
    );
  const [source, target] = await Promise.all([byChunk(reader), byChunk(writer)]);
  const none = { rows: '0', checksum: '0' };
  const differ = (chunk: ChunkRecord) => {
    const s = source.get(chunk.chunk) ?? none;
    const t = target.get(chunk.chunk) ?? none;
    return s.rows !== t.rows || s.checksum !== t.checksum;
  };
  const settled = await settleChunks(writer, moveId, chunks, keyType, differ, (chunk) => target.has(chunk.chunk));
  let rows = 0n;
  let checksum = 0n;
  for (const s of source.values()) {
    rows += BigInt(s.rows);
    checksum += BigInt(s.checksum);
  }
  return { ...settled, source: { rows: rows.toString(), checksum: checksum.toString() } };
}

/** The chunks an earlier run copied, settled: kept, or to copy (again). */
export interface SettledChunks {
  readonly kept: ChunkRecord[];
  /** In chunk order: those not copied before, and those copied again. */
  readonly toCopy: ChunkRecord[];
  /** The chunks copied before that are copied again. */
  readonly recopied: Set<number>;
  /** Whether rows were deleted on the target (chunks to copy again). */
  readonly cleared: boolean;
}

/**
 * A chunk copied before is kept unless `differs`; every other chunk is copied, and its rows on the
 * target (`holdsRows`: a copied chunk that differs; one not recorded copied holds none, unless
 * something wrote there behind the move) deleted and its record marked not copied, all in one
 * transaction.
 */
async function settleChunks(
  writer: pg.Client,
  moveId: string,
  chunks: readonly ChunkRecord[],
  keyType: string,
  differs: (chunk: ChunkRecord) => boolean,
  holdsRows: (chunk: ChunkRecord) => boolean,
): Promise<SettledChunks> {
  const { table, key } = chunks[0]!;
  const bounds = chunks.slice(1).map((c) => c.lo!);
  const kept: ChunkRecord[] = [];
  const toCopy: ChunkRecord[] = [];
  const cleared: number[] = [];
  const recopied = new Set<number>();
  for (const chunk of chunks) {
    if (chunk.copied && !differs(chunk)) {
      kept.push(chunk);
      continue;
    }
    if (chunk.copied) recopied.add(chunk.chunk);
    if (holdsRows(chunk)) cleared.push(chunk.chunk);
    toCopy.push(chunk.copied ? { ...chunk, copied: false, rows: null, bytes: null, snapshot: ATTEMPTED } : chunk);
  }
  if (cleared.length > 0)
    // As a chunk's copy, in the copy's transaction (its own writes are left out of the target's
    // change log, copy-logs.ts).
    await inCopyTransaction(writer, async () => {
      await writer.query(
        `DELETE FROM ${table} WHERE ${chunkOfSql(key, keyType, bounds)} = ANY(${quoteLiteral(`{${cleared.join(',')}}`)}::int[])`,
      );
      await writer.query(
        // Marked as an attempt (needsVacuum): killed before the vacuum, the next run vacuums too.
        `UPDATE ${CONTROL}.move_chunks SET copied = false, rows = NULL, bytes = NULL, snapshot = $4 WHERE move_id = $1 AND table_name = $2 AND chunk = ANY($3::int[])`,
        [moveId, table, cleared, ATTEMPTED],
      );
    });
  return { kept, toCopy, recopied, cleared: cleared.length > 0 };
}

/**
 * Settles the chunks of `table` an earlier run copied from the source's change log instead of
 * reading them (reconcileChunks reads the table on both hosts): null when the log cannot tell, and
 * the caller reads.
 *
 * Why it is exact. The source's log of the table (copy-logs.ts: the first wave's triggers, started
 * before the slot of the run that planned the chunks, kept by every resumed run) records, for every
 * row a write touches, the chunk key's text form and the writing transaction. A start marker (sign
 * LOG_START) is committed with the triggers, and every statement that switches the log off or starts
 * it afresh deletes the move's entries, markers with them. So a marker that a chunk's snapshot sees
 * proves that every change committed after that snapshot is logged: the triggers existed before it
 * (CREATE TRIGGER waited out the writers that wrote without them, which committed before the
 * marker, so before the snapshot) and stayed on. The reader is in this run's snapshot T2: the
 * entries it sees and the chunk's snapshot did not (pg_visible_in_snapshot of their transaction,
 * whose commit is their change's) are exactly the changes committed between, and the chunk is copied
 * again if one of them (a row's old or new key) falls in its range (the ranges' own width_bucket,
 * with the key column's collation); otherwise its range is the same at T2 as when it was copied. On
 * the target, the table's log runs since the plan's transaction (its marker, `planned` in
 * copyLogOnTargetSql) and holds no entry: nothing but the copy wrote there, so the target holds
 * exactly the chunks recorded copied (a chunk cut off by a kill was rolled back). The log cannot
 * tell (null) when: the key's type is not one whose logged text reads back as the same value
 * (LOGGED_KEY_TYPES), a chunk copied before has no recorded snapshot (an older shardctl's) or was
 * copied by another incarnation of the source's server (SOURCE_INCARNATION_SQL), a marker
 * is missing, an entry it must place has no key or transaction (a TRUNCATE, an entry written before
 * the control schema's version 5), or the target's log has entries or no marker.
 */
export async function reconcileByLog(
  reader: pg.Client,
  writer: pg.Client,
  moveId: string,
  chunks: readonly ChunkRecord[],
  keyType: string,
  keyCollation: string | null,
): Promise<SettledChunks | null> {
  const { table } = chunks[0]!;
  const copied = chunks.filter((c) => c.copied);
  // Only a key type whose logged text (to_jsonb's) reads back as the same value, whatever the
  // session's settings: another (a jsonb, an array, a domain, money, an interval) could put a
  // change in the wrong chunk.
  if (!LOGGED_KEY_TYPES.has(keyType)) return null;
  const snapshots = copied.map((c) => parseCopySnapshot(c.snapshot));
  if (copied.length === 0 || snapshots.some((s) => s === null)) return null;
  // A failover of the source (or a server restored from a backup) since a chunk's copy may have lost
  // rows that chunk holds, with their log entries: only the chunks copied by the source's server as
  // it runs now are settled by its log (SOURCE_INCARNATION_SQL).
  const incarnation = (await reader.query<{ incarnation: string }>(SOURCE_INCARNATION_SQL)).rows[0]!.incarnation;
  if (snapshots.some((s) => s!.incarnation !== incarnation)) return null;
  const bounds = chunks.slice(1).map((c) => c.lo!);
  const chunkOfEntry = chunkOfLoggedKeySql('d.key', keyType, bounds, keyCollation);
  const onTarget = await writer.query<{ started: boolean; entries: string }>(
    `WITH ${LOG_OF_TABLE_SQL}
     SELECT EXISTS (SELECT FROM d WHERE d.sign = ${LOG_START}) AS started,
            (SELECT count(*) FROM d WHERE d.sign <> ${LOG_START})::text AS entries`,
    [moveId, table],
  );
  const target = onTarget.rows[0]!;
  if (!target.started || target.entries !== '0') return null;
  // In the reader's snapshot, which the copy goes on with: a savepoint keeps its transaction alive
  // should a logged key not read back as the key's type.
  await reader.query(`SAVEPOINT ${BY_LOG_SAVEPOINT}`);
  let source: { started: boolean; unknown: boolean; changed: number[] };
  try {
    source = (
      await reader.query<{ started: boolean; unknown: boolean; changed: number[] }>(
        `WITH ${LOG_OF_TABLE_SQL},
              c AS (SELECT c.chunk, c.snap::pg_catalog.pg_snapshot AS snap FROM unnest($3::int[], $4::text[]) AS c(chunk, snap))
         SELECT (SELECT bool_and(EXISTS (SELECT FROM d WHERE d.sign = ${LOG_START} AND pg_catalog.pg_visible_in_snapshot(d.xid, c.snap))) FROM c) AS started,
                EXISTS (SELECT FROM d WHERE d.sign <> ${LOG_START} AND (d.xid IS NULL OR (d.key IS NULL
                          AND EXISTS (SELECT FROM c WHERE NOT pg_catalog.pg_visible_in_snapshot(d.xid, c.snap))))) AS unknown,
                ARRAY(SELECT DISTINCT c.chunk FROM d JOIN c ON c.chunk = ${chunkOfEntry}
                       WHERE d.sign IN (-1, 1) AND d.key IS NOT NULL AND NOT pg_catalog.pg_visible_in_snapshot(d.xid, c.snap)) AS changed`,
        [moveId, table, copied.map((c) => c.chunk), snapshots.map((s) => s!.snapshot)],
      )
    ).rows[0]!;
    await reader.query(`RELEASE SAVEPOINT ${BY_LOG_SAVEPOINT}`);
  } catch {
    await reader.query(`ROLLBACK TO SAVEPOINT ${BY_LOG_SAVEPOINT}`);
    return null;
  }
  if (!source.started || source.unknown) return null;
  const changed = new Set(source.changed.map(Number));
  return settleChunks(
    writer,
    moveId,
    chunks,
    keyType,
    (chunk) => changed.has(chunk.chunk),
    (chunk) => chunk.copied,
  );
}

/** The key types reconcileByLog settles chunks of, as keysAndColumns names them (qualified). */
const LOGGED_KEY_TYPES = new Set(EXACT_KEY_TYPES.map((type) => `pg_catalog.${type}`));

const BY_LOG_SAVEPOINT = 'shardctl_chunks_by_log';

/** `d`: the change-log entries of move $1 for table $2 (quoted name), on the host that runs it. */
const LOG_OF_TABLE_SQL = `t AS (SELECT n.nspname, c.relname FROM pg_catalog.pg_class c
                    JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = $2::regclass),
       d AS (SELECT d.sign, d.key, d.xid FROM ${CONTROL}.move_deltas d JOIN t ON d.schema_name = t.nspname
              AND d.table_name = t.relname WHERE d.move_id = $1)`;

/** A table's count and checksum as `client` sees it (the reader: in the copy's snapshot). */
export async function tableSums(client: pg.Client, table: string, method: HashMethod): Promise<Sums> {
  const r = await client.query<{ rows: string; checksum: string }>(`SELECT ${sumsColumnsSql(method)} FROM ${table} t`);
  return r.rows[0]!;
}

/** The settings under which both hosts give a row the same text (the 'text' checksum method). */
export const CHUNK_TEXT_SETTINGS = STABLE_TEXT_SETTINGS;

/**
 * Copies one chunk in a target transaction of its own: the COPY, and the chunk's record marked
 * copied, committed together. Its range holds no row on the target: the plan emptied the table, and
 * a resumed run deleted the rows of every chunk it copies again (reconcileChunks).
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
  snapshot: string | null,
): Promise<void> {
  // The attempt is recorded first, committed on its own (an attempt cut off left dead rows:
  // needsVacuum): a crash that loses this record loses the attempt's rows with it, written after it.
  await writer.query(
    `UPDATE ${CONTROL}.move_chunks SET snapshot = $4 WHERE move_id = $1 AND table_name = $2 AND chunk = $3`,
    [moveId, chunk.table, chunk.chunk, snapshot ?? ATTEMPTED],
  );
  await inCopyTransaction(writer, async () => {
    const out = reader.query(streams.to(chunkCopyOutSql(chunk.table, columns, chunk, binary)));
    const into = writer.query(streams.from(chunkCopyInSql(chunk.table, columns, binary)));
    const before = meter.streamed(chunk.table);
    await pipeline(out, meter.stream(chunk.table), into);
    meter.piece(chunk.table, into.rowCount);
    await writer.query(
      `UPDATE ${CONTROL}.move_chunks SET copied = true, rows = $4, bytes = $5 WHERE move_id = $1 AND table_name = $2 AND chunk = $3`,
      [moveId, chunk.table, chunk.chunk, into.rowCount, meter.streamed(chunk.table) - before],
    );
  });
}

/** A chunk's snapshot when the copy had none to record (not a pg_snapshot: the log cannot settle it). */
const ATTEMPTED = '';

/**
 * A chunk's snapshot as its record keeps it: which run of the source's server it was taken on (its
 * incarnation: the timeline and the server's start, SOURCE_INCARNATION_SQL) and its pg_snapshot's
 * text (`7.1764377000123/1234:1240:1236,1238`), so that a failover or a restart of the source since
 * is seen (reconcileByLog).
 */
export function copySnapshotText(incarnation: string, snapshot: string): string {
  return `${incarnation}/${snapshot}`;
}

/** copySnapshotText read back; null for anything else (an attempt without a snapshot). */
export function parseCopySnapshot(text: string | null): { incarnation: string; snapshot: string } | null {
  const match = text === null ? null : /^(\d+\.\d+)\/(\d+:\d+:[\d,]*)$/.exec(text);
  return match ? { incarnation: match[1]!, snapshot: match[2]! } : null;
}

/**
 * The source server's incarnation: its timeline (a failover or a point-in-time recovery moves it
 * on: a promoted standby may lack WAL the old primary had flushed) and the time it started in ms (a
 * server restored from a backup may lack it too; a crash alone loses nothing a slot's snapshot saw,
 * which only sees commits decoded from flushed WAL).
 */
export const SOURCE_INCARNATION_SQL = `SELECT (${TIMELINE_SQL})::text || '.' || floor(extract(epoch FROM pg_catalog.pg_postmaster_start_time()) * 1000)::bigint::text AS incarnation`;

/**
 * Whether a table's target may hold dead rows before its chunks left are copied: a chunk whose copy
 * was cut off (an attempt recorded, the chunk not copied: its rows were rolled back), a chunk copied
 * before whose attempt is not known (recorded by an older shardctl), or rows deleted to be copied
 * again (`cleared`).
 */
export function needsVacuum(chunks: readonly ChunkRecord[], cleared: boolean): boolean {
  return cleared || chunks.some((c) => (c.copied ? c.snapshot === null : c.snapshot !== null));
}

/** How long a vacuum of a resumed copy waits, at most, for a snapshot older than its deletes to go. */
export const VACUUM_PATIENCE_MS = 8_000;

/**
 * VACUUM of a table a resumed copy cleared rows of (needsVacuum), again until it leaves no dead row
 * or `patienceMs` have passed. Rows of a chunk cut off by a kill were never committed and go
 * at once; rows deleted to be copied again stay while any snapshot taken before the delete lives (a
 * transaction of another session in this database, an autoanalyze, a replication slot's snapshot
 * anywhere on the server), and VACUUM counts them as dead and leaves them. Each try after the first
 * reads only the pages that still hold such rows (the visibility map). Returns the dead rows left
 * (autovacuum takes them later), the count VACUUM itself reports to the statistics, read at once;
 * and whether it vacuumed at all: a role that neither owns the table (nor has MAINTAIN on it) gets a
 * warning and nothing done, and is not made to wait.
 */
export async function vacuumCleared(
  writer: pg.Client,
  table: string,
  patienceMs = VACUUM_PATIENCE_MS,
): Promise<{ dead: number; vacuumed: boolean }> {
  // The deletes' counts first: kept in this session up to a second, they would reach the table's
  // statistics after the vacuum's and count rows it removed as dead.
  const before = await writer.query<{ vacuums: string }>(
    'SELECT pg_catalog.pg_stat_force_next_flush(), pg_catalog.pg_stat_get_vacuum_count($1::regclass)::text AS vacuums',
    [table],
  );
  const started = Date.now();
  for (let wait = 50; ; wait *= 2) {
    await writer.query(`VACUUM ${table}`);
    const after = await writer.query<{ dead: string; vacuums: string }>(
      `SELECT pg_catalog.pg_stat_get_dead_tuples($1::regclass)::text AS dead,
              pg_catalog.pg_stat_get_vacuum_count($1::regclass)::text AS vacuums`,
      [table],
    );
    const dead = Number(after.rows[0]!.dead);
    // Counted only when it ran (with the statistics kept: without, no dead row is counted either).
    const vacuumed = after.rows[0]!.vacuums !== before.rows[0]!.vacuums;
    if (dead === 0 || !vacuumed || Date.now() - started + wait > patienceMs) return { dead, vacuumed };
    await sleep(wait);
  }
}

/** After the vacuum: the attempts cut off are forgotten (their rows are gone). */
export const FORGET_ATTEMPTS_SQL = `UPDATE ${CONTROL}.move_chunks SET snapshot = NULL WHERE move_id = $1 AND table_name = $2 AND NOT copied AND snapshot IS NOT NULL`;

/**
 * Begins the copy's transaction on the target (BEGIN_COPY_SQL), with the replica role where the
 * session may take it: refused without superuser, the savepoint undoes the failed SET and the
 * transaction goes on without it.
 */
export async function beginCopy(writer: pg.Client): Promise<void> {
  await writer.query(BEGIN_COPY_SQL).catch(() => writer.query('ROLLBACK TO SAVEPOINT replica_role'));
}

/** `fn` in the copy's transaction on the target (beginCopy), committed, or rolled back if it fails. */
async function inCopyTransaction(writer: pg.Client, fn: () => Promise<void>): Promise<void> {
  await beginCopy(writer);
  try {
    await fn();
    await writer.query('COMMIT');
  } catch (error) {
    await writer.query('ROLLBACK').catch(() => undefined);
    throw error;
  }
}
