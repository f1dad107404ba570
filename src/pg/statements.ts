/**
 * The top-level statements of a PostgreSQL text, found the way the server's lexer finds them, so
 * that a check reads the statements the server will run and not a semicolon or a keyword inside a
 * string, a comment, a dollar-quoted body or a quoted identifier. Only lexing: no grammar.
 *
 * Handled: `--` and nested `/* *\/` comments; '…' strings with '' (and, with `backslashQuotes`,
 * \' — the server's reading when standard_conforming_strings is off); E'…' strings with backslash
 * escapes; "…" identifiers with ""; $tag$…$tag$ dollar quotes ($1 is a parameter, a$b$ an
 * identifier); the BEGIN ATOMIC … END body of CREATE FUNCTION/PROCEDURE, whose semicolons do not
 * end the statement (psql counts BEGIN/CASE … END the same way).
 *
 * A text whose last string, identifier, dollar quote or comment is left open has `unterminated`
 * set: the server refuses such a text as a whole, before running any of it.
 */

export type SqlTokenKind = 'word' | 'identifier' | 'string' | 'number' | 'parameter' | 'symbol';

export interface SqlToken {
  readonly kind: SqlTokenKind;
  /**
   * word: lower-cased (unquoted names fold to lower case); identifier: the name inside the double
   * quotes, "" undone; string: the raw text with its quotes; others: the text.
   */
  readonly value: string;
  /** 1-based line of the token's first character. */
  readonly line: number;
}

export interface SqlStatement {
  /** The statement's text without its semicolon, trimmed (leading comments kept). */
  readonly text: string;
  /** The text from its first token on: what a message quotes. */
  readonly code: string;
  /** 1-based line of its first token. */
  readonly line: number;
  /** Its tokens, comments and whitespace left out. */
  readonly tokens: readonly SqlToken[];
  /** The leading bare words, lower-cased, up to the first token that is not one (e.g. ['set', 'local', 'search_path']). */
  readonly keywords: readonly string[];
}

export interface SplitSqlResult {
  readonly statements: SqlStatement[];
  /** A string, identifier, dollar quote or comment is still open at the end of the text. */
  readonly unterminated: boolean;
}

export interface SplitSqlOptions {
  /** Read \' inside '…' as an escaped quote (standard_conforming_strings = off). */
  readonly backslashQuotes?: boolean;
}

const IDENT_START = /[A-Za-z_\u0080-\uffff]/;
const IDENT_CHAR = /[A-Za-z0-9_$\u0080-\uffff]/;
const DOLLAR_TAG = /^\$(?:[A-Za-z_\u0080-\uffff][A-Za-z0-9_\u0080-\uffff]*)?\$/;

