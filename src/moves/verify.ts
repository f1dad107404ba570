import type pg from 'pg';
import { qualified } from './sql.js';

/**
 * The tables of shard schemas, and the comparison of both copies of a shard: row counts and content
 * checksums of every table, computed on both hosts at once.
 */

/** A table of a shard schema. */
export interface ShardTable {
  readonly schema: string;
  readonly table: string;
  /**
   * Every column's type is built in (not user-defined, not a domain, array or composite of one) and
   * not an OID alias (regclass, regtype, ...). Only such tables travel in binary COPY and binary
   * replication (whose array and record formats carry type OIDs that differ between hosts, and whose
   * reg* values are raw OIDs), and only they are checksummed with hash_record_extended (which hashes
   * an enum by its OID).
   */
  readonly portable: boolean;
}

const REG_TYPES = `'regclass', 'regtype', 'regproc', 'regprocedure', 'regoper', 'regoperator', 'regconfig', 'regdictionary', 'regnamespace', 'regrole', 'regcollation'`;

/**
 * The tables of these schemas, by schema and name.
 * - 'top': tables and partitioned parents, not partitions: the unit of verification (a parent's
 *   count includes its partitions).
 * - 'all': every table including partitions: the fence needs a trigger on each, since a statement
 *   trigger on a parent does not fire for a write sent to a partition directly.
 * - 'leaves': tables that hold rows (plain tables and partitions): the unit of COPY.
 */
export async function shardTables(client: pg.Client, schemas: string | readonly string[], which: 'top' | 'all' | 'leaves' = 'top'): Promise<ShardTable[]> {
  const filter = {
    top: `c.relkind IN ('r', 'p') AND NOT c.relispartition`,
    all: `c.relkind IN ('r', 'p')`,
    leaves: `c.relkind = 'r'`,
  }[which];
  const result = await client.query<{ nspname: string; relname: string; portable: boolean }>(
    `SELECT n.nspname, c.relname,
            coalesce(bool_and(t.oid < 16384 AND (e.oid IS NULL OR e.oid < 16384)
                              AND NOT t.typname IN (${REG_TYPES}) AND NOT coalesce(e.typname IN (${REG_TYPES}), false)), true) AS portable
       FROM pg_class c
       JOIN pg_namespace n ON n.oid = c.relnamespace
       LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
       LEFT JOIN pg_type t ON t.oid = a.atttypid
       LEFT JOIN pg_type e ON e.oid = t.typelem AND t.typcategory = 'A'
      WHERE n.nspname = ANY($1::text[]) AND ${filter}
      GROUP BY n.nspname, c.relname
      ORDER BY n.nspname, c.relname`,
    [typeof schemas === 'string' ? [schemas] : schemas],
  );
  return result.rows.map((r) => ({ schema: r.nspname, table: r.relname, portable: r.portable }));
}

type HashMethod = 'record' | 'text';

const HASH_SQL: Record<HashMethod, string> = {
  // Each column hashed with its type's hash function (the one hash partitioning relies on, stable
  // across versions): several times faster than hashing the row's text, and verification runs
  // while writes are fenced. PostgreSQL 14 and later; built-in types only (see ShardTable.portable).
  record: 'hash_record_extended(t, 0)',
  // The row's text: enums by label, reg* by name, whatever their OIDs on each host.
  text: 'hashtextextended(t::text, 0)',
};

/**
 * The text form of a row depends on session settings (time zone, date style, float digits): fixed
 * here on both sessions so that equal rows give equal text on both hosts.
 */
const STABLE_TEXT_SETTINGS =
  "SET timezone TO 'UTC'; SET datestyle TO 'ISO, YMD'; SET intervalstyle TO 'postgres'; SET extra_float_digits TO 1; SET bytea_output TO 'hex'";

