import { createHash } from 'node:crypto';
import { readdir, readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { DURATION, durationMs } from '../config/duration.js';
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
  /** `-- shardctl:lock-timeout 2s`: this file's lock_timeout instead of the config's lockTimeout. */
  readonly lockTimeout: string | null;
  /** `-- shardctl:statement-timeout 10min`: this file's statement_timeout (default: the server's). */
  readonly statementTimeout: string | null;
  /**
   * The file's statements, for no-transaction files: PostgreSQL runs several statements sent as one
   * string in one implicit transaction, where CREATE INDEX CONCURRENTLY refuses to run.
   */
  readonly statements: readonly string[];
}

const FILE_NAME = /^(\d{1,9})_([A-Za-z0-9][A-Za-z0-9_.-]*)\.sql$/;
/** The part of a file name after `NNNN_`: what `migration new` accepts too. */
export const MIGRATION_NAME = /^[A-Za-z0-9][A-Za-z0-9_.-]*$/;
export const NO_TRANSACTION_MARKER = '-- shardctl:no-transaction';
export const LOCK_TIMEOUT_MARKER = '-- shardctl:lock-timeout';
export const STATEMENT_TIMEOUT_MARKER = '-- shardctl:statement-timeout';

/** The highest version a file name may carry (nine digits). */
export const MAX_MIGRATION_VERSION = 999_999_999;

export async function readMigrations(dir: string): Promise<MigrationFile[]> {
  let entries: string[];
  try {
    entries = await readdir(dir);
  } catch (error) {
    throw new ConfigError(dir, [
      { path: 'migrations', message: `cannot read the migrations folder ${dir}: ${(error as Error).message}` },
    ]);
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
    // A byte-order mark (editors on Windows write one) is not SQL: the server would read it as part
    // of the first word. The checksum stays the file's bytes.
    const sql = bytes.toString('utf8').replace(/^\uFEFF/, '');
    const markers = readMarkers(sql);
    for (const problem of markers.problems)
      issues.push({ path: 'migrations', message: `${path}:${problem.line}: ${problem.message}` });
    const migration: MigrationFile = {
      version,
      name: entry.slice(0, -'.sql'.length),
      path,
      sql,
      checksum: createHash('sha256').update(bytes).digest('hex'),
      noTransaction: markers.noTransaction,
      lockTimeout: markers.lockTimeout,
      statementTimeout: markers.statementTimeout,
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
      issues.push({
        path: 'migrations',
        message: `files ${existing.name}.sql and ${entry} have the same version ${version}`,
      });
      continue;
    }
    byVersion.set(version, migration);
  }
  if (issues.length > 0) throw new ConfigError(dir, issues);
  return [...byVersion.values()].sort((a, b) => a.version - b.version);
}

/** The marker counts only among the comment lines at the top of the file. */
export function hasNoTransactionMarker(sql: string): boolean {
  return readMarkers(sql).noTransaction;
}

export interface MigrationMarkers {
  readonly noTransaction: boolean;
  readonly lockTimeout: string | null;
  readonly statementTimeout: string | null;
  /** A `-- shardctl:` line that is not a known marker, or a marker with a bad value. */
  readonly problems: readonly { line: number; message: string }[];
}

/**
 * The `-- shardctl:` markers among the comment lines at the top of a file. They are comments, so a
 * linter and psql read the file as it is; the runner turns the timeouts into SET LOCAL (SET, reset
 * afterwards, in a no-transaction file) before the file's first statement, and knows the values
 * when it reports a lock timeout. A misspelt marker would silently do nothing, so an unknown one
 * is refused.
 */
