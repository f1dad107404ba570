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
  /**
   * The file's statements, for no-transaction files: PostgreSQL runs several statements sent as one
   * string in one implicit transaction, where CREATE INDEX CONCURRENTLY refuses to run.
   */
  readonly statements: readonly string[];
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
      statements: splitStatements(sql),
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

/**
 * Splits SQL text at the semicolons that end statements, the way the server's lexer would: not
 * inside quotes ('', E'', ""), dollar quotes ($$, $tag$) or comments (--, nested /* *\/).
 * Pieces holding only whitespace and comments are dropped. Not handled: BEGIN ATOMIC bodies.
 */
export function splitStatements(sql: string): string[] {
  const statements: string[] = [];
  let start = 0;
  let i = 0;
  let meaningful = false;
  const push = (end: number): void => {
    if (meaningful) statements.push(sql.slice(start, end).trim());
    start = end + 1;
    meaningful = false;
  };
  while (i < sql.length) {
    const ch = sql[i]!;
    const next = sql[i + 1];
    if (ch === '-' && next === '-') {
      const end = sql.indexOf('\n', i);
      i = end === -1 ? sql.length : end + 1;
    } else if (ch === '/' && next === '*') {
      let depth = 1;
      i += 2;
      while (i < sql.length && depth > 0) {
        const pair = sql.slice(i, i + 2);
        if (pair === '/*' || pair === '*/') {
          depth += pair === '/*' ? 1 : -1;
          i += 2;
        } else {
          i += 1;
        }
      }
    } else if (ch === "'") {
      meaningful = true;
      const escapes = /[eE]/.test(sql[i - 1] ?? '') && !IDENTIFIER_CHAR.test(sql[i - 2] ?? '');
      i += 1;
      while (i < sql.length) {
        if (escapes && sql[i] === '\\') i += 2;
        else if (sql[i] === "'" && sql[i + 1] === "'") i += 2;
        else if (sql[i] === "'") break;
        else i += 1;
      }
      i += 1;
    } else if (ch === '"') {
      meaningful = true;
      const end = sql.indexOf('"', i + 1);
      i = end === -1 ? sql.length : end + 1;
    } else if (ch === '$' && !IDENTIFIER_CHAR.test(sql[i - 1] ?? '')) {
      const tag = /^\$(?:[A-Za-z_\u0080-\uffff][A-Za-z0-9_\u0080-\uffff]*)?\$/.exec(sql.slice(i, i + 64));
      if (tag) {
        meaningful = true;
        const end = sql.indexOf(tag[0], i + tag[0].length);
        i = end === -1 ? sql.length : end + tag[0].length;
      } else {
        i += 1;
      }
    } else if (ch === ';') {
      push(i);
      i += 1;
    } else {
      if (!/\s/.test(ch)) meaningful = true;
      i += 1;
    }
  }
  push(sql.length);
  return statements;
}

const IDENTIFIER_CHAR = /[A-Za-z0-9_$\u0080-\uffff]/;
