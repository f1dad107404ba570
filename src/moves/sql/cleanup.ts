import { ident, int, lines, lit, sql, type Sql } from '../../pg/sql-template.js';
import { CONTROL } from '../../fleet/control.js';
import { qualified } from './names.js';
import { privilege } from '../privileges.js';

/**
 * The clean-up after a switch: the old copy renamed, with views under its old name that answer
 * SC100.
 */

export interface Grant {
  /** The table, for a table grant. */
  readonly relname?: string;
  /** Null: PUBLIC. */
  readonly grantee: string | null;
  readonly privilege: string;
}

export interface RenameWithStubInput {
  readonly shard: number;
  readonly schema: string;
  readonly renamed: string;
  readonly targetHost: string;
  /** Every table of the shard including partitions. */
  readonly tables: readonly string[];
  readonly schemaGrants: readonly Grant[];
  readonly tableGrants: readonly Grant[];
}

/**
 * The old copy renamed, and under the old name a view per table over the renamed copy, with the
 * old schema's and tables' grants: a client still on the old map gets SC100 for reads (the
 * shard_moved guard) and writes (writes through a simple view hit the base table's fence), not
 * "does not exist" or "permission denied", and reloads its map.
 */
export function renameWithStubSql(input: RenameWithStubInput): Sql {
  const { shard, schema, renamed, targetHost } = input;
  const to = (grantee: string | null): Sql => (grantee === null ? sql`PUBLIC` : ident(grantee));
  const guard = sql`${CONTROL}.shard_moved(${lit(String(shard))}, ${lit(targetHost)})`;
  return lines([
    sql`BEGIN;`,
    sql`ALTER SCHEMA ${ident(schema)} RENAME TO ${ident(renamed)};`,
    sql`CREATE SCHEMA ${ident(schema)};`,
    sql`COMMENT ON SCHEMA ${ident(schema)} IS ${lit(`shardctl: shard ${shard} moved to ${targetHost}; views over the fenced old copy ${renamed} until shardctl gc`)};`,
    ...input.tables.map(
      (t) => sql`CREATE VIEW ${qualified(schema, t)} AS SELECT * FROM ${qualified(renamed, t)} WHERE ${guard};`,
    ),
    ...input.schemaGrants
      .filter((g) => g.privilege === 'USAGE')
      .map((g) => sql`GRANT USAGE ON SCHEMA ${ident(schema)} TO ${to(g.grantee)};`),
    ...input.tableGrants
      .filter((g) => g.relname !== undefined && ['SELECT', 'INSERT', 'UPDATE', 'DELETE'].includes(g.privilege))
      .map((g) => sql`GRANT ${privilege(g.privilege)} ON ${qualified(schema, g.relname!)} TO ${to(g.grantee)};`),
    sql`UPDATE ${CONTROL}.shards SET schema_name = ${lit(renamed)} WHERE shard = ${int(shard, 'a shard number')};`,
    sql`COMMIT;`,
  ]);
}

export function refreshMaterializedViewSql(schema: string, view: string): Sql {
  return sql`REFRESH MATERIALIZED VIEW ${qualified(schema, view)}`;
}