/** The checksum method of each table: the record hash where it is OID-free and available, else text. */
export async function hashMethods(source: pg.Client, tables: readonly ShardTable[], recordHash: boolean): Promise<Map<string, HashMethod>> {
  const methods = new Map<string, HashMethod>();
  for (const t of tables) {
    let method: HashMethod = recordHash && t.portable ? 'record' : 'text';
    if (method === 'record') {
      // A column type without an extended hash function (json, point, ...) makes the record hash fail.
      try {
        await source.query(`SELECT ${HASH_SQL.record} FROM ${qualified(t.schema, t.table)} t LIMIT 0`);
      } catch (error) {
        if ((error as { code?: string }).code !== '42883') throw error;
        method = 'text';
      }
    }
    methods.set(`${t.schema}.${t.table}`, method);
  }
  return methods;
}

interface TableChecksum {
  readonly rows: bigint;
  /** Sum of a 64-bit hash of every row: order-independent, compared exactly. */
  readonly checksum: string;
}

/** Counts and checksums of many tables in one round trip. */
async function checksums(client: pg.Client, tables: readonly ShardTable[], methods: ReadonlyMap<string, HashMethod>): Promise<TableChecksum[]> {
  if (tables.length === 0) return [];
  const sql = tables
    .map(
      (t, i) =>
        `SELECT ${i} AS i, count(*)::text AS rows, coalesce(sum(${HASH_SQL[methods.get(`${t.schema}.${t.table}`) ?? 'text']}), 0)::text AS checksum FROM ${qualified(t.schema, t.table)} t`,
    )
    .join('\nUNION ALL ');
  const result = await client.query<{ i: number; rows: string; checksum: string }>(`${sql}\nORDER BY 1`);
  return result.rows.map((r) => ({ rows: BigInt(r.rows), checksum: r.checksum }));
}

export interface TableVerification {
  readonly schema: string;
  readonly table: string;
  readonly sourceRows: string;
  readonly targetRows: string;
  readonly match: boolean;
}

export interface VerifyResult {
  readonly ok: boolean;
  /** Rows verified (on the source), over every table compared. */
  readonly rows: bigint;
  readonly tables: readonly TableVerification[];
  readonly mismatches: readonly string[];
}

/**
 * Row counts and content checksums of every table of `schemas`, on both hosts at once (the same
 * schema names on both). `methods` comes from hashMethods(), computed before the fence.
 */
export async function verifyShards(
  source: pg.Client,
  target: pg.Client,
  schemas: readonly string[],
  methods: ReadonlyMap<string, HashMethod>,
): Promise<VerifyResult> {
  const [tables, targetTables] = await Promise.all([shardTables(source, schemas), shardTables(target, schemas)]);
  const key = (t: ShardTable): string => `${t.schema}.${t.table}`;
  const onTarget = new Set(targetTables.map(key));
  const onSource = new Set(tables.map(key));
  const mismatches: string[] = [];
  for (const t of tables) if (!onTarget.has(key(t))) mismatches.push(`table ${key(t)} is missing on the target`);
  for (const t of targetTables) if (!onSource.has(key(t))) mismatches.push(`table ${key(t)} exists only on the target`);
  const common = tables.filter((t) => onTarget.has(key(t)));
  await Promise.all([source.query(STABLE_TEXT_SETTINGS), target.query(STABLE_TEXT_SETTINGS)]);
  const [src, dst] = await Promise.all([checksums(source, common, methods), checksums(target, common, methods)]);
  const report = common.map((t, i) => {
    const s = src[i]!;
    const d = dst[i]!;
    const match = s.rows === d.rows && s.checksum === d.checksum;
    if (!match) {
      mismatches.push(
        s.rows === d.rows
          ? `table ${key(t)}: ${s.rows} rows on both, but their contents differ (checksum)`
          : `table ${key(t)}: ${s.rows} rows on the source, ${d.rows} on the target`,
      );
    }
    return { schema: t.schema, table: t.table, sourceRows: s.rows.toString(), targetRows: d.rows.toString(), match };
  });
  return { ok: mismatches.length === 0, rows: src.reduce((n, s) => n + s.rows, 0n), tables: report, mismatches };
}