/** Splits a text into its top-level statements; empty statements (only comments, whitespace) are dropped. */
export function splitSql(sql: string, options: SplitSqlOptions = {}): SplitSqlResult {
  const statements: SqlStatement[] = [];
  let unterminated = false;
  let line = 1;
  let i = 0;
  let start = 0;
  let tokens: SqlToken[] = [];
  /** Where the statement's first token starts. */
  let codeStart = 0;
  /** Open BEGIN/CASE of a CREATE FUNCTION/PROCEDURE's BEGIN ATOMIC body. */
  let depth = 0;

  const advance = (to: number): void => {
    for (let k = i; k < to && k < sql.length; k++) if (sql.charCodeAt(k) === 10) line += 1;
    i = Math.min(to, sql.length);
  };
  const push = (kind: SqlTokenKind, value: string, tokenLine: number): void => {
    if (tokens.length === 0) codeStart = i;
    tokens.push({ kind, value, line: tokenLine });
    if (kind === 'word' && isRoutineDefinition(tokens)) {
      // The body opens with the two words BEGIN ATOMIC: `begin` alone is any name (a parameter
      // `begin bigint`, a column), and taken for the body it would hide every `;` up to an `end`.
      if (depth === 0) {
        if (value === 'atomic' && tokens.at(-2)?.kind === 'word' && tokens.at(-2)?.value === 'begin') depth = 1;
      } else if (value === 'case') depth += 1;
      else if (value === 'end') depth -= 1;
    }
  };
  const end = (at: number): void => {
    if (tokens.length > 0) {
      statements.push({
        text: sql.slice(start, at).trim(),
        code: sql.slice(codeStart, at).trim(),
        line: tokens[0]!.line,
        tokens,
        keywords: leadingWords(tokens),
      });
    }
    tokens = [];
    depth = 0;
    start = at + 1;
  };

  while (i < sql.length) {
    const ch = sql[i]!;
    const next = sql[i + 1];
    const tokenLine = line;
    if (/\s/.test(ch)) {
      advance(i + 1);
    } else if (ch === '-' && next === '-') {
      let eol = i + 2;
      while (eol < sql.length && sql[eol] !== '\n' && sql[eol] !== '\r') eol += 1;
      advance(eol);
    } else if (ch === '/' && next === '*') {
      let nesting = 1;
      let k = i + 2;
      while (k < sql.length && nesting > 0) {
        if (sql[k] === '/' && sql[k + 1] === '*') {
          nesting += 1;
          k += 2;
        } else if (sql[k] === '*' && sql[k + 1] === '/') {
          nesting -= 1;
          k += 2;
        } else k += 1;
      }
      if (nesting > 0) unterminated = true;
      advance(k);
    } else if (ch === "'") {
      const escapes = options.backslashQuotes === true || isEscapeStringPrefix(sql, i);
      let k = i + 1;
      let closed = false;
      while (k < sql.length) {
        if (escapes && sql[k] === '\\') k += 2;
        else if (sql[k] === "'" && sql[k + 1] === "'") k += 2;
        else if (sql[k] === "'") {
          closed = true;
          k += 1;
          break;
        } else k += 1;
      }
      if (!closed) unterminated = true;
      push('string', sql.slice(i, Math.min(k, sql.length)), tokenLine);
      advance(k);
    } else if (ch === '"') {
      let k = i + 1;
      let name = '';
      let closed = false;
      while (k < sql.length) {
        if (sql[k] === '"' && sql[k + 1] === '"') {
          name += '"';
          k += 2;
        } else if (sql[k] === '"') {
          closed = true;
          k += 1;
          break;
        } else {
          name += sql[k];
          k += 1;
        }
      }
      if (!closed) unterminated = true;
      push('identifier', sql[i - 1] === '&' ? decodeUnicodeEscapes(name, sql.slice(k, k + 64)) : name, tokenLine);
      advance(k);
    } else if (ch === '$' && /[0-9]/.test(next ?? '')) {
      const m = /^\$[0-9]+/.exec(sql.slice(i, i + 12))!;
      push('parameter', m[0], tokenLine);
      advance(i + m[0].length);
    } else if (ch === '$') {
      const tag = DOLLAR_TAG.exec(sql.slice(i, i + 128));
      if (tag) {
        const close = sql.indexOf(tag[0], i + tag[0].length);
        if (close === -1) unterminated = true;
        const k = close === -1 ? sql.length : close + tag[0].length;
        push('string', sql.slice(i, k), tokenLine);
        advance(k);
      } else {
        push('symbol', ch, tokenLine);
        advance(i + 1);
      }
    } else if (IDENT_START.test(ch)) {
      let k = i + 1;
      while (k < sql.length && IDENT_CHAR.test(sql[k]!)) k += 1;
      // E'…', U&'…', B'…', X'…', N'…': the prefix belongs to the string that follows.
      if (
        sql[k] === "'" ||
        (sql[k] === '&' && /^[uU]$/.test(sql.slice(i, k)) && (sql[k + 1] === "'" || sql[k + 1] === '"'))
      ) {
        if (/^[eEbBxXnN]$/.test(sql.slice(i, k)) || sql[k] === '&') {
          advance(sql[k] === '&' ? k + 1 : k);
          continue;
        }
      }
      push('word', sql.slice(i, k).toLowerCase(), tokenLine);
      advance(k);
    } else if (/[0-9]/.test(ch) || (ch === '.' && /[0-9]/.test(next ?? ''))) {
      let k = i + 1;
      while (k < sql.length && /[0-9A-Za-z_.]/.test(sql[k]!)) {
        if (sql[k] === '.' && sql[k + 1] === '.') break;
        k += 1;
      }
      push('number', sql.slice(i, k), tokenLine);
      advance(k);
    } else if (ch === ';' && depth === 0) {
      end(i);
      advance(i + 1);
    } else {
      push('symbol', ch, tokenLine);
      advance(i + 1);
    }
  }
  end(sql.length);
  return { statements, unterminated };
}

