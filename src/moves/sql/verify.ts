import { EMPTY, fromCatalog, ident, int, list, lit, sql, type Sql } from '../../pg/sql-template.js';
import { type KeyedTableName, type TableName, qualified } from './names.js';

/**
 * The verification (verify.ts): counts and checksums of both copies, hashed alike on both hosts.
 */

/**
 * SQL condition: the row `t` of `table` has one of the keys in the JSON array `param` (a
 * placeholder like $1). The keys are read back with their columns' types (built-in types, from the
 * catalog), so the lookup can use the key's index; not through the table's row type, whose other
 * columns would be NULL (a domain NOT NULL refuses that).
 */
export function keyFilterSql(keyed: KeyedTableName, param: Sql): Sql {
  const columns = keyed.columns.map((name) => ident(name));
  // format_type() of each key column: the server's own text.
  const definitions = list(columns.map((c, i) => sql`${c} ${fromCatalog(keyed.types[i]!)}`));
  return sql`(${list(columns.map((c) => sql`t.${c}`))}) IN (SELECT ${list(columns.map((c) => sql`k.${c}`))} FROM jsonb_to_recordset(${param}::jsonb) AS k(${definitions}))`;
}

/** How a table's rows are hashed for its checksum (verify.ts, hashMethods). */
export type HashMethod = 'record' | 'text';

// The row is `t.*`, never a bare `t`: a table with a column named t would hash that column alone.
export const HASH_SQL: Record<HashMethod, Sql> = {
  // Each column hashed with its type's hash function (the one hash partitioning relies on, stable
  // across versions): several times faster than hashing the row's text, and verification runs
  // while writes are fenced. PostgreSQL 14 and later; built-in types only (see ShardTable.portable).
  record: sql`hash_record_extended(t.*, 0)`,
  // The row's text: enums by label, reg* by name, whatever their OIDs on each host.
  text: sql`hashtextextended((t.*)::text, 0)`,
};

/**
 * The text form of a row depends on session settings (search path, time zone, date style, float
 * digits, the monetary locale of `money`): fixed here on both sessions (and in the change logs'
 * trigger function) so that equal rows give equal text on both hosts, whatever each server's
 * defaults. The sessions that set them name every relation with its schema.
 */
const STABLE_TEXT = {
  timezone: 'UTC',
  datestyle: 'ISO, YMD',
  intervalstyle: 'postgres',
  extra_float_digits: '1',
  bytea_output: 'hex',
  lc_monetary: 'C',
} as const;

export const STABLE_TEXT_SETTINGS = list(
  [
    // The text of regclass, regtype, … names the schema unless it is on the path (a list: not a literal).
    sql`SET search_path TO pg_catalog, pg_temp`,
    ...Object.entries(STABLE_TEXT).map(([name, value]) => sql`SET ${ident(name)} TO ${lit(value)}`),
  ],
  '; ',
);

/** The same settings as placeholders of sql/move_deltas.sql, whose trigger function sets them. */
export const STABLE_TEXT_PARAMS = Object.fromEntries(
  Object.entries(STABLE_TEXT).map(([name, value]) => [name, { literal: value }]),
);

/**
 * Fails (42883) when one of `types` (built-in type names, as format_type gives them) has no
 * extended hash function (json, point, money, an array of them): a table with a column of such a
 * type is hashed as text. The record hash looks a column's function up only when it hashes a row,
 * so the probe hashes one, all NULL. One statement for all of them.
 */
export function hashProbeSql(types: readonly string[]): Sql {
  const probes = types.map((type) => {
    if (!BUILT_IN_TYPE_NAME.test(type)) throw new Error(`internal error: not a built-in type name: ${type}`);
    return sql`SELECT hash_record_extended(ROW(NULL::${fromCatalog(type)}), 0)`;
  });
  return list(probes, '\nUNION ALL ');
}

/** The names format_type gives built-in types: `bigint`, `timestamp with time zone`, `"char"`, `integer[]`. */
export const BUILT_IN_TYPE_NAME = /^(?:[a-z][a-z0-9_ ]*|"char")(?:\[\])*$/;

/** The count and checksum of the rows a query reads (its table aliased t), by `method`: columns rows and checksum, as text. */
export function sumsColumnsSql(method: HashMethod): Sql {
  return sql`count(*)::text AS rows, coalesce(sum(${HASH_SQL[method]}), 0)::text AS checksum`;
}

/** One table's count and checksum: every row, or only the rows whose key is in a JSON array of keys. */
export interface ChecksumSql {
  readonly table: TableName;
  readonly method: HashMethod;
  readonly keys?: { readonly keyed: KeyedTableName; readonly json: string };
}

/** Counts and checksums of many tables (or key subsets of them) in one statement, row i for query i; the key arrays are its parameters. */
export function checksumsSql(queries: readonly ChecksumSql[]): { sql: Sql; params: string[] } {
  const params: string[] = [];
  const selects = queries.map(({ table: t, method, keys }, i) => {
    const where = keys ? sql` WHERE ${keyFilterSql(keys.keyed, sql`$${int(params.push(keys.json))}`)}` : EMPTY;
    return sql`SELECT ${int(i)} AS i, ${sumsColumnsSql(method)} FROM ${qualified(t.schema, t.table)} t${where}`;
  });
  const text = list(selects, '\nUNION ALL ');
  return { sql: sql`${text}\nORDER BY 1`, params };
}
