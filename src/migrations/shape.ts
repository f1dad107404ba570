import type pg from 'pg';
import { CONTROL } from '../fleet/control.js';
import { int, list, sql, type Sql } from '../pg/sql-template.js';
import {
  describeShapeDifference,
  shapeOutliers,
  type ShapeColumn,
  type ShapeOutlier,
  type ShardShape,
} from './rules.js';
import { runTransaction } from '../pg/quiet.js';

/**
 * Hand-made drift of a shard's tables (an ADD or DROP COLUMN outside the migrations): each shard's
 * shape — its tables, their columns in order with types and NOT NULL, constraints and indexes — as
 * one fingerprint, compared with the shards of the same migrations (shapeOutliers). Fingerprints
 * name built-in and shared types by OID: compare them only between hosts of one major version. One query per host, however many shards, grouped by fingerprint; only for a
 * shard that differs are its columns and a reference shard's read to name the difference.
 */

/**
 * One row per (migrations applied, fingerprint): the shards that have it. Types are named by OID,
 * except those defined in the shard's own schema (an enum per shard), which are named by name; so
 * are referenced tables. Constraints and indexes are compared by their catalog columns; their
 * definitions only where an expression, a predicate or a CHECK is involved. Every catalog is read
 * in one pass, grouped, with no per-table subquery: a few hundred ms at 8,192 shards. Of the
 * active shards on the host, or of `shards` only.
 */
export function shapeFingerprintsSql(shards?: readonly number[]): Sql {
  const filter = shards
    ? sql`c.shard = ANY(ARRAY[${list(shards.map((shard) => int(shard, 'a shard number')))}]::int[])`
    : sql`true`;
  return sql`
WITH s AS (
  SELECT c.shard, n.oid AS nsp, quote_ident(n.nspname) || '.' AS prefix
    FROM ${CONTROL}.shards c JOIN pg_namespace n ON n.nspname = c.schema_name
   WHERE c.state = 'active' AND ${filter}
),
lv AS (
  SELECT m.shard, string_agg(m.version::text, ',' ORDER BY m.version) AS level FROM ${CONTROL}.migrations m GROUP BY m.shard
),
rel AS (
  SELECT r.oid, r.relnamespace, r.relname, r.relkind FROM pg_class r JOIN s ON s.nsp = r.relnamespace WHERE r.relkind IN ('r', 'p')
),
cols AS (
  SELECT a.attrelid, string_agg(a.attname || ' ' || CASE WHEN t.typnamespace = rel.relnamespace THEN t.typname ELSE a.atttypid::text END
                                || ' ' || a.atttypmod || CASE WHEN a.attnotnull THEN ' nn' ELSE '' END, ',' ORDER BY a.attnum) AS text
    FROM pg_attribute a JOIN rel ON rel.oid = a.attrelid JOIN pg_type t ON t.oid = a.atttypid
   WHERE a.attnum > 0 AND NOT a.attisdropped GROUP BY a.attrelid
),
cons AS (
  SELECT co.conrelid, string_agg(concat_ws(' ', co.conname, co.contype, co.conkey::text, co.confkey::text, fr.relname, co.condeferrable, co.condeferred,
                                        co.confupdtype, co.confdeltype, CASE WHEN co.contype IN ('c', 'x') THEN replace(pg_get_constraintdef(co.oid), s.prefix, '') END), ';' ORDER BY co.conname) AS text
    FROM pg_constraint co JOIN rel ON rel.oid = co.conrelid JOIN s ON s.nsp = rel.relnamespace LEFT JOIN pg_class fr ON fr.oid = co.confrelid
   GROUP BY co.conrelid
),
idx AS (
  SELECT i.indrelid, string_agg(concat_ws(' ', ic.relname, i.indisunique, i.indisprimary, i.indkey::text, i.indclass::text, i.indoption::text,
                                       CASE WHEN i.indexprs IS NOT NULL OR i.indpred IS NOT NULL THEN replace(pg_get_indexdef(i.indexrelid), s.prefix, '') END), ';' ORDER BY ic.relname) AS text
    FROM pg_index i JOIN rel ON rel.oid = i.indrelid JOIN s ON s.nsp = rel.relnamespace JOIN pg_class ic ON ic.oid = i.indexrelid
   GROUP BY i.indrelid
),
f AS (
  SELECT s.shard, coalesce(lv.level, '') AS level,
         md5(coalesce(string_agg(concat_ws('|', rel.relname, rel.relkind, cols.text, cons.text, idx.text), E'\n' ORDER BY rel.relname), '')) AS fingerprint
    FROM s LEFT JOIN lv ON lv.shard = s.shard LEFT JOIN rel ON rel.relnamespace = s.nsp
    LEFT JOIN cols ON cols.attrelid = rel.oid LEFT JOIN cons ON cons.conrelid = rel.oid LEFT JOIN idx ON idx.indrelid = rel.oid
   GROUP BY s.shard, lv.level
)
SELECT level, fingerprint, string_agg(shard::text, ',' ORDER BY shard) AS shards FROM f GROUP BY level, fingerprint`;
}

/**
 * The shapes of the active shards on this host (of `shards` only, if given): one round trip. Hash
 * joins are forced: right after thousands of shards were created the catalogs' statistics are
 * stale, and the planner's nested loops over them took 30 s at 8,192 shards instead of 1.
 */
