import type { ShardctlConfig } from '../config/types.js';
import { shardSchemaName } from '../config/types.js';
import { renderNextIdSql } from '../id/sql.js';
import type { MigrationFile } from '../migrations/files.js';
import { CONTROL_SCHEMA } from './connect.js';
import { quoteIdent, quoteLiteral } from '../pg/quote.js';
import { loadSqlTemplate, renderSql } from '../pg/template.js';

/**
 * The SQL text of every step init, add-schema and migrate perform. Each step is one or more whole
 * transactions, sent as one round trip; `--dry-run` prints exactly these strings, so the plan a
 * person reads is the SQL that runs.
 */

/** Version of the control schema's own layout (sql/control.sql). */
export const CONTROL_VERSION = 1;

const control = quoteIdent(CONTROL_SCHEMA);

export function controlSchemaSql(config: ShardctlConfig): string {
  const layout = config.idLayout;
  return [
    'BEGIN;',
    renderSql(loadSqlTemplate('control.sql'), { control: { ident: CONTROL_SCHEMA } }).trim(),
    `INSERT INTO ${control}.layout (control_version, schema_prefix, shard_count, epoch_ms, shard_bits, sequence_bits)`,
    `VALUES (${CONTROL_VERSION}, ${quoteLiteral(config.schemaPrefix)}, ${config.shards}, ${layout.epochMs}, ${layout.shardBits}, ${layout.sequenceBits})`,
    'ON CONFLICT (singleton) DO NOTHING;',
    'COMMIT;',
  ].join('\n');
}

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
    ...(staleRecords
      ? [
          `DELETE FROM ${control}.migrations WHERE shard = ${shard};`,
          `DELETE FROM ${control}.shards WHERE shard = ${shard};`,
        ]
      : []),
    `CREATE SCHEMA ${quoteIdent(schema)};`,
    renderNextIdSql(schema, shard, config.idLayout).trim(),
    `INSERT INTO ${control}.shards (shard, schema_name, state) VALUES (${shard}, ${quoteLiteral(schema)}, ${quoteLiteral(state)});`,
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
    `DELETE FROM ${control}.migrations WHERE shard = ${shard};`,
    `DELETE FROM ${control}.shards WHERE shard = ${shard};`,
    'COMMIT;',
  ].join('\n');
}

/** Replaces next_id() of an existing shard with the current version (CREATE OR REPLACE). */
export function reinstallNextIdSql(config: ShardctlConfig, shard: number): string {
  const schema = shardSchemaName(config, shard);
  return ['BEGIN;', renderNextIdSql(schema, shard, config.idLayout).trim(), 'COMMIT;'].join('\n');
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
    `INSERT INTO ${control}.shards (shard, schema_name) VALUES (${shard}, ${quoteLiteral(schema)}) ON CONFLICT (shard) DO NOTHING;`,
    'COMMIT;',
  ].join('\n');
}

/**
 * One migration on one shard: the file's SQL and its record in the same transaction, so a shard is
 * never half-migrated and a migration is never recorded without having run (or run twice: the
 * record's primary key makes a concurrent second attempt fail and roll back).
 */
export function migrationSql(config: ShardctlConfig, shard: number, migration: MigrationFile): string {
  const schema = shardSchemaName(config, shard);
  return [
    'BEGIN;',
    `SET LOCAL search_path TO ${quoteIdent(schema)};`,
    `SET LOCAL lock_timeout = ${quoteLiteral(config.lockTimeout)};`,
    `-- ${migration.name}.sql`,
    migration.sql.trimEnd(),
    ';',
    recordMigrationSql(shard, migration),
    'COMMIT;',
  ].join('\n');
}

/**
 * A migration marked no-transaction (e.g. CREATE INDEX CONCURRENTLY): each statement runs on its
 * own, then the record is written. A crash between the last two leaves the migration applied but
 * unrecorded, so such migrations must be re-runnable (IF NOT EXISTS). IF NOT EXISTS also skips the
 * invalid index an interrupted CREATE INDEX CONCURRENTLY leaves behind, so the record is refused
 * while the shard's schema holds one.
 */
export function noTransactionMigrationSteps(config: ShardctlConfig, shard: number, migration: MigrationFile): string[] {
  const schema = shardSchemaName(config, shard);
  return [
    `SET search_path TO ${quoteIdent(schema)}; SET lock_timeout = ${quoteLiteral(config.lockTimeout)};`,
    ...migration.statements.map((statement) => `${statement};`),
    [
      'DO $shardctl$',
      'DECLARE invalid text;',
      'BEGIN',
      "  SELECT string_agg(c.relname, ', ' ORDER BY c.relname) INTO invalid",
      '    FROM pg_catalog.pg_index i',
      '    JOIN pg_catalog.pg_class c ON c.oid = i.indexrelid',
      '    JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace',
      `   WHERE n.nspname = ${quoteLiteral(schema)} AND NOT i.indisvalid;`,
      '  IF invalid IS NOT NULL THEN',
      `    RAISE EXCEPTION 'invalid index % in schema %: an interrupted CREATE INDEX CONCURRENTLY left it, and IF NOT EXISTS skips it; drop it and run migrate again', invalid, ${quoteLiteral(schema)};`,
      '  END IF;',
      'END $shardctl$;',
      `RESET search_path; RESET lock_timeout; ${recordMigrationSql(shard, migration)}`,
    ].join('\n'),
  ];
}

function recordMigrationSql(shard: number, migration: MigrationFile): string {
  return (
    `INSERT INTO ${control}.migrations (shard, version, name, checksum) ` +
    `VALUES (${shard}, ${migration.version}, ${quoteLiteral(migration.name)}, ${quoteLiteral(migration.checksum)});`
  );
}
