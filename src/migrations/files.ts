import { createHash } from 'node:crypto';
import { readdir, readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { ConfigError, type ConfigIssue } from '../errors.js';
import { splitSql, splitSqlBothWays, transactionEscape } from '../pg/statements.js';

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
    for (const problem of migrationFileProblems(sql, migration.noTransaction)) {
      const statement = problem.statement.replace(/\s+/g, ' ');
      issues.push({
        path: 'migrations',
        message: `${path}:${problem.line}: ${JSON.stringify(statement.length > 60 ? `${statement.slice(0, 57)}...` : statement)}: ${problem.reason}; a migration runs on each shard in one transaction with its record, in the shard's schema`,
      });
    }
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
 * Splits SQL text at the semicolons that end statements, the way the server's lexer would (see
 * splitSql). Pieces holding only whitespace and comments are dropped.
 */
export function splitStatements(sql: string): string[] {
  return splitSql(sql).statements.map((s) => s.text);
}

/**
 * What a migration file may not hold, with the line of each offending statement. A file runs on
 * each shard inside one transaction with its record and search_path set to the shard's schema, so
 * a statement that ends that transaction (COMMIT, ROLLBACK, BEGIN, END, ABORT, PREPARE
 * TRANSACTION) would commit part of the file or record it without its effects, and one that
 * changes the session (SET without LOCAL, SET LOCAL search_path/role, RESET, DISCARD,
 * set_config) would send what follows outside the schema. SAVEPOINT, RELEASE, ROLLBACK TO and
 * SET LOCAL of other settings stay inside the transaction and are allowed. A no-transaction file
 * runs statement by statement outside any transaction: there SAVEPOINT, RELEASE and ROLLBACK TO
 * fail, and SET LOCAL does nothing, so they are refused as well. Bodies in quotes or dollar quotes
 * (functions, procedures, DO) are not read: what they do runs inside the transaction, and the
 * search_path is checked again before the record is written (migrationSql).
 */
export function migrationFileProblems(sql: string, noTransaction: boolean): { line: number; statement: string; reason: string }[] {
  const problems: { line: number; statement: string; reason: string }[] = [];
  for (const statement of splitSqlBothWays(sql)) {
    let reason = transactionEscape(statement);
    const [first, second] = statement.keywords;
    if (!reason && noTransaction) {
      if (first === 'savepoint' || first === 'release' || first === 'rollback') reason = `${first.toUpperCase()} needs a transaction, and a no-transaction file has none`;
      else if (first === 'set' && second === 'local') reason = 'SET LOCAL does nothing outside a transaction, and a no-transaction file has none';
    }
    if (reason && !problems.some((p) => p.line === statement.line && p.statement === statement.code)) problems.push({ line: statement.line, statement: statement.code, reason });
  }
  return problems.sort((a, b) => a.line - b.line);
}
