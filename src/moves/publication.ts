import type pg from 'pg';
import type { Sql } from '../pg/sql-template.js';
import { qualified } from './sql/names.js';
import { PUBLISHED_TABLES_SQL } from './sql/replication.js';

/**
 * The move's publication names its tables one by one, not `FOR TABLES IN SCHEMA`. Both replicate
 * the same changes: the shards' permanent tables as they are when the publication is created
 * (partitions as themselves, as without publish_via_partition_root; unlogged and temporary tables
 * are never published either way). But the schema form costs the source time that grows with every
 * schema it names and every schema of the database: on PostgreSQL 15, naming 1,024 of a host's
 * 2,048 shard schemas took 4.8 s to create and 5.1 s to drop, against 0.6 s and 0.3 s for the same
 * 3,072 tables named (about 2.5 s and 2.9 s on 18), and a fleet-scale move pays it on every source
 * host at once (docs/benchmarks.md, move-fleet). A table created in a shard after the publication is
 * not streamed; it had no copy on the target with the schema form either (the copy takes the tables
 * the move found).
 */

/** The tables of `schemas` on the source the publication names (quoted, qualified). */
export async function publishedTables(source: pg.Client, schemas: readonly string[]): Promise<Sql[]> {
  const result = await source.query<{ nspname: string; relname: string }>(PUBLISHED_TABLES_SQL, [schemas]);
  return result.rows.map((r) => qualified(r.nspname, r.relname));
}
