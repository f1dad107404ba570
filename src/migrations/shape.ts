import type pg from 'pg';
import { CONTROL } from '../fleet/control.js';
import { describeShapeDifference, shapeOutliers, type ShapeColumn, type ShapeOutlier, type ShardShape } from './rules.js';

/**
 * Hand-made drift of a shard's tables (an ADD or DROP COLUMN outside the migrations): each shard's
 * shape — its tables, their columns in order with types and NOT NULL, constraints and indexes — as
 * one fingerprint, compared with the shards of the same migrations on the same host
 * (shapeOutliers). One query per host, however many shards, grouped by fingerprint; only for a
 * shard that differs are its columns and a reference shard's read to name the difference.
 */

/**
 * One row per (migrations applied, fingerprint): the shards that have it. Names of the shard's own
 * schema are cut out of type and definition texts, so that equal shapes give equal fingerprints.
 * Constraints and indexes are compared by their catalog columns (cheap at thousands of shards);
 * their definitions only where an expression or predicate is involved.
 */
export const SHAPE_FINGERPRINTS_SQL = `
WITH s AS (
  SELECT c.shard, n.oid AS nsp, quote_ident(n.nspname) || '.' AS prefix,
         coalesce((SELECT string_agg(m.version::text, ',' ORDER BY m.version) FROM ${CONTROL}.migrations m WHERE m.shard = c.shard), '') AS level
    FROM ${CONTROL}.shards c JOIN pg_namespace n ON n.nspname = c.schema_name
   WHERE c.state = 'active' AND ($1::int[] IS NULL OR c.shard = ANY($1::int[]))
),
t AS (
  SELECT s.shard, s.prefix, r.oid, r.relname, r.relkind FROM s JOIN pg_class r ON r.relnamespace = s.nsp AND r.relkind IN ('r', 'p')
),
line AS (
  SELECT t.shard, replace(concat_ws(' | ', t.relname, t.relkind,
    (SELECT string_agg(a.attname || ' ' || format_type(a.atttypid, a.atttypmod) || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END, ', ' ORDER BY a.attnum)
       FROM pg_attribute a WHERE a.attrelid = t.oid AND a.attnum > 0 AND NOT a.attisdropped),
    (SELECT string_agg(concat_ws(' ', co.conname, co.contype, co.conkey::text, co.confkey::text, fr.relname, co.condeferrable, co.condeferred,
                                 co.confupdtype, co.confdeltype, CASE WHEN co.contype IN ('c', 'x') THEN pg_get_constraintdef(co.oid) END), '; ' ORDER BY co.conname)
       FROM pg_constraint co LEFT JOIN pg_class fr ON fr.oid = co.confrelid WHERE co.conrelid = t.oid),
    (SELECT string_agg(concat_ws(' ', ic.relname, i.indisunique, i.indisprimary, i.indkey::text, i.indclass::text, i.indoption::text,
                                 CASE WHEN i.indexprs IS NOT NULL OR i.indpred IS NOT NULL THEN pg_get_indexdef(i.indexrelid) END), '; ' ORDER BY ic.relname)
       FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid WHERE i.indrelid = t.oid)), t.prefix, '') AS text
    FROM t
),
f AS (
  SELECT s.shard, s.level, md5(coalesce(string_agg(line.text, E'\\n' ORDER BY line.text), '')) AS fingerprint
    FROM s LEFT JOIN line ON line.shard = s.shard GROUP BY s.shard, s.level
)
SELECT level, fingerprint, string_agg(shard::text, ',' ORDER BY shard) AS shards FROM f GROUP BY level, fingerprint`;

/** The shapes of the active shards on this host (of `shards` only, if given): one query. */
export async function readShardShapes(client: pg.Client, host: string, shards?: readonly number[]): Promise<ShardShape[]> {
  const result = await client.query<{ level: string; fingerprint: string; shards: string }>(SHAPE_FINGERPRINTS_SQL, [shards ?? null]);
  return result.rows.flatMap((r) => r.shards.split(',').map((s) => ({ shard: Number(s), host, level: r.level, fingerprint: r.fingerprint })));
}

/** The columns of the tables of two schemas, to name what differs between a shard and its reference. */
async function readColumns(client: pg.Client, schema: string): Promise<ShapeColumn[]> {
  const result = await client.query<{ table: string; column: string; type: string }>(
    `SELECT c.relname AS table, a.attname AS column, replace(format_type(a.atttypid, a.atttypmod), quote_ident(n.nspname) || '.', '') AS type
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

/** One line per drifted shard: what differs from the reference shard of the same migrations. */
export function shapeDriftMessage(drift: ShapeDrift, schemaOf: (shard: number) => string): string {
  const what = drift.differences.length > 0 ? drift.differences.join('; ') : 'its tables, constraints or indexes differ';
  return `shard ${drift.shard} (${schemaOf(drift.shard)}) differs from shard ${drift.reference} (${schemaOf(drift.reference)}), which has the same migrations: ${what} (changed by hand, outside the migrations)`;
}