export function readMarkers(sql: string): MigrationMarkers {
  let noTransaction = false;
  let lockTimeout: string | null = null;
  let statementTimeout: string | null = null;
  const problems: { line: number; message: string }[] = [];
  const lines = sql.split('\n');
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i]!.trim();
    if (line === '') continue;
    if (!line.startsWith('--')) break;
    const marker = /^--\s*shardctl:(\S*)\s*(.*)$/i.exec(line);
    if (!marker) continue;
    const [, key = '', value = ''] = marker;
    const known = `known markers: ${NO_TRANSACTION_MARKER}, ${LOCK_TIMEOUT_MARKER} DURATION, ${STATEMENT_TIMEOUT_MARKER} DURATION`;
    switch (key.toLowerCase()) {
      case 'no-transaction':
        if (value.trim() !== '')
          problems.push({
            line: i + 1,
            message: `${NO_TRANSACTION_MARKER} takes no value, got ${JSON.stringify(value.trim())}`,
          });
        noTransaction = true;
        break;
      case 'lock-timeout':
      case 'statement-timeout': {
        const text = value.trim();
        const name = key.toLowerCase() === 'lock-timeout' ? LOCK_TIMEOUT_MARKER : STATEMENT_TIMEOUT_MARKER;
        if (!DURATION.test(text) || durationMs(text) === 0) {
          // 0 means "wait forever" to PostgreSQL: what a timeout exists to prevent.
          problems.push({
            line: i + 1,
            message: `${name} ${JSON.stringify(text)}: expected a duration above 0 such as 500ms, 5s or 2min`,
          });
        } else if (name === LOCK_TIMEOUT_MARKER) lockTimeout = text;
        else statementTimeout = text;
        break;
      }
      default:
        problems.push({ line: i + 1, message: `unknown marker ${JSON.stringify(line)} (${known})` });
    }
  }
  return { noTransaction, lockTimeout, statementTimeout, problems };
}

/** Why `name` cannot be the name part of a migration file (`NNNN_<name>.sql`), or null when it can. */
export function migrationNameProblem(name: string): string | null {
  if (!MIGRATION_NAME.test(name))
    return 'expected letters, digits, _ . or -, starting with a letter or digit (the file is named NNNN_<name>.sql)';
  if (name.length > MIGRATION_NAME_MAX)
    return `is ${name.length} characters long; at most ${MIGRATION_NAME_MAX}, so that NNNN_<name>.sql fits a file name (255 bytes)`;
  return null;
}

/** The longest name part: with a version of up to 10 digits, '_' and '.sql', a file name stays under 255 bytes. */
export const MIGRATION_NAME_MAX = 200;

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
export function migrationFileProblems(
  sql: string,
  noTransaction: boolean,
): { line: number; statement: string; reason: string }[] {
  const problems: { line: number; statement: string; reason: string }[] = [];
  // A file is sent with its check, its record, COMMIT and the next files' transactions after it in
  // one string: a comment, string, quoted name or dollar quote the file leaves open would take in
  // that text (its record and COMMIT with it) up to whatever closes it in a later file, which would
  // then run in this file's transaction: applied unrecorded, or recorded unapplied.
  const read = splitSql(sql);
  if (read.unterminated) {
    const lines = sql.trimEnd().split('\n');
    problems.push({
      line: lines.length,
      statement: lines.at(-1)!.trim(),
      reason:
        'the file ends inside a comment, string, quoted name or dollar quote that it never closes; close it (the text shardctl sends after the file would be taken into it)',
    });
  }
  for (const statement of splitSqlBothWays(sql)) {
    let reason = transactionEscape(statement);
    const [first, second] = statement.keywords;
    if (!reason && noTransaction) {
      if (first === 'savepoint' || first === 'release' || first === 'rollback')
        reason = `${first.toUpperCase()} needs a transaction, and a no-transaction file has none`;
      else if (first === 'set' && second === 'local')
        reason = 'SET LOCAL does nothing outside a transaction, and a no-transaction file has none';
    }
    if (reason && !problems.some((p) => p.line === statement.line && p.statement === statement.code))
      problems.push({ line: statement.line, statement: statement.code, reason });
  }
  return problems.sort((a, b) => a.line - b.line);
}
