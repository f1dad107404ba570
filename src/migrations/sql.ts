import type { ShardctlConfig } from '../config/types.js';
import { shardSchemaName } from '../config/types.js';
import { clientCheckSql, CONTROL, sessionResetSql, WORKER_TRANSACTION_SQL } from '../fleet/control.js';
import { quoteLiteral, schemaSearchPath } from '../pg/quote.js';
import type { MigrationFile } from './files.js';

/**
 * The SQL of applying one migration file to one shard. `--dry-run` prints exactly these strings.
 */

/**
 * One migration on one shard: the file's SQL and its record in the same transaction, so a shard is
 * never half-migrated and a migration is never recorded without having run (or run twice: the
 * record's primary key makes a concurrent second attempt fail and roll back). `around`: statements
 * of the caller's at the transaction's start and before its commit (a move's incoming copy: its
 * guard, src/moves/sql/incoming.ts).
 */
export function migrationSql(
  config: ShardctlConfig,
  shard: number,
  migration: MigrationFile,
  around: MigrationSession & { readonly start?: readonly string[]; readonly end?: readonly string[] } = {},
): string {
  const schema = shardSchemaName(config, shard);
  return [
    'BEGIN;',
    WORKER_TRANSACTION_SQL,
    ...(around.start ?? []),
    `SET LOCAL search_path TO ${schemaSearchPath(schema)};`,
    `SET LOCAL lock_timeout = ${quoteLiteral(effectiveLockTimeout(config, migration))};`,
    ...(migration.statementTimeout
      ? [`SET LOCAL statement_timeout = ${quoteLiteral(migration.statementTimeout)};`]
      : []),
    `-- ${migration.name}.sql`,
    migration.sql.trimEnd(),
    ';',
    searchPathCheckSql(schema, migration),
    recordMigrationSql(shard, migration),
    ...(around.end ?? []),
    'COMMIT;',
    sessionResetSql(around.session),
  ].join('\n');
}

/** The worker's own session settings, sent again after the reset that ends each shard's migration (sessionResetSql). */
export interface MigrationSession {
  readonly session?: string;
}

/**
 * The search_path is the shard's (schemaSearchPath): its schema, then this session's temporary
 * schema if it has one. A function or `DO` body that moved it (another schema, or pg_temp first)
 * fails the condition.
 */
function searchPathMovedSql(schema: string): string {
  const shard = `${quoteLiteral(schema)}::pg_catalog.name`;
  return (
    `pg_catalog.current_schemas(false) IS DISTINCT FROM ARRAY[${shard}] AND ` +
    `pg_catalog.current_schemas(false) IS DISTINCT FROM ARRAY[${shard}, (SELECT nspname FROM pg_catalog.pg_namespace WHERE oid = pg_catalog.pg_my_temp_schema())]`
  );
}

/**
 * A migration marked no-transaction (e.g. CREATE INDEX CONCURRENTLY): each statement runs on its
 * own, then the record is written. A crash between the last two leaves the migration applied but
 * unrecorded, so such migrations must be re-runnable (IF NOT EXISTS). IF NOT EXISTS also skips the
 * invalid index an interrupted CREATE INDEX CONCURRENTLY leaves behind, so the record is refused
 * while the shard's schema holds one.
 */
export function noTransactionMigrationSteps(
  config: ShardctlConfig,
  shard: number,
  migration: MigrationFile,
  { session }: MigrationSession = {},
): string[] {
  const schema = shardSchemaName(config, shard);
  return [
    `SET search_path TO ${schemaSearchPath(schema)}; SET lock_timeout = ${quoteLiteral(effectiveLockTimeout(config, migration))};` +
      (migration.statementTimeout ? ` SET statement_timeout = ${quoteLiteral(migration.statementTimeout)};` : '') +
      // The statements run outside a transaction: the server checks for the client during them
      // (a killed run's CREATE INDEX CONCURRENTLY ends), whatever an earlier reset took away.
      ` ${clientCheckSql(false)}`,
    // search_path again before each later statement: a function or DO body in the file may have
    // moved it, and what ran outside a transaction cannot be undone by the check before the record.
    ...migration.statements.flatMap((statement, i) =>
      i === 0 ? [`${statement};`] : [`SET search_path TO ${schemaSearchPath(schema)};`, `${statement};`],
    ),
    [
      'DO $shardctl$',
      'DECLARE invalid text;',
      'BEGIN',
      "  SELECT string_agg(c.relname, ', ' ORDER BY c.relname) INTO invalid",
      '    FROM pg_catalog.pg_index i',
      '    JOIN pg_catalog.pg_class c ON c.oid = i.indexrelid',
      '    JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace',
      `   WHERE n.nspname = ${quoteLiteral(schema)} AND NOT i.indisvalid;`,
      `  IF ${searchPathMovedSql(schema)} THEN`,
      `    RAISE EXCEPTION 'migration ${migration.name.replaceAll("'", "''")} left search_path at %, not schema %: not recorded', pg_catalog.current_setting('search_path'), ${quoteLiteral(schema)};`,
      '  END IF;',
      '  IF invalid IS NOT NULL THEN',
      `    RAISE EXCEPTION 'invalid index % in schema %: an interrupted CREATE INDEX CONCURRENTLY left it, and IF NOT EXISTS skips it; drop it and run migrate again', invalid, ${quoteLiteral(schema)};`,
      '  END IF;',
      'END $shardctl$;',
      `${sessionResetSql(session)} ${recordMigrationSql(shard, migration)}`,
    ].join('\n'),
  ];
}

/** The lock_timeout a migration runs with: its `-- shardctl:lock-timeout` marker, else the config's lockTimeout. */
export function effectiveLockTimeout(
  config: Pick<ShardctlConfig, 'lockTimeout'>,
  migration: Pick<MigrationFile, 'lockTimeout'>,
): string {
  return migration.lockTimeout ?? config.lockTimeout;
}

/**
 * Fails the transaction when the file's statements left search_path anywhere but the shard's schema
 * (a SET or set_config inside a function or DO body, which the file check cannot read): the
 * file's effects are rolled back and nothing is recorded.
 */
function searchPathCheckSql(schema: string, migration: MigrationFile): string {
  return [
    'DO $shardctl$ BEGIN',
    `  IF ${searchPathMovedSql(schema)} THEN`,
    `    RAISE EXCEPTION 'migration ${migration.name.replaceAll("'", "''")} left search_path at %, not schema %: rolled back', pg_catalog.current_setting('search_path'), ${quoteLiteral(schema)};`,
    '  END IF;',
    'END $shardctl$;',
  ].join('\n');
}

function recordMigrationSql(shard: number, migration: MigrationFile): string {
  return (
    `INSERT INTO ${CONTROL}.migrations (shard, version, name, checksum) ` +
    `VALUES (${shard}, ${migration.version}, ${quoteLiteral(migration.name)}, ${quoteLiteral(migration.checksum)});`
  );
}
