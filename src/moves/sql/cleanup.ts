import { CONTROL } from '../../fleet/control.js';
import { quoteIdent, quoteLiteral } from '../../pg/quote.js';
import { qualified } from './names.js';

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
export function renameWithStubSql(input: RenameWithStubInput): string {
  const { shard, schema, renamed, targetHost } = input;
  const to = (grantee: string | null): string => (grantee === null ? 'PUBLIC' : quoteIdent(grantee));
  const guard = `${CONTROL}.shard_moved(${quoteLiteral(String(shard))}, ${quoteLiteral(targetHost)})`;
  return [
    'BEGIN;',
    `ALTER SCHEMA ${quoteIdent(schema)} RENAME TO ${quoteIdent(renamed)};`,
    `CREATE SCHEMA ${quoteIdent(schema)};`,
    `COMMENT ON SCHEMA ${quoteIdent(schema)} IS ${quoteLiteral(`shardctl: shard ${shard} moved to ${targetHost}; views over the fenced old copy ${renamed} until shardctl gc`)};`,
    ...input.tables.map(
      (t) => `CREATE VIEW ${qualified(schema, t)} AS SELECT * FROM ${qualified(renamed, t)} WHERE ${guard};`,
    ),
    ...input.schemaGrants
      .filter((g) => g.privilege === 'USAGE')
      .map((g) => `GRANT USAGE ON SCHEMA ${quoteIdent(schema)} TO ${to(g.grantee)};`),
    ...input.tableGrants
      .filter((g) => g.relname !== undefined && ['SELECT', 'INSERT', 'UPDATE', 'DELETE'].includes(g.privilege))
      .map((g) => `GRANT ${g.privilege} ON ${qualified(schema, g.relname!)} TO ${to(g.grantee)};`),
    `UPDATE ${CONTROL}.shards SET schema_name = ${quoteLiteral(renamed)} WHERE shard = ${shard};`,
    'COMMIT;',
  ].join('\n');
}

export function refreshMaterializedViewSql(schema: string, view: string): string {
  return `REFRESH MATERIALIZED VIEW ${qualified(schema, view)}`;
}