/**
 * The name a U&"…" identifier stands for: \XXXX and \+XXXXXX (or the UESCAPE character given after
 * it), so that U&"set\005fconfig" is seen as set_config.
 */
function decodeUnicodeEscapes(name: string, after: string): string {
  const escape = /^\s*uescape\s*'([^'])'/i.exec(after)?.[1] ?? '\\';
  let out = '';
  for (let k = 0; k < name.length; k++) {
    if (name[k] !== escape) {
      out += name[k];
      continue;
    }
    if (name[k + 1] === escape) {
      out += escape;
      k += 1;
      continue;
    }
    const long = name[k + 1] === '+';
    const hex = name.slice(k + (long ? 2 : 1), k + (long ? 8 : 5));
    if (!/^[0-9A-Fa-f]+$/.test(hex) || hex.length !== (long ? 6 : 4)) return `\u0000${name}`;
    out += String.fromCodePoint(parseInt(hex, 16));
    k += long ? 7 : 4;
  }
  return out;
}

/** An E'…' string: the E stands alone (not the end of a longer name such as `name'…'`). */
function isEscapeStringPrefix(sql: string, quote: number): boolean {
  return /[eE]/.test(sql[quote - 1] ?? '') && !IDENT_CHAR.test(sql[quote - 2] ?? '');
}

/** CREATE [OR REPLACE] FUNCTION|PROCEDURE: the statements whose BEGIN ATOMIC body holds semicolons. */
function isRoutineDefinition(tokens: readonly SqlToken[]): boolean {
  const words = leadingWords(tokens.slice(0, 4));
  if (words[0] !== 'create') return false;
  const kind = words[1] === 'or' && words[2] === 'replace' ? words[3] : words[1];
  return kind === 'function' || kind === 'procedure';
}

function leadingWords(tokens: readonly SqlToken[]): string[] {
  const words: string[] = [];
  for (const token of tokens) {
    if (token.kind !== 'word') break;
    words.push(token.value);
  }
  return words;
}

/**
 * The statements of both readings of a text: standard_conforming_strings on (the default since
 * PostgreSQL 9.1) and off (\' escapes a quote). A check that must hold whatever the server's
 * setting runs over both; they differ only where a backslash stands before a quote.
 */
export function splitSqlBothWays(sql: string): SqlStatement[] {
  const standard = splitSql(sql).statements;
  const legacy = splitSql(sql, { backslashQuotes: true });
  // The server parses a whole text before running any of it: where the legacy reading leaves a
  // quote open, a server that reads it that way runs nothing.
  if (legacy.unterminated) return standard;
  // Keyed by line and text: a file of many statements is compared in one pass, not each with each.
  const seen = new Set(standard.map((t) => `${t.line}\u0000${t.text}`));
  return [...standard, ...legacy.statements.filter((s) => !seen.has(`${s.line}\u0000${s.text}`))];
}

/**
 * The first statement of `sql` (in either reading: splitSqlBothWays) that would end its transaction
 * or change the session beyond it (transactionEscape, by default with the router's reading of a DO
 * body: ROUTER_ESCAPES), named by its line and start; undefined when none does.
 */
export function firstEscape(sql: string, options: EscapeOptions = ROUTER_ESCAPES): string | undefined {
  for (const statement of splitSqlBothWays(sql)) {
    const escape = transactionEscape(statement, options);
    if (escape) return `line ${statement.line} ${JSON.stringify(statement.code.slice(0, 60))}: ${escape}`;
  }
  return undefined;
}

/**
 * How much of a DO block's body transactionEscape reads beyond its SET, RESET, set_config() and
 * session locks (what it always reads). Migration files get neither of these: a file applied by an
 * earlier release must still load.
 */