export async function readShardShapes(
  client: pg.Client,
  host: string,
  shards?: readonly number[],
): Promise<ShardShape[]> {
  if (shards?.length === 0) return [];
  // Shard numbers are written as literals (int checks them): a simple query carries the SET LOCAL
  // in the same round trip.
  const text = sql`BEGIN;\nSET LOCAL enable_nestloop = off;\n${shapeFingerprintsSql(shards)};\nCOMMIT;`;
  const results = (await runTransaction(client, text)) as pg.QueryResult<{
    level: string;
    fingerprint: string;
    shards: string;
  }>[];
  const rows = results.find((r) => r.command === 'SELECT')?.rows ?? [];
  return rows.flatMap((r) =>
    r.shards.split(',').map((s) => ({ shard: Number(s), host, level: r.level, fingerprint: r.fingerprint })),
  );
}

/** The columns of the tables of two schemas, to name what differs between a shard and its reference. */
async function readColumns(client: pg.Client, schema: string): Promise<ShapeColumn[]> {
  const result = await client.query<{ table: string; column: string; type: string }>(
    sql`SELECT c.relname AS table, a.attname AS column, replace(format_type(a.atttypid, a.atttypmod), quote_ident(n.nspname) || '.', '') AS type
       FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
       JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
      WHERE n.nspname = $1 AND c.relkind IN ('r', 'p') ORDER BY c.relname, a.attnum`,
    [schema],
  );
  return result.rows;
}

/** A drifted shard, what differs, and the reference shard it was compared with. */
export interface ShapeDrift extends ShapeOutlier {
  readonly differences: readonly string[];
}

/** Outliers described in detail (two catalog reads each); the rest are named without detail. */
const DETAILED = 20;

/**
 * The shards among `shapes` whose shape differs from that of most shards of the same migrations
 * (shapeOutliers), each with its differences named (columns; else constraints or indexes). The
 * shapes may come from several hosts of the same major version; `clients` reaches each by name.
 */
export async function shapeDrift(
  clients: ReadonlyMap<string, pg.Client>,
  shapes: readonly ShardShape[],
  schemaOf: (shard: number) => string,
  only?: ReadonlySet<number>,
): Promise<ShapeDrift[]> {
  const outliers = shapeOutliers(shapes).filter((o) => !only || only.has(o.shard));
  const hostOf = new Map(shapes.map((s) => [s.shard, s.host]));
  return Promise.all(
    outliers.map(async (o, i): Promise<ShapeDrift> => {
      const mineOn = clients.get(hostOf.get(o.shard)!);
      const referenceOn = clients.get(hostOf.get(o.reference)!);
      if (i >= DETAILED || !mineOn || !referenceOn) return { ...o, differences: [] };
      const mine = await readColumns(mineOn, schemaOf(o.shard));
      const reference = await readColumns(referenceOn, schemaOf(o.reference));
      return { ...o, differences: describeShapeDifference(schemaOf(o.shard), mine, schemaOf(o.reference), reference) };
    }),
  );
}

/**
 * One line per drifted shard: what differs from the reference shard of the same migrations.
 * `unfinished`: the shard's next migration, when it runs without a transaction (a run killed inside
 * it leaves part of it done and nothing recorded): named as the likelier cause.
 */
export function shapeDriftMessage(drift: ShapeDrift, schemaOf: (shard: number) => string, unfinished?: string): string {
  const what =
    drift.differences.length > 0 ? drift.differences.join('; ') : 'its tables, constraints or indexes differ';
  const why =
    unfinished === undefined
      ? 'changed by hand, outside the migrations'
      : `part of ${unfinished}, which runs without a transaction, may have run in a run that was stopped: migrate runs it again; else changed by hand`;
  return `shard ${drift.shard} (${schemaOf(drift.shard)}) differs from shard ${drift.reference} (${schemaOf(drift.reference)}), which has the same migrations: ${what} (${why})`;
}

/**
 * Up to `count` of `shards` (ascending) spread evenly over the list, leaving out `skip`: the other
 * shards a move's preflight reads beside its batch's to compare their shapes with (shapesAgree).
 */
export function evenSample(shards: readonly number[], count: number, skip: ReadonlySet<number>): number[] {
  const others = shards.filter((s) => !skip.has(s));
  if (others.length <= count) return others;
  return Array.from({ length: count }, (_, i) => others[Math.floor((i * others.length) / count)]!);
}

/**
 * Whether `shapes` cannot hold a drifted shard of `batch`, however the shards that were not read
 * look, short of a drift that misses every sampled shard: each migration level of the batch has
 * one fingerprint among all the shapes read, and at least one shard outside the batch has it.
 * Otherwise the preflight reads the hosts whole and decides by the majority (shapeOutliers).
 */
export function shapesAgree(shapes: readonly ShardShape[], batch: ReadonlySet<number>): boolean {
  const byLevel = new Map<string, { fingerprints: Set<string>; others: number }>();
  for (const s of shapes) {
    let level = byLevel.get(s.level);
    if (!level) byLevel.set(s.level, (level = { fingerprints: new Set(), others: 0 }));
    level.fingerprints.add(s.fingerprint);
    if (!batch.has(s.shard)) level.others += 1;
  }
  return shapes
    .filter((s) => batch.has(s.shard))
    .every((s) => {
      const level = byLevel.get(s.level)!;
      return level.fingerprints.size === 1 && level.others > 0;
    });
}

/**
 * The hand-made drift of one host's shards, one line each (shapeDriftMessage): what `status` and
 * `migrate --check` report. `unfinished`: a shard's next migration when it runs without a
 * transaction (see shapeDriftMessage).
 */
export async function handMadeDrift(
  client: pg.Client,
  host: string,
  schemaOf: (shard: number) => string,
  unfinished: (shard: number) => string | undefined,
): Promise<string[]> {
  const drifts = await shapeDrift(new Map([[host, client]]), await readShardShapes(client, host), schemaOf);
  return drifts.map((d) => shapeDriftMessage(d, schemaOf, unfinished(d.shard)));
}
