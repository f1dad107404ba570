import { createHash } from 'node:crypto';
import { readdir, readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { ConfigError, type ConfigIssue } from '../errors.js';

/**
 * A migration file: `NNNN_name.sql` in the migrations folder, applied once to every shard schema
 * with search_path set to that schema.
 */
export interface MigrationFile {
  readonly version: number;
  /** File name without `.sql`, e.g. `0001_photos`. */
  readonly name: string;
  readonly path: string;
  readonly sql: string;
  /** sha256 of the file's bytes, hex. An applied migration whose file changes is drift. */
  readonly checksum: string;
  /** Marked `-- shardctl:no-transaction`: run outside a transaction (e.g. CREATE INDEX CONCURRENTLY). */
  readonly noTransaction: boolean;
}

const FILE_NAME = /^(\d{1,9})_([A-Za-z0-9][A-Za-z0-9_.-]*)\.sql$/;
export const NO_TRANSACTION_MARKER = '-- shardctl:no-transaction';

export async function readMigrations(dir: string): Promise<MigrationFile[]> {
  let entries: string[];
  try {
    entries = await readdir(dir);
  } catch (error) {
    throw new ConfigError(dir, [{ path: 'migrations', message: `cannot read the migrations folder ${dir}: ${(error as Error).message}` }]);
  }
  const issues: ConfigIssue[] = [];
  const byVersion = new Map<number, MigrationFile>();
  for (const entry of entries.sort()) {
    if (!entry.endsWith('.sql')) continue;
    const match = FILE_NAME.exec(entry);
    if (!match) {
      issues.push({ path: 'migrations', message: `file ${JSON.stringify(entry)} is not named NNNN_name.sql` });
      continue;
    }
    const version = Number(match[1]);
    if (version === 0) {
      issues.push({ path: 'migrations', message: `file ${JSON.stringify(entry)}: versions start at 1` });
      continue;
    }
    const path = join(dir, entry);
    const bytes = await readFile(path);
    const sql = bytes.toString('utf8');
    const migration: MigrationFile = {
      version,
      name: entry.slice(0, -'.sql'.length),
      path,
      sql,
      checksum: createHash('sha256').update(bytes).digest('hex'),
      noTransaction: hasNoTransactionMarker(sql),
    };
    const existing = byVersion.get(version);
    if (existing) {
      issues.push({ path: 'migrations', message: `files ${existing.name}.sql and ${entry} have the same version ${version}` });
      continue;
    }
    byVersion.set(version, migration);
  }
  if (issues.length > 0) throw new ConfigError(dir, issues);
  return [...byVersion.values()].sort((a, b) => a.version - b.version);
}

/** The marker counts only among the comment lines at the top of the file. */
export function hasNoTransactionMarker(sql: string): boolean {
  for (const raw of sql.split('\n')) {
    const line = raw.trim();
    if (line === '') continue;
    if (!line.startsWith('--')) return false;
    if (line.toLowerCase() === NO_TRANSACTION_MARKER) return true;
  }
  return false;
}