export interface EscapeOptions {
  /**
   * Each PL/pgSQL statement of the body that starts with a statement refused on its own (a
   * temporary table without ON COMMIT DROP, LISTEN, PREPARE, DECLARE … WITH HOLD, DISCARD).
   */
  readonly doStatements?: boolean;
  /** PL/pgSQL's EXECUTE, whose SQL is made as the block runs and cannot be read. */
  readonly doExecute?: boolean;
}

/** The router's check (a pooled connection serves every shard of its host): all of a DO body. */
export const ROUTER_ESCAPES: EscapeOptions = { doStatements: true, doExecute: true };

/** Statements that do the same in a transaction block and in the implicit transaction of one statement. */
const BLOCK_NEUTRAL = new Set(['select', 'with', 'values', 'table', 'insert', 'update', 'delete', 'merge']);

/**
 * Whether a text is one statement that does the same whether or not it runs in a transaction block:
 * a query or a write of rows (SELECT, WITH, VALUES, TABLE, INSERT, UPDATE, DELETE, MERGE). Not
 * statements that need a block (LOCK, DECLARE, SAVEPOINT, SET LOCAL: refused or void outside one),
 * nor CALL and DO, whose procedures may commit when they run outside one.
 */
export function blockNeutral(sql: string): boolean {
  const statements = splitSqlBothWays(sql);
  return statements.length === 1 && BLOCK_NEUTRAL.has(statements[0]!.keywords[0] ?? '');
}

/**
 * Why a statement would end the transaction it runs in, or change the session beyond it (so that
 * what follows it, or the next user of the connection, runs elsewhere or as someone else);
 * undefined when it does neither. `SET LOCAL` of other settings stays inside the transaction and
 * is allowed; SAVEPOINT, RELEASE and ROLLBACK TO stay inside it too.
 */
export function transactionEscape(statement: SqlStatement, options: EscapeOptions = {}): string | undefined {
  const [first, second, third] = statement.keywords;
  switch (first) {
    case 'begin':
    case 'start':
    case 'commit':
    case 'end':
    case 'abort':
      return `${first.toUpperCase()} ends or starts a transaction`;
    case 'rollback':
      if (second === 'to') return undefined;
      return 'ROLLBACK ends the transaction';
    case 'prepare':
      if (second === 'transaction') return 'PREPARE TRANSACTION ends the transaction';
      return 'PREPARE keeps a prepared statement on the connection after the transaction';
    case 'listen':
      return 'LISTEN keeps the connection listening after the transaction';
    case 'declare':
      if (followedBy(statement, 'with', 'hold'))
        return 'DECLARE … WITH HOLD keeps the cursor open after the transaction';
      return undefined;
    case 'create':
      if (
        (isTemporary(statement.tokens, second === 'or' && third === 'replace' ? 3 : 1) ||
          createsInTempSchema(statement)) &&
        !followedBy(statement, 'on', 'commit', 'drop')
      )
        return TEMPORARY_ESCAPE;
      return undefined;
    case 'do': {
      // The body is text to PostgreSQL, and only a DO's body runs where it is written: what it
      // says is looked at as a statement's tokens are (a function it calls is not).
      const body = statement.tokens.find((t) => t.kind === 'string');
      const inner = body === undefined ? undefined : bodyEscape(body.value, options);
      return inner === undefined ? undefined : `DO: ${inner}`;
    }
    case 'explain': {
      // EXPLAIN ANALYZE runs its statement: CREATE TABLE … AS (a temporary one included) is made.
      const inner = explained(statement);
      return inner === undefined ? undefined : transactionEscape(inner, options);
    }
    case 'reset':
      return RESET_ESCAPE;
    case 'discard':
      return 'DISCARD changes the session';
    case 'set':
      if (second === 'local') {
        const name = statement.tokens[2]?.value.toLowerCase();
        if (name !== undefined && SESSION_IDENTITY.has(name)) {
          return `SET LOCAL ${name} changes where or as whom the rest of the transaction runs`;
        }
        return undefined;
      }
      if (second === 'transaction' || (second === 'constraints' && third !== undefined)) return undefined;
      return 'SET outlives the transaction (use SET LOCAL; search_path and role cannot be changed)';
    default:
  }
  if (selectsIntoTemporary(statement)) return TEMPORARY_ESCAPE;
  const call = callEscape(statement);
  if (call !== undefined) return call;
  if (mentions(statement, 'update') && mentions(statement, 'pg_settings'))
    return 'UPDATE pg_settings changes a setting for the session';
  return undefined;
}

