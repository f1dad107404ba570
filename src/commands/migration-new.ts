import { writeFile } from 'node:fs/promises';
import { basename, join } from 'node:path';
import type { ShardctlConfig } from '../config/types.js';
import { optionKeys, refuseUnknownOptions } from '../config/validate.js';
import { UsageError } from '../errors.js';
import {
  MAX_MIGRATION_VERSION,
  migrationNameProblem,
  NO_TRANSACTION_MARKER,
  readMigrations,
} from '../migrations/files.js';

export interface NewMigrationResult {
  /** The file written. */
  readonly path: string;
  /** File name without `.sql`, e.g. `0004_add_views`. */
  readonly name: string;
  readonly version: number;
  readonly noTransaction: boolean;
}

export interface NewMigrationOptions {
  /** A migration that runs outside a transaction (its header says so). */
  readonly noTransaction?: boolean;
}
const NEW_MIGRATION_KEYS = optionKeys<NewMigrationOptions>({ noTransaction: true });

/**
 * `shardctl migration new <name>`: writes the next `NNNN_name.sql` (one above the highest version
 * in the folder, as wide as the last file's number, at least four digits) with a short header on
 * how the file runs. The name must be one the loader accepts, and the folder must load (a bad file
 * already there would stop every command anyway); an existing file is never overwritten.
 */
export async function newMigration(
  config: Pick<ShardctlConfig, 'migrationsDir'>,
  name: string,
  options: NewMigrationOptions = {},
): Promise<NewMigrationResult> {
  refuseUnknownOptions('migration new options', options, NEW_MIGRATION_KEYS);
  const problem = migrationNameProblem(name);
  if (problem) throw new UsageError(problem, { input: 'name', value: name });
  const existing = await readMigrations(config.migrationsDir);
  const last = existing.at(-1);
  const version = (last?.version ?? 0) + 1;
  if (version > MAX_MIGRATION_VERSION)
    throw new UsageError(`the folder's last version ${last!.version} leaves no version for a new file`, {
      input: 'name',
      value: name,
    });
  const width = Math.max(4, last ? last.name.indexOf('_') : 0);
  const fileName = `${String(version).padStart(width, '0')}_${name}`;
  const path = join(config.migrationsDir, `${fileName}.sql`);
  const noTransaction = options.noTransaction ?? false;
  try {
    await writeFile(path, migrationHeader(fileName, noTransaction), { flag: 'wx' });
  } catch (error) {
    if ((error as { code?: unknown }).code === 'EEXIST')
      throw new UsageError(`${basename(path)} exists already`, { input: 'name', value: name });
    throw error;
  }
  return { path, name: fileName, version, noTransaction };
}

/** The header of a new file: how it runs, and the markers it may carry. */
export function migrationHeader(fileName: string, noTransaction: boolean): string {
  const lines = noTransaction
    ? [
        NO_TRANSACTION_MARKER,
        `-- ${fileName}: applied once to every shard schema, in version order, with search_path set to`,
        "-- the shard's schema (qualify anything outside it). Runs OUTSIDE a transaction, statement by",
        '-- statement (e.g. CREATE INDEX CONCURRENTLY), one shard at a time per host, and is recorded after',
        '-- its last statement: write it re-runnable (IF NOT EXISTS), a crash before the record runs it again.',
      ]
    : [
        `-- ${fileName}: applied once to every shard schema, in version order, with search_path set to`,
        "-- the shard's schema (qualify anything outside it), in one transaction with its record. Do not",
        '-- commit, roll back or change search_path/role here; SET LOCAL of other settings is fine.',
      ];
  return [
    ...lines,
    "-- Own timeouts (default: the config's lockTimeout; a lock timeout is retried): a comment line",
    '-- "-- shardctl:lock-timeout 2s" or "-- shardctl:statement-timeout 10min" up here.',
    '',
    '',
  ].join('\n');
}
