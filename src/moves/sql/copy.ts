import { EMPTY, fromCatalog, ident, list, sql, type Sql } from '../../pg/sql-template.js';

/**
 * The copy (copy.ts): the target's copy transaction, COPY out and in, indexes dropped and rebuilt
 * around it, materialized views refreshed.
 */

/**
 * A copy's transaction on the target, with the replica role: foreign keys between a shard's tables
 * must not depend on the copy order (superusers only; the savepoint lets the copy go on without it
 * where the SET is refused). Marked as the copy's (COPYING_SETTING, sql/tail.ts): the change logs that run on
 * the target during the copy leave its writes out (copy-logs.ts).
 */
export const BEGIN_COPY_SQL = sql`BEGIN; SET LOCAL shardctl.copying = 'on'; SAVEPOINT replica_role; SET LOCAL session_replication_role = replica`;

/** One row: column i tells whether table i (quoted) holds any row. */
export function nonEmptyTablesSql(tables: readonly Sql[]): Sql {
  return sql`SELECT ${list(tables.map((name, i) => sql`EXISTS (SELECT FROM ${name}) AS ${ident(String(i))}`))}`;
}

export function truncateSql(tables: readonly Sql[]): Sql {
  return sql`TRUNCATE ${list(tables)}`;
}

/** The COPY out of the source (`table` quoted); binary only where both ends read it alike. */
export function copyOutSql(table: Sql, binary: boolean): Sql {
  return sql`COPY ${table} TO STDOUT${binary ? sql` (FORMAT binary)` : EMPTY}`;
}

export function copyInSql(table: Sql, binary: boolean): Sql {
  return sql`COPY ${table} FROM STDIN${binary ? sql` (FORMAT binary)` : EMPTY}`;
}

/** An index that can be built again exactly (catalog.ts, REBUILDABLE_INDEXES_SQL). */
export interface RebuildableIndex {
  /** Quoted and qualified. */
  readonly index_name: string;
  readonly table_name: string;
  readonly conname: string | null;
  readonly indexdef: string;
  readonly condef: string | null;
}

/** The drop of an index, or of the constraint that owns it. */
export function dropIndexForCopySql(index: RebuildableIndex): Sql {
  return index.conname !== null
    ? sql`ALTER TABLE ${fromCatalog(index.table_name)} DROP CONSTRAINT ${ident(index.conname)};`
    : sql`DROP INDEX ${fromCatalog(index.index_name)};`;
}

/** The index (or its constraint) built again, as it was. */
export function rebuildIndexSql(index: RebuildableIndex): Sql {
  return index.conname !== null
    ? sql`ALTER TABLE ONLY ${fromCatalog(index.table_name)} ADD CONSTRAINT ${ident(index.conname)} ${fromCatalog(index.condef ?? '')}`
    : fromCatalog(index.indexdef);
}