/** The statement an EXPLAIN runs or plans: after its options, `( … )` or ANALYZE / VERBOSE. */
function explained(statement: SqlStatement): SqlStatement | undefined {
  const tokens = statement.tokens;
  let at = 1;
  if (isSymbol(tokens[at], '(')) {
    for (let depth = 0; at < tokens.length; at++) {
      if (isSymbol(tokens[at], '(')) depth++;
      else if (isSymbol(tokens[at], ')') && --depth === 0) break;
    }
    at++;
  } else {
    while (tokens[at]?.kind === 'word' && ['analyze', 'analyse', 'verbose'].includes(tokens[at]!.value)) at++;
  }
  if (at >= tokens.length) return undefined;
  const rest = tokens.slice(at);
  return { ...statement, tokens: rest, keywords: leadingWords(rest) };
}

const RESET_ESCAPE = 'RESET changes settings for the rest of the session (search_path, role, …)';

const TEMPORARY_ESCAPE =
  'a temporary table (CREATE TEMPORARY, SELECT … INTO TEMPORARY, a name in pg_temp) outlives the transaction, and comes first in name lookups on that connection (CREATE TEMPORARY … ON COMMIT DROP does not)';

/** TEMP, TEMPORARY, or LOCAL / GLOBAL and one of those, from tokens[at] on. */
function isTemporary(tokens: readonly SqlToken[], at: number): boolean {
  const word = (i: number): string | undefined => (tokens[i]?.kind === 'word' ? tokens[i]!.value : undefined);
  const temp = (w: string | undefined): boolean => w === 'temp' || w === 'temporary';
  return temp(word(at)) || ((word(at) === 'local' || word(at) === 'global') && temp(word(at + 1)));
}

/** The session's temporary schema as a name's qualifier: pg_temp (or pg_temp_N) followed by a dot. */
function tempSchemaAt(tokens: readonly SqlToken[], at: number): boolean {
  const token = tokens[at];
  return (
    (token?.kind === 'word' || token?.kind === 'identifier') &&
    /^pg_temp(_\d+)?$/.test(token.value) &&
    isSymbol(tokens[at + 1], '.')
  );
}

/**
 * A CREATE whose new object is in the session's temporary schema (CREATE TABLE pg_temp.t …): a
 * pg_temp name in the statement's head, before its body starts (`(`, AS, ON). A table made from a
 * temporary one (CREATE TABLE t AS SELECT … FROM pg_temp.x, LIKE pg_temp.x) is an ordinary table.
 * A view is temporary whenever it reads a temporary table, so for a view any pg_temp name counts.
 */
function createsInTempSchema(statement: SqlStatement): boolean {
  const tokens = statement.tokens;
  const bodyAt = tokens.findIndex(
    (token, i) =>
      i > 0 && (isSymbol(token, '(') || (token.kind === 'word' && (token.value === 'as' || token.value === 'on'))),
  );
  const view = tokens
    .slice(0, bodyAt < 0 ? tokens.length : bodyAt)
    .some((t) => t.kind === 'word' && t.value === 'view');
  const end = view || bodyAt < 0 ? tokens.length : bodyAt;
  return tokens.some((_, i) => i < end && tempSchemaAt(tokens, i));
}

/**
 * SELECT … INTO TEMPORARY t, or INTO pg_temp.t: a new temporary table. INTO after INSERT or MERGE
 * names the table written to (which may be called temp), not a new one.
 */
function selectsIntoTemporary(statement: SqlStatement): boolean {
  const tokens = statement.tokens;
  return tokens.some((token, i) => {
    if (token.kind !== 'word' || token.value !== 'into') return false;
    const before = tokens[i - 1];
    if (before?.kind === 'word' && (before.value === 'insert' || before.value === 'merge')) return false;
    return (
      isTemporary(tokens, i + 1) ||
      tempSchemaAt(tokens, i + 1) ||
      (tokens[i + 1]?.kind === 'word' && tokens[i + 1]!.value === 'table' && tempSchemaAt(tokens, i + 2))
    );
  });
}

