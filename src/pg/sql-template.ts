import { quoteIdent, quoteLiteral } from './quote.js';

/**
 * One way to write a statement in TypeScript: the `sql` tag, where every value says what it is.
 *
 *   sql`DROP TRIGGER IF EXISTS ${ident(trigger)} ON ${ident(schema, table)}`
 *   sql`UPDATE ${CONTROL_IDENT}.shards SET state = 'fenced' WHERE shard IN (${list(shards.map((s) => int(s, 'a shard number')))})`
 *
 * `ident` quotes a name (quoteIdent), `lit` a string literal (quoteLiteral), `int` prints an integer
 * it has checked, `lockWait` a lock wait in ms as the settings take it. Text made by `sql` (type
 * Sql) goes into another `sql` as it is; anything else (a plain string, a number, undefined) is
 * refused by the type checker, and by the tag itself at run time for what is not a string. The
 * reviewable .sql files under sql/ are filled by template.ts, with the same three kinds of value.
 */

declare const SQL: unique symbol;

/** SQL text made by `sql` (or one of the values below): a string, which nothing but this module makes. */
export type Sql = string & { readonly [SQL]: true };

/** A value of a `sql` template: text made by this module. */
export type SqlValue = Sql;

function made(text: string): Sql {
  return text as Sql;
}

export function sql(strings: TemplateStringsArray, ...values: readonly SqlValue[]): Sql {
  let out = strings[0]!;
  for (const [i, value] of values.entries()) {
    if (typeof value !== 'string')
      throw new Error(`sql: value ${i + 1} is a ${typeof value}, not SQL text (use ident, lit or int)`);
    out += value + strings[i + 1]!;
  }
  return made(out);
}

/** A name, quoted: `ident('insta5', 'users')` is "insta5"."users". */
export function ident(...parts: readonly string[]): Sql {
  if (parts.length === 0) throw new Error('ident: no name');
  return made(parts.map(quoteIdent).join('.'));
}

/** A string literal, quoted. */
export function lit(value: string): Sql {
  return made(quoteLiteral(value));
}

/**
 * An integer, in decimal, checked once here: a safe integer (or a bigint) of at least `min`
 * (default 0). `what` names it in the error: `not a shard number: -1`.
 */
export function int(value: number | bigint, what = 'an integer', min: number | bigint = 0): Sql {
  const ok = typeof value === 'bigint' ? value >= BigInt(min) : Number.isSafeInteger(value) && value >= min;
  if (!ok) throw new Error(`not ${what}: ${String(value)}`);
  return made(value.toString());
}

/**
 * A lock wait (or statement timeout) as the settings take it, `'250ms'`: whole ms, at least 1 (0
 * would mean no limit).
 */
export function lockWait(ms: number): Sql {
  return made(`'${Math.max(1, Math.round(ms))}ms'`);
}

/**
 * SQL text the server itself rendered from its catalog (pg_get_indexdef, pg_get_constraintdef,
 * pg_get_function_identity_arguments), taken as it is: never text from a user or a file.
 */
export function fromCatalog(text: string): Sql {
  return made(text);
}

/** Fragments joined by `separator` (', ' by default). */
export function list(items: readonly SqlValue[], separator: string = ', '): Sql {
  return made(items.join(separator));
}

/** Statements one per line, as a move sends a transaction in one string. */
export function lines(items: readonly SqlValue[]): Sql {
  return list(items, '\n');
}

/** Nothing: the other branch of a conditional part. */
export const EMPTY: Sql = made('');
