import type pg from 'pg';
import { quoteIdent } from '../pg/quote.js';

export interface TableChecksum {
  readonly table: string;
  readonly rows: bigint;
  /** Sum of a 64-bit hash of every row's text form: order-independent, compared exactly. */
  readonly checksum: string;
}

/**
 * The tables of a shard schema, by name.
 * - 'top': tables and partitioned parents, not partitions: the unit of verification (a parent's
 *   count includes its partitions).
 * - 'all': every table including partitions: the fence needs a trigger on each, since a statement
 *   trigger on a parent does not fire for a write sent to a partition directly.
 * - 'leaves': tables that hold rows (plain tables and partitions): the unit of COPY.
 */
export async function shardTables(client: pg.Client, schema: string, which: 'top' | 'all' | 'leaves' = 'top'): Promise<string[]> {
  const filter = {
    top: `c.relkind IN ('r', 'p') AND NOT c.relispartition`,
    all: `c.relkind IN ('r', 'p')`,
    leaves: `c.relkind = 'r'`,
  }[which];
  const result = await client.query<{ relname: string }>(
    `SELECT c.relname FROM pg_class c WHERE c.relnamespace = to_regnamespace($1) AND ${filter} ORDER BY c.relname`,
    [schema],
  );
  return result.rows.map((r) => r.relname);
}

type HashMethod = 'record' | 'text';

const HASH_SQL: Record<HashMethod, string> = {
  // Each column hashed with its type's hash function (the one hash partitioning relies on, stable
  // across versions): several times faster than hashing the row's text, and verification runs
  // while writes are fenced. PostgreSQL 14 and later.
  record: 'hash_record_extended(t, 0)',
  text: 'hashtextextended(t::text, 0)',
};

/** Row count and checksum of one table; both sides of a comparison must use the same method. */
async function tableChecksum(client: pg.Client, schema: string, table: string, method: HashMethod): Promise<TableChecksum> {
  const result = await client.query<{ rows: string; checksum: string }>(
    `SELECT count(*)::text AS rows, coalesce(sum(${HASH_SQL[method]}), 0)::text AS checksum FROM ${quoteIdent(schema)}.${quoteIdent(table)} t`,
  );
  return { table, rows: BigInt(result.rows[0]!.rows), checksum: result.rows[0]!.checksum };
}

/**
 * The text form of a row depends on session settings (time zone, date style, float digits): fixed
 * here on both sessions so that equal rows give equal text on both hosts.
 */
const STABLE_TEXT_SETTINGS =
  "SET timezone TO 'UTC'; SET datestyle TO 'ISO, YMD'; SET intervalstyle TO 'postgres'; SET extra_float_digits TO 1; SET bytea_output TO 'hex'";

async function chooseMethod(source: pg.Client, schema: string, table: string, recordHash: boolean): Promise<HashMethod> {
  if (!recordHash) return 'text';
  // A column type without a hash function (json, point, …) makes the record hash fail: use text.
  try {
    await source.query(`SELECT ${HASH_SQL.record} FROM ${quoteIdent(schema)}.${quoteIdent(table)} t LIMIT 0`);
    return 'record';
  } catch (error) {
    if ((error as { code?: string }).code === '42883') return 'text';
    throw error;
  }
}

export interface VerifyResult {
  readonly ok: boolean;
  readonly rows: bigint;
  readonly tables: readonly { table: string; sourceRows: string; targetRows: string; match: boolean }[];
  readonly mismatches: readonly string[];
}

/**
 * Row counts and content checksums of every table, computed on both hosts at once. `recordHash`:
 * both servers have hash_record_extended (PostgreSQL 14 and later).
 */
export async function verifyShard(
  source: pg.Client,
  target: pg.Client,
  sourceSchema: string,
  targetSchema: string,
  options: { recordHash: boolean },
): Promise<VerifyResult> {
  const tables = await shardTables(source, sourceSchema);
  const targetTables = await shardTables(target, targetSchema);
  const mismatches: string[] = [];
  const missing = tables.filter((t) => !targetTables.includes(t));
  const extra = targetTables.filter((t) => !tables.includes(t));
  for (const t of missing) mismatches.push(`table ${t} is missing on the target`);
  for (const t of extra) mismatches.push(`table ${t} exists only on the target`);
  const common = tables.filter((t) => targetTables.includes(t));
  await Promise.all([source.query(STABLE_TEXT_SETTINGS), target.query(STABLE_TEXT_SETTINGS)]);
  const src: TableChecksum[] = [];
  const dst: TableChecksum[] = [];
  for (const table of common) {
    const method = await chooseMethod(source, sourceSchema, table, options.recordHash);
    const [s, d] = await Promise.all([tableChecksum(source, sourceSchema, table, method), tableChecksum(target, targetSchema, table, method)]);
    src.push(s);
    dst.push(d);
  }
  const report = src.map((s, i) => {
    const d = dst[i]!;
    const match = s.rows === d.rows && s.checksum === d.checksum;
    if (!match) {
      mismatches.push(
        s.rows === d.rows
          ? `table ${s.table}: ${s.rows} rows on both, but their contents differ (checksum)`
          : `table ${s.table}: ${s.rows} rows on the source, ${d.rows} on the target`,
      );
    }
    return { table: s.table, sourceRows: s.rows.toString(), targetRows: d.rows.toString(), match };
  });
  return { ok: mismatches.length === 0, rows: src.reduce((n, s) => n + s.rows, 0n), tables: report, mismatches };
}
