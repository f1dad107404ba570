import type { ShardctlConfig } from '../config/types.js';
import { shardSchemaName } from '../config/types.js';
import { renderNextIdSql } from '../id/sql.js';
import { quoteIdent, quoteLiteral } from '../pg/quote.js';
import { WORKER_TRANSACTION_SQL, CONTROL } from './control.js';

/**
 * The SQL of a shard's life on a host: created (schema, next_id, its control row), recorded,
 * next_id upgraded, dropped. Each is one whole transaction, sent as one round trip; `--dry-run`
 * prints exactly these strings, so the plan a person reads is the SQL that runs.
 */

/**
 * Creates the shard's schema and its next_id() and records the shard, in one transaction. When the
 * control schema still has rows for a schema that was dropped by hand, they are stale: cleared first.
 */
export function createShardSql(
  config: ShardctlConfig,
  shard: number,
  staleRecords = false,
  state: 'active' | 'incoming' = 'active',
): string {
  const schema = shardSchemaName(config, shard);
  return [
    'BEGIN;',
    WORKER_TRANSACTION_SQL,
    ...(staleRecords
      ? [
          `DELETE FROM ${CONTROL}.migrations WHERE shard = ${shard};`,
          `DELETE FROM ${CONTROL}.shards WHERE shard = ${shard};`,
        ]
      : []),
    `CREATE SCHEMA ${quoteIdent(schema)};`,
    renderNextIdSql(schema, shard, config.idLayout, { fresh: true }).trim(),
    `INSERT INTO ${CONTROL}.shards (shard, schema_name, state) VALUES (${shard}, ${quoteLiteral(schema)}, ${quoteLiteral(state)});`,
    'COMMIT;',
  ].join('\n');
}

/**
 * Drops a shard's copy from a host: its schema(s) and its control rows, in one transaction. Used for
 * an old copy after a move (gc, --drop-source: the renamed copy and the views under the old name)
 * and for the incoming copy of an aborted move.
 */
export function dropShardSql(shard: number, schemas: readonly string[]): string {
  return [
    'BEGIN;',
    ...[...new Set(schemas)].map((schema) => `DROP SCHEMA IF EXISTS ${quoteIdent(schema)} CASCADE;`),
    `DELETE FROM ${CONTROL}.migrations WHERE shard = ${shard};`,
    `DELETE FROM ${CONTROL}.shards WHERE shard = ${shard};`,
    'COMMIT;',
  ].join('\n');
}

/** Replaces next_id() of an existing shard with the current version (CREATE OR REPLACE). */
export function reinstallNextIdSql(config: ShardctlConfig, shard: number): string {
  const schema = shardSchemaName(config, shard);
  // next_id_barrier.sql waits for the transactions drawing from the schema's sequences: as long as a migration's locks may.
  return [
    'BEGIN;',
    WORKER_TRANSACTION_SQL,
    `SET LOCAL lock_timeout = ${quoteLiteral(config.lockTimeout)};`,
    renderNextIdSql(schema, shard, config.idLayout).trim(),
    'COMMIT;',
  ].join('\n');
}

/**
 * Records a shard whose complete schema exists but has no control row (e.g. created by an older run).
 * A whole transaction like every other step: a bare statement batched before a BEGIN would join
 * that transaction and be rolled back with it.
 */
export function recordShardSql(config: ShardctlConfig, shard: number): string {
  const schema = shardSchemaName(config, shard);
  return [
    'BEGIN;',
    WORKER_TRANSACTION_SQL,
    `INSERT INTO ${CONTROL}.shards (shard, schema_name) VALUES (${shard}, ${quoteLiteral(schema)}) ON CONFLICT (shard) DO NOTHING;`,
    'COMMIT;',
  ].join('\n');
}
