import type pg from 'pg';

/**
 * Tables without a single page. A relation of no page holds no row for any snapshot: a row a
 * snapshot sees was committed before it, so it lies in a page, and no vacuum removes a page holding
 * a row that a snapshot still open may see. A size read after the copy's snapshot was taken is
 * therefore as exact as reading the table in that snapshot (a TRUNCATE since, which gives the table
 * new empty files, is seen the same way by both), and costs no plan and no transaction: what the
 * copy of an empty shard, the common case of a fleet's growth, mostly paid for (docs/moves.md, step 4).
 */

/** One row: whether every relation named in $1 (quoted names) exists and has no page. */
export const ALL_PAGELESS_SQL = `SELECT coalesce(bool_and(coalesce(pg_catalog.pg_relation_size(pg_catalog.to_regclass(t)) = 0, false)), true) AS pageless
  FROM unnest($1::text[]) AS t`;

/** Whether every table of `names` (quoted, qualified) exists on `client`'s host and has no page: one round trip. */
export async function allPageless(client: pg.Client, names: readonly string[]): Promise<boolean> {
  if (names.length === 0) return true;
  const result = await client.query<{ pageless: boolean }>(ALL_PAGELESS_SQL, [names]);
  return result.rows[0]!.pageless;
}
