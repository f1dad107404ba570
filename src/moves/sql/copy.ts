import { quoteIdent } from '../../pg/quote.js';

/**
 * The copy (copy.ts): the target's copy transaction, COPY out and in, indexes dropped and rebuilt
 * around it, materialized views refreshed.
 */

/**
 * A copy's transaction on the target, with the replica role: foreign keys between a shard's tables
 * must not depend on the copy order (superusers only; the savepoint lets the copy go on without it
 * where the SET is refused).
 */
export const BEGIN_COPY_SQL = 'BEGIN; SAVEPOINT replica_role; SET LOCAL session_replication_role = replica';

/** One row: column i tells whether table i (quoted) holds any row. */
export function nonEmptyTablesSql(tables: readonly string[]): string {
  return `SELECT ${tables.map((name, i) => `EXISTS (SELECT FROM ${name}) AS "${i}"`).join(', ')}`;
}

export function truncateSql(tables: readonly string[]): string {
  return `TRUNCATE ${tables.join(', ')}`;
}

/** The COPY out of the source (`table` quoted); binary only where both ends read it alike. */
export function copyOutSql(table: string, binary: boolean): string {
  return `COPY ${table} TO STDOUT${binary ? ' (FORMAT binary)' : ''}`;
}

export function copyInSql(table: string, binary: boolean): string {
  return `COPY ${table} FROM STDIN${binary ? ' (FORMAT binary)' : ''}`;
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
export function dropIndexForCopySql(index: RebuildableIndex): string {
  return index.conname !== null
    ? `ALTER TABLE ${index.table_name} DROP CONSTRAINT ${quoteIdent(index.conname)};`
    : `DROP INDEX ${index.index_name};`;
}

/** The index (or its constraint) built again, as it was. */
export function rebuildIndexSql(index: RebuildableIndex): string {
  return index.conname !== null
    ? `ALTER TABLE ONLY ${index.table_name} ADD CONSTRAINT ${quoteIdent(index.conname)} ${index.condef}`
    : index.indexdef;
}
