import { readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { quoteIdent, quoteLiteral } from './quote.js';
import type { Sql } from './sql-template.js';

/**
 * Fills {{name}} placeholders in the reviewable .sql files under sql/. Only three kinds of value
 * exist: identifiers (always quoted), string literals (always quoted) and integers (bigint or safe
 * integers, printed in decimal). Anything else cannot reach the SQL text.
 */
export type SqlParam = { ident: string } | { literal: string } | { int: bigint | number };

const SQL_DIR = join(dirname(fileURLToPath(import.meta.url)), '..', '..', 'sql');
const cache = new Map<string, string>();

export function loadSqlTemplate(name: string): string {
  let text = cache.get(name);
  if (text === undefined) {
    text = readFileSync(join(SQL_DIR, name), 'utf8');
    cache.set(name, text);
  }
  return text;
}

/** One file of sql/ filled in (renderSql), without the blank lines around it, as SQL text for the `sql` tag. */
export function renderSqlFile(name: string, params: Record<string, SqlParam>): Sql {
  // The file is ours and every value is quoted or checked by renderSql.
  return renderSql(loadSqlTemplate(name), params).trim() as Sql;
}

export function renderSql(template: string, params: Record<string, SqlParam>): string {
  const { texts, keys } = parsed(template);
  let out = texts[0]!;
  for (const [i, key] of keys.entries()) {
    const param = params[key];
    if (param === undefined) throw new Error(`SQL template placeholder {{${key}}} has no value`);
    out += renderParam(key, param) + texts[i + 1]!;
  }
  for (const key of Object.keys(params)) {
    if (!keys.includes(key)) throw new Error(`SQL template has no placeholder {{${key}}}`);
  }
  return out;
}

/**
 * A template split once at its placeholders (a shard's next_id is rendered once per shard, thousands
 * in one command): the texts around them, and the placeholders' names in order.
 */
function parsed(template: string): { readonly texts: readonly string[]; readonly keys: readonly string[] } {
  let split = splitCache.get(template);
  if (!split) {
    const parts = template.split(/\{\{(\w+)\}\}/);
    split = { texts: parts.filter((_, i) => i % 2 === 0), keys: parts.filter((_, i) => i % 2 === 1) };
    splitCache.set(template, split);
  }
  return split;
}

const splitCache = new Map<string, { readonly texts: readonly string[]; readonly keys: readonly string[] }>();

function renderParam(key: string, param: SqlParam): string {
  if ('ident' in param) return quoteIdent(param.ident);
  if ('literal' in param) return quoteLiteral(param.literal);
  const value = param.int;
  if (typeof value === 'number' && !Number.isSafeInteger(value)) {
    throw new Error(`SQL template value {{${key}}} = ${value} is not a safe integer`);
  }
  return value.toString();
}