/** Why a function the statement calls changes the session beyond the transaction: set_config(), a session advisory lock. */
function callEscape(statement: SqlStatement): string | undefined {
  if (setsBeyondTransaction(statement.tokens))
    return "set_config() changes a setting beyond the transaction, or where or as whom it runs (set_config('name', value, true) of another setting is allowed)";
  const lock = callsAny(statement, (name) => SESSION_LOCKS.has(name));
  return lock === undefined ? undefined : `${lock}() holds its lock after the transaction (use pg_advisory_xact_lock)`;
}

/**
 * Whether a set_config() call among the tokens may change the session: every call but
 * `set_config('a_name', value, true)`, whose setting is named by a plain string literal, is not one
 * of where or as whom statements run (SESSION_IDENTITY), and is set for the transaction only (the
 * third argument the bare word true). Such a call is what row-level security's
 * `set_config('app.user_id', $1, true)` is; its value may be any expression without parentheses.
 */
function setsBeyondTransaction(tokens: readonly SqlToken[]): boolean {
  for (const [i, token] of tokens.entries()) {
    if ((token.kind !== 'word' && token.kind !== 'identifier') || token.value !== 'set_config') continue;
    if (!isSymbol(tokens[i + 1], '(')) {
      // set_config U&"…" UESCAPE '…' ( …: a spelling no application needs; refused.
      if (tokens[i + 1]?.kind === 'word' && tokens[i + 1]!.value === 'uescape') return true;
      continue;
    }
    const name = /^'([a-z_][a-z0-9_.]*)'$/i.exec(tokens[i + 2]?.kind === 'string' ? tokens[i + 2]!.value : '')?.[1];
    if (name === undefined || SESSION_IDENTITY.has(name.toLowerCase())) return true;
    if (!isSymbol(tokens[i + 3], ',')) return true;
    // The value: tokens up to the next comma, none of them a parenthesis (no nested call or list).
    let at = i + 4;
    while (at < tokens.length && !isSymbol(tokens[at], ',')) {
      if (isSymbol(tokens[at], '(') || isSymbol(tokens[at], ')')) return true;
      at += 1;
    }
    if (at === i + 4) return true;
    const local = tokens[at + 1];
    if (local?.kind !== 'word' || local.value !== 'true' || !isSymbol(tokens[at + 2], ')')) return true;
  }
  return false;
}

function isSymbol(token: SqlToken | undefined, value: string): boolean {
  return token?.kind === 'symbol' && token.value === value;
}

/** Advisory locks held by the session, not the transaction. */
const SESSION_LOCKS = new Set([
  'pg_advisory_lock',
  'pg_advisory_lock_shared',
  'pg_try_advisory_lock',
  'pg_try_advisory_lock_shared',
]);

/** The words follow one another somewhere in the statement (unquoted words only). */
function followedBy(statement: SqlStatement, ...words: readonly string[]): boolean {
  const tokens = statement.tokens;
  return tokens.some((_, i) => words.every((w, j) => tokens[i + j]?.kind === 'word' && tokens[i + j]!.value === w));
}

/**
 * Why a DO block's body (its string token: a dollar quote or a quoted string) would change the
 * session: a set_config() or a SET / RESET of where or as whom statements run, read as tokens;
 * anything a statement of its own is refused for (a temporary table, LISTEN, PREPARE, DECLARE …
 * WITH HOLD, DISCARD) where PL/pgSQL starts a statement, and EXECUTE, whose SQL is text made as
 * the body runs and cannot be read here: each when `options` asks (EscapeOptions).
 */
