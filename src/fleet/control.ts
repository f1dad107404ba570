import type pg from 'pg';
import type { ShardctlConfig } from '../config/types.js';
import { quoteIdent, quoteLiteral } from '../pg/quote.js';
import { loadSqlTemplate, renderSql } from '../pg/template.js';

/**
 * The control schema shardctl keeps on every host (sql/control.sql): the id layout the host was
 * built with, its shards and their state, the migrations applied to each, and the moves. Its name
 * is fixed on purpose, and every piece of SQL names it through CONTROL.
 */
export const CONTROL_SCHEMA = 'shardctl';

/** The control schema's name as SQL text, quoted: `"shardctl"`. */
export const CONTROL = quoteIdent(CONTROL_SCHEMA);

/** Version of the control schema's own layout (sql/control.sql). */
export const CONTROL_VERSION = 1;

/** Creates (or completes) the control schema and records the layout, in one transaction. */
export function controlSchemaSql(config: ShardctlConfig): string {
  const layout = config.idLayout;
  return [
    'BEGIN;',
    renderSql(loadSqlTemplate('control.sql'), { control: { ident: CONTROL_SCHEMA } }).trim(),
    `INSERT INTO ${CONTROL}.layout (control_version, schema_prefix, shard_count, epoch_ms, shard_bits, sequence_bits)`,
    `VALUES (${CONTROL_VERSION}, ${quoteLiteral(config.schemaPrefix)}, ${config.shards}, ${layout.epochMs}, ${layout.shardBits}, ${layout.sequenceBits})`,
    'ON CONFLICT (singleton) DO NOTHING;',
    'COMMIT;',
  ].join('\n');
}

/** Sets a worker session to commit without waiting for the WAL flush (see DURABLE_FLUSH_SQL). */
export const ASYNC_COMMIT_SQL = 'SET synchronous_commit = off';

/**
 * Provisioning, and a move's target creation and copy, commit each shard's transaction with
 * synchronous_commit off (no WAL flush, and no wait for a synchronous standby, per shard: the bulk
 * of migrate's time otherwise). This transaction ends such a run: it writes (the layout row,
 * unchanged) and commits with synchronous_commit on, so its commit waits until the WAL is flushed,
 * and confirmed by synchronous standbys, up to its own commit record, which comes after every
 * commit the run made on the host. Until it returns, a crash can lose the run's last commits, each
 * shard's change together with its record (one transaction), so a rerun applies them again; once it
 * returns, they are as durable as any commit.
 */
export const DURABLE_FLUSH_SQL = `BEGIN; SET LOCAL synchronous_commit = on; UPDATE ${CONTROL}.layout SET control_version = control_version; COMMIT;`;

/** Whether the control schema has `table` (hosts never initialised, or older control schemas, lack it). */
export async function controlTableExists(client: pg.Client, table: 'shards' | 'moves' | 'objects'): Promise<boolean> {
  const result = await client.query<{ e: boolean }>(`SELECT to_regclass($1) IS NOT NULL AS e`, [`${CONTROL}.${table}`]);
  return result.rows[0]!.e;
}
