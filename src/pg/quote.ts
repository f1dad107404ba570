/**
 * Identifiers and literals for the few places where SQL text must name an object. Identifiers are
 * validated before they get here (config and argument validation), and are still always quoted.
 */

export function quoteIdent(name: string): string {
  if (name.length === 0 || name.includes('\0')) throw new Error(`invalid identifier ${JSON.stringify(name)}`);
  return `"${name.replaceAll('"', '""')}"`;
}

export function quoteLiteral(value: string): string {
  if (value.includes('\0')) throw new Error('string literal contains a NUL byte');
  // standard_conforming_strings is on in every supported PostgreSQL; E'' is used only for backslashes.
  const escaped = value.replaceAll("'", "''");
  return value.includes('\\') ? `E'${escaped.replaceAll('\\', '\\\\')}'` : `'${escaped}'`;
}

/**
 * A search_path of one schema (a shard's), then pg_temp: named last, the session's temporary schema
 * is searched after the shard's (unnamed, PostgreSQL searches it first), so a temporary table that
 * outlived its transaction on a connection (a `DO` block's, a function's: what a statement check
 * cannot see) never stands in for the shard's table of the same name in a later statement for
 * another shard. Functions and operators are never looked up in pg_temp unless named with it. Both
 * a routed call's (src/router/transaction.ts) and a migration's (src/migrations/sql.ts).
 */
export function schemaSearchPath(schema: string): string {
  return `${quoteIdent(schema)}, pg_temp`;
}