function bodyEscape(quoted: string, options: EscapeOptions): string | undefined {
  const dollar = /^(\$[^$]*\$)([\s\S]*)\1$/.exec(quoted);
  const text = dollar ? dollar[2]! : quoted.replace(/^[eE]?'|'$/g, '').replace(/''/g, "'");
  for (const inner of splitSql(text).statements) {
    const call = callEscape(inner);
    if (call !== undefined) return call;
    for (const [i, token] of inner.tokens.entries()) {
      if (token.kind !== 'word') continue;
      const before = i === 0 ? undefined : inner.tokens[i - 1];
      const previous = before?.kind === 'word' ? before.value : undefined;
      // Where PL/pgSQL starts a statement: first in the body's statement, or after BEGIN, THEN,
      // ELSE or LOOP (not UPDATE's SET, a column named listen, `p.discard`).
      const starts = i === 0 || (previous !== undefined && PLPGSQL_STATEMENT_AFTER.has(previous));
      if (starts && (token.value === 'set' || token.value === 'reset')) {
        const escape = bodySetEscape(inner.tokens, i);
        if (escape !== undefined) return escape;
        continue;
      }
      if (token.value === 'execute') {
        // The EXECUTE statement, and RETURN QUERY EXECUTE, FOR … IN EXECUTE, OPEN … FOR EXECUTE
        // (not CREATE TRIGGER … EXECUTE FUNCTION, nor GRANT EXECUTE).
        if (options.doExecute && (starts || (previous !== undefined && EXECUTE_AFTER.has(previous))))
          return EXECUTE_ESCAPE;
        continue;
      }
      if (!options.doStatements || !starts || !BODY_STATEMENT_STARTS.has(token.value)) continue;
      const rest = inner.tokens.slice(i);
      const escape = transactionEscape({ ...inner, tokens: rest, keywords: leadingWords(rest) }, options);
      if (escape !== undefined) return escape;
    }
  }
  return undefined;
}

/** A SET or RESET statement of a DO body, from tokens[at] on: why it changes the session, if it does. */
function bodySetEscape(tokens: readonly SqlToken[], at: number): string | undefined {
  const word = (i: number): string | undefined => (tokens[i]?.kind === 'word' ? tokens[i]!.value : undefined);
  if (word(at) === 'reset') return RESET_ESCAPE;
  const scope = word(at + 1);
  const named = tokens[at + (scope === 'local' || scope === 'session' ? 2 : 1)];
  const name = named?.kind === 'word' || named?.kind === 'identifier' ? named.value : undefined;
  if (name !== undefined && SESSION_IDENTITY.has(name)) return `SET ${name} changes where or as whom statements run`;
  if (scope !== 'local') return 'SET outlives the transaction (use SET LOCAL)';
  return undefined;
}

/** Words that start, inside a DO body, a statement transactionEscape judges as it judges one of its own. */
const BODY_STATEMENT_STARTS = new Set(['create', 'listen', 'prepare', 'declare', 'discard', 'explain']);
/** Words after which PL/pgSQL starts a statement (besides the first of each). */
const PLPGSQL_STATEMENT_AFTER = new Set(['begin', 'then', 'else', 'loop']);
/** Words after which EXECUTE is PL/pgSQL's dynamic SQL: RETURN QUERY EXECUTE, FOR … IN EXECUTE, OPEN … FOR EXECUTE. */
const EXECUTE_AFTER = new Set(['query', 'in', 'for']);

const EXECUTE_ESCAPE =
  'EXECUTE runs SQL text made as the block runs, which cannot be checked (it could leave a temporary table, a setting, a role or a lock on the connection); write the statements in the body, or call a function a migration created';

/** Settings that decide which schema unqualified names resolve to, and as whom statements run. */
const SESSION_IDENTITY = new Set(['search_path', 'schema', 'role', 'session', 'session_authorization']);

/** The statement calls a function (by an unquoted or quoted name, schema-qualified or not) whose name matches. */
export function callsAny(statement: SqlStatement, match: (name: string) => boolean): string | undefined {
  const tokens = statement.tokens;
  for (const [i, token] of tokens.entries()) {
    if ((token.kind !== 'word' && token.kind !== 'identifier') || !match(token.value)) continue;
    let next = i + 1;
    if (tokens[next]?.kind === 'word' && tokens[next]!.value === 'uescape') next += 2;
    if (isSymbol(tokens[next], '(')) return token.value;
  }
  return undefined;
}

function mentions(statement: SqlStatement, word: string): boolean {
  return statement.tokens.some((t) => (t.kind === 'word' || t.kind === 'identifier') && t.value === word);
}
