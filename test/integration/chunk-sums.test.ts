import { describe, expect, it } from 'vitest';
import {
  chunkBoundsSql,
  chunkOfLoggedKeySql,
  chunkSumsSql,
  keysAndColumns,
  rangeConditionSql,
} from '../../src/moves/chunks.js';
import { useTestDatabases, withClient } from '../helpers/hosts.js';

const db = useTestDatabases(1);

/**
 * A resumed copy reconciles a table's chunks in one scan, rows grouped by the chunk their key falls
 * in (chunkSumsSql: width_bucket over the bounds cast to the key's type). It must put every row in
 * the chunk whose range (rangeConditionSql, what the copy reads) holds it, whatever the key's type
 * and text: quotes, backslashes, commas, braces and spaces in text keys, a collation of the column.
 */
describe('the chunk sums of a table in one scan', () => {
  it.each([
    {
      type: 'text COLLATE "C"',
      values: `SELECT v || g FROM generate_series(1, 400) g, unnest(ARRAY['a"b', 'c\\d', 'e,f', '{g}', ' h ', 'NULL', 'Zz', 'é']) v`,
    },
    // An ICU collation, which orders 'Zz' after 'a"b' where the databases' default (C) does not.
    {
      type: 'text COLLATE "und-x-icu"',
      values: `SELECT v || g FROM generate_series(1, 400) g, unnest(ARRAY['a"b', 'c\\d', 'e,f', '{g}', ' h ', 'NULL', 'Zz', 'é', 'B', 'b']) v`,
    },
    { type: 'text', values: `SELECT md5(g::text) || ' ' || g FROM generate_series(1, 3000) g` },
    { type: 'bigint', values: `SELECT (g * 7919)::bigint FROM generate_series(-1500, 1500) g` },
    { type: 'uuid', values: `SELECT md5(g::text)::uuid FROM generate_series(1, 3000) g` },
    // A domain over a type with a modifier, in a schema on the default search path and not on the
    // copy's sessions'.
    {
      type: 'code',
      domain: `DROP TABLE IF EXISTS public.keyed; DROP DOMAIN IF EXISTS public.code; CREATE DOMAIN public.code AS varchar(40) COLLATE "C"`,
      values: `SELECT 'k' || g || repeat('"', g % 3) FROM generate_series(1, 2500) g`,
    },
    {
      type: 'timestamptz',
      values: `SELECT timestamptz '2026-01-01 00:00:00+00' + g * interval '17 minutes 3.25 seconds' FROM generate_series(1, 3000) g`,
    },
  ])('puts every row of a $type key in the chunk whose range holds it', async ({ type, values, domain }) => {
    await withClient(db.urls[0]!, async (c) => {
      if (domain) await c.query(domain);
      await c.query(`DROP TABLE IF EXISTS public.keyed; CREATE TABLE public.keyed (k ${type} PRIMARY KEY, body text)`);
      await c.query(`INSERT INTO public.keyed SELECT v, 'row ' || v FROM (${values}) s(v)`);
      const table = '"public"."keyed"';
      const shape = (await keysAndColumns(c, [table])).get(table)!;
      expect(shape.keyName).toBe('k');
      const bounds = (await c.query<{ bound: string }>(chunkBoundsSql(table, shape.key!, 311))).rows.map(
        (r) => r.bound,
      );
      expect(bounds.length).toBeGreaterThan(5);
      // As the copy's sessions read it, with the stable text settings' search path.
      await c.query('SET search_path TO pg_catalog, pg_temp');
      const grouped = await c.query<{ chunk: number; rows: string; checksum: string }>(
        chunkSumsSql(table, shape.key!, shape.keyType!, bounds, 'text'),
      );
      const edges = [null, ...bounds, null];
      const byRange: { chunk: number; rows: string; checksum: string }[] = [];
      for (let i = 0; i + 1 < edges.length; i++) {
        const where = rangeConditionSql({ key: shape.key!, lo: edges[i]!, hi: edges[i + 1]! });
        const r = await c.query<{ rows: string; checksum: string }>(
          `SELECT count(*)::text AS rows, coalesce(sum(hashtextextended((t.*)::text, 0)), 0)::text AS checksum FROM ${table} t WHERE ${where}`,
        );
        if (r.rows[0]!.rows !== '0') byRange.push({ chunk: i, ...r.rows[0]! });
      }
      expect(grouped.rows.map((r) => ({ ...r, chunk: Number(r.chunk) })).sort((a, b) => a.chunk - b.chunk)).toEqual(
        byRange,
      );
      // A resumed copy settled from the source's change log places each logged key (its text as
      // the log's trigger records it: to_jsonb's) in the chunk whose range holds the row.
      const fromLog = chunkOfLoggedKeySql(`to_jsonb(t) ->> 'k'`, shape.keyType!, bounds, shape.keyCollation);
      let misplaced = 0;
      for (let i = 0; i + 1 < edges.length; i++) {
        const where = rangeConditionSql({ key: shape.key!, lo: edges[i]!, hi: edges[i + 1]! });
        const r = await c.query<{ n: string }>(
          `SELECT count(*)::text AS n FROM ${table} t WHERE ${where} AND ${fromLog} IS DISTINCT FROM ${i}`,
        );
        misplaced += Number(r.rows[0]!.n);
      }
      expect(misplaced).toBe(0);
    });
  });
});
