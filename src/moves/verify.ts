import type pg from 'pg';
import { quoteIdent } from '../pg/quote.js';

export interface TableChecksum {
  readonly table: string;
  readonly rows: bigint;
  /** Sum of a 64-bit hash of every row's text form: order-independent, compared exactly. */
  readonly checksum: string;
}

/** The tables of a shard schema, by name: the unit of copying and of verification. */
export async function shardTables(client: pg.Client, schema: string): Promise<string[]> {
  const result = await client.query<{ relname: string }>(
    `SELECT c.relname FROM pg_class c
      WHERE c.relnamespace = to_regnamespace($1) AND c.relkind IN ('r', 'p') AND NOT c.relispartition
      ORDER BY c.relname`,
    [schema],
  );
  return result.rows.map((r) => r.relname);
}

/**
 * hash_record_extended hashes each column with its type's hash function (the one hash partitioning
 * relies on, stable across versions): several times faster than hashing the row's text, which
 * matters because verification runs while writes are fenced. Tables with a column type that has no
 * hash function (json, point, …) fall back to hashing the text form.
 */
export async function tableChecksums(client: pg.Client, schema: string, tables: readonly string[]): Promise<TableChecksum[]> {
  const sums: TableChecksum[] = [];
  for (const table of tables) {
    const from = `${quoteIdent(schema)}.${quoteIdent(table)} t`;
    const query = (hash: string) =>
      client.query<{ rows: string; checksum: string }>(`SELECT count(*)::text AS rows, coalesce(sum(${hash}), 0)::text AS checksum FROM ${from}`);
    const result = await query('hash_record_extended(t, 0)').catch(async (error: { code?: string }) => {
      if (error.code !== '42883') throw error;
      return query('hashtextextended(t::text, 0)');
    });
    sums.push({ table, rows: BigInt(result.rows[0]!.rows), checksum: result.rows[0]!.checksum });
  }
  return sums;
}

export interface VerifyResult {
  readonly ok: boolean;
  readonly rows: bigint;
  readonly tables: readonly { table: string; sourceRows: string; targetRows: string; match: boolean }[];
  readonly mismatches: readonly string[];
}

/** Row counts and content checksums of every table, computed on both hosts at once. */
export async function verifyShard(
  source: pg.Client,
  target: pg.Client,
  sourceSchema: string,
  targetSchema: string,
): Promise<VerifyResult> {
  const tables = await shardTables(source, sourceSchema);
  const targetTables = await shardTables(target, targetSchema);
  const mismatches: string[] = [];
  const missing = tables.filter((t) => !targetTables.includes(t));
  const extra = targetTables.filter((t) => !tables.includes(t));
  for (const t of missing) mismatches.push(`table ${t} is missing on the target`);
  for (const t of extra) mismatches.push(`table ${t} exists only on the target`);
  const common = tables.filter((t) => targetTables.includes(t));
  const [src, dst] = await Promise.all([tableChecksums(source, sourceSchema, common), tableChecksums(target, targetSchema, common)]);
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
