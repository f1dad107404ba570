import pg from 'pg';
import { optionKeys } from '../config/validate.js';
import { UsageError } from '../errors.js';
import { encodeId, parseIdString, type IdLayout } from '../id/layout.js';
import { shardForKey } from '../id/routing.js';
import { quoteIdent } from '../pg/quote.js';
import { splitSql } from '../pg/statements.js';
import { checkCallOptions } from './options.js';
import { REPLICA_READ_FLAGS, replicaRead, type WriteLsn } from './replicas.js';
import { oneStatement, queryEachShardWithParams } from './shard-query.js';
import type { RouterInternals } from './types.js';

/** newest: ids descending (a feed); oldest: ascending. */
export type PageOrder = 'newest' | 'oldest';

export interface PageOptions {
  /** Rows in the page, 1-10000. */
  limit: number;
  /** Default 'newest'. A cursor continues in the order it was made in. */
  order?: PageOrder;
  /** The previous page's `cursor`; absent or null for the first page. */
  cursor?: string | null;
  /** Bind parameters $1, $2, … of the sql (the router's own come after them). */
  params?: readonly unknown[];
  /** The shards to read; default every shard. */
  shards?: readonly number[];
  /** Read the shards of these keys (key mod shards), instead of `shards`. */
  keys?: readonly bigint[];
  /**
   * The id column the rows are merged by; default 'id'. One id per row: a page or the row after it
   * that repeats an id (a join that gives a photo's id to each of its comments) is refused.
   */
  idColumn?: string;
  /**
   * Oldest first only: return only rows whose id's time is at least this many ms before now (the
   * application's clock), so a reader that tails lags by it and does not skip a row committed within
   * it of drawing its id. A whole number of ms, 0 or more.
   */
  minAgeMs?: number;
  /** Shards of one host per round trip; default 64. */
  shardsPerQuery?: number;
  /** Shards (or round trips of shards) running at once on one host; default and at most poolSize. */
  perHost?: number;
  /** ... over all hosts; default poolSize × hosts. */
  concurrency?: number;
  /** Read from standbys of the shards' hosts (src/router/replicas.ts); with maxLagMs, afterLsn, replicaWaitMs. */
  replica?: boolean;
  maxLagMs?: number;
  afterLsn?: WriteLsn | undefined;
  replicaWaitMs?: number;
}

export interface Page<R> {
  /** At most `limit` rows, merged by id across the shards; every int8 column a bigint. */
  readonly rows: R[];
  /** Pass as `cursor` for the next page; null when this page was the last. */
  readonly cursor: string | null;
  /**
   * Where this page ended, even when it was the last (the cursor given, for an empty page; null
   * when no row has been read yet): a reader tailing oldest first reads on from it later.
   */
  readonly resume: string | null;
}

export const MAX_PAGE_LIMIT = 10_000;

const INT8_OID = 20;
const INT8_ARRAY_OID = 1016;

/** An int8[] value pg parsed (elements as decimal strings, NULL as null, nested for more dimensions) with bigint elements. */
function bigintElements(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(bigintElements);
  return typeof value === 'string' ? BigInt(value) : value;
}

/** int8 columns, and the elements of int8[] columns, as bigint: ids never pass through a JS number. */
export const BIGINT_TYPES = {
  getTypeParser(oid: number, format?: 'text' | 'binary'): (value: string) => unknown {
    if (oid === INT8_OID && format !== 'binary') return (value: string) => BigInt(value);
    if (oid === INT8_ARRAY_OID && format !== 'binary') {
      const parse = pg.types.getTypeParser(oid as number, 'text') as (value: string) => unknown;
      return (value: string) => bigintElements(parse(value));
    }
    return pg.types.getTypeParser(oid, format ?? 'text') as (value: string) => unknown;
  },
} as pg.CustomTypesConfig;

/** Every key of PageOptions. */
const PAGE_OPTION_KEYS = optionKeys<PageOptions>({
  limit: true,
  order: true,
  cursor: true,
  params: true,
  shards: true,
  keys: true,
  idColumn: true,
  minAgeMs: true,
  shardsPerQuery: true,
  perHost: true,
  concurrency: true,
  ...REPLICA_READ_FLAGS,
});

/**
 * One page of rows merged by id across shards (router.queryPage): each shard runs
 *
 *   SELECT * FROM (<sql>) AS page WHERE id < $cursor ORDER BY id DESC LIMIT $limit + 1
 *
 * (`>` and ASC for oldest first; no WHERE on the first page), so it is asked only for rows past the
 * cursor and at most `limit` + 1 of them, and an index on id serves it. Shards of one host share
 * round trips; a shard being moved is read from its holder (the router follows it). The page is the
 * `limit` first of the merged rows; its cursor holds the last row's id as a decimal string.
 *
 * The cursor is an id, so ids must be one per row: the next page starts past the last row's id, and
 * a row after the page that shares it would never be returned. The extra row per shard is what lets
 * that be seen: a page that repeats an id, or whose last id the row after it repeats, is refused
 * (a repeat further on is refused by the page that reaches it).
 *
 * Rows written meanwhile: a row committed after a page was read is returned later only if its id
 * falls past that page's cursor. Newest first, that is every row whose id is below it, and a newer
 * row is for a read from the top. Oldest first, a row whose id was drawn before the cursor passed
 * it but committed after (a transaction still open, a host whose clock lags) is behind the cursor
 * and never returned: minAgeMs keeps the cursor that far behind now. It is checked against the
 * application's clock, so it must also cover how far a host's clock lags that clock.
 */
export async function queryPage<R extends pg.QueryResultRow>(
  router: RouterInternals,
  sql: string,
  options: PageOptions,
): Promise<Page<R>> {
  checkCallOptions('queryPage options', options, PAGE_OPTION_KEYS);
  const limit = options.limit;
  if (!Number.isSafeInteger(limit) || limit < 1 || limit > MAX_PAGE_LIMIT)
    throw new UsageError(`must be a whole number from 1 to ${MAX_PAGE_LIMIT}`, { input: 'limit', value: limit });
  const order = options.order ?? 'newest';
  if (order !== 'newest' && order !== 'oldest')
    throw new UsageError("must be 'newest' or 'oldest'", { input: 'order', value: order });
  const idColumn = options.idColumn ?? 'id';
  if (typeof idColumn !== 'string' || idColumn === '')
    throw new UsageError('must be a column name', { input: 'idColumn', value: idColumn });
  const after = options.cursor == null ? undefined : decodeCursor(options.cursor, order);
  const minAgeMs = options.minAgeMs;
  if (minAgeMs !== undefined) {
    if (!Number.isSafeInteger(minAgeMs) || minAgeMs < 0)
      throw new UsageError('must be a whole number of milliseconds, 0 or more', { input: 'minAgeMs', value: minAgeMs });
    if (order !== 'oldest')
      throw new UsageError(
        "applies to order 'oldest' only (newest first, a row committed late is returned by a read from the top)",
        { input: 'minAgeMs', value: minAgeMs },
      );
  }
  const params = options.params ?? [];
  if (!Array.isArray(params as unknown))
    throw new UsageError('must be an array of bind parameters', { input: 'params' });
  if (options.shards && options.keys)
    throw new UsageError('give shards or keys, not both', { input: 'keys', data: { shards: options.shards.length } });
  const shards = options.keys ? keyShards(options.keys, router.config().shards) : options.shards;
  if (shards && shards.length === 0) return { rows: [], cursor: null, resume: options.cursor ?? null };

  const below =
    minAgeMs === undefined ? undefined : settledIdBound(router.config().idLayout, BigInt(Date.now() - minAgeMs));
  const statement = oneStatement(sql);
  refuseOwnOrder(statement);
  const text = pageSql(statement, {
    idColumn,
    order,
    params: params.length,
    cursor: after !== undefined,
    below: below !== undefined,
  });
  // One row more than the page from each shard: the merged row after the page, whose id must differ.
  const values = [
    ...params,
    ...(after !== undefined ? [after.toString()] : []),
    ...(below !== undefined ? [below.toString()] : []),
    limit + 1,
  ];
  const replica = replicaRead({ ...options, readOnly: true });
  const results = await queryEachShardWithParams<R>(
    router,
    text,
    values,
    {
      readOnly: true,
      shardsPerQuery: options.shardsPerQuery ?? 64,
      query: { types: BIGINT_TYPES },
      ...(shards ? { shards } : {}),
      ...(options.perHost !== undefined ? { perHost: options.perHost } : {}),
      ...(options.concurrency !== undefined ? { concurrency: options.concurrency } : {}),
    },
    replica,
  );

  const keyed: { id: bigint; row: R }[] = [];
  for (const result of results) {
    requireBigintColumn(result.value.fields, idColumn);
    for (const row of result.value.rows) keyed.push({ id: rowId(row, idColumn), row });
  }
  keyed.sort(order === 'newest' ? (a, b) => compare(b.id, a.id) : (a, b) => compare(a.id, b.id));
  const repeated = repeatedId(keyed.slice(0, limit + 1).map((k) => k.id));
  if (repeated !== undefined)
    throw new UsageError(
      `repeats id ${repeated} in two rows: the cursor is the last row's id, so a page would end between ` +
        `them and skip the rest; page by a column with one id per row (a join's own id), or page the ` +
        `rows the id belongs to and join per page`,
      { input: 'idColumn', value: idColumn, data: { id: repeated.toString() } },
    );
  const page = keyed.slice(0, limit);
  const last = page.at(-1);
  return {
    rows: page.map((k) => k.row),
    cursor: page.length === limit && last ? encodeCursor(order, last.id) : null,
    resume: last ? encodeCursor(order, last.id) : (options.cursor ?? null),
  };
}

/**
 * A statement that orders or limits its own rows (ORDER BY, LIMIT, OFFSET or FETCH outside any
 * parentheses) would give each shard's page from its own order, not the newest or oldest by id:
 * refused (a CTE's or a subquery's, inside parentheses, is the statement's business).
 */
function refuseOwnOrder(statement: string): void {
  const tokens = splitSql(statement).statements[0]?.tokens ?? [];
  let depth = 0;
  for (const [i, token] of tokens.entries()) {
    if (token.kind === 'symbol' && token.value === '(') depth++;
    else if (token.kind === 'symbol' && token.value === ')') depth--;
    if (depth !== 0 || token.kind !== 'word') continue;
    const next = tokens[i + 1];
    const clause =
      token.value === 'order' && next?.kind === 'word' && next.value === 'by'
        ? 'ORDER BY'
        : ['limit', 'offset', 'fetch'].includes(token.value)
          ? token.value.toUpperCase()
          : undefined;
    if (clause !== undefined)
      throw new UsageError(
        `has its own ${clause}: queryPage orders and limits each shard's rows by idColumn itself (newest or oldest first, at most limit); leave it out`,
        { input: 'sql', value: statement.slice(0, 60) },
      );
  }
}

/** The first id that two neighbours of sorted ids share, if any. */
export function repeatedId(sortedIds: readonly bigint[]): bigint | undefined {
  for (let i = 1; i < sortedIds.length; i++) if (sortedIds[i] === sortedIds[i - 1]) return sortedIds[i];
  return undefined;
}

/**
 * The smallest id of the millisecond after `settledUnixMs`: ids below it were drawn at that
 * millisecond or before (0 when that is before the layout's epoch, so nothing is).
 */
export function settledIdBound(layout: IdLayout, settledUnixMs: bigint): bigint {
  const next = settledUnixMs + 1n;
  if (next <= layout.epochMs) return 0n;
  return encodeId({ unixMs: next, shard: 0, sequence: 0 }, layout);
}

/**
 * What each shard runs for a page: the caller's statement as a subquery (a plain one is pulled
 * up by the planner, so the id bounds and the order reach the table and its primary key), then the
 * cursor's bound (when there is a cursor), the settled bound (minAgeMs: ids below it) and the limit
 * as the next bind parameters.
 */
export function pageSql(
  statement: string,
  page: { idColumn: string; order: PageOrder; params: number; cursor: boolean; below?: boolean },
): string {
  const id = quoteIdent(page.idColumn);
  let n = page.params;
  const where = [
    ...(page.cursor ? [`${id} ${page.order === 'newest' ? '<' : '>'} $${++n}::bigint`] : []),
    ...(page.below ? [`${id} < $${++n}::bigint`] : []),
  ];
  return [
    // The newline ends a trailing `--` comment of the statement.
    `SELECT * FROM (\n${statement}\n) AS shardctl_page`,
    ...(where.length > 0 ? [`WHERE ${where.join(' AND ')}`] : []),
    `ORDER BY ${id} ${page.order === 'newest' ? 'DESC' : 'ASC'} LIMIT $${n + 1}`,
  ].join(' ');
}

function compare(a: bigint, b: bigint): number {
  return a < b ? -1 : a > b ? 1 : 0;
}

function keyShards(keys: readonly bigint[], shards: number): number[] {
  if (!Array.isArray(keys)) throw new UsageError('must be an array of bigint keys', { input: 'keys' });
  const found = new Set<number>();
  for (const key of keys) {
    if (typeof key !== 'bigint') throw new UsageError('must be bigint keys', { input: 'keys', value: String(key) });
    found.add(shardForKey(key, shards));
  }
  return [...found];
}

/** Names of types an id column is most likely given by mistake (a cast for JSON, a narrower integer). */
const TYPE_NAMES: Readonly<Record<number, string>> = {
  21: 'smallint',
  23: 'integer',
  25: 'text',
  1043: 'varchar',
  1700: 'numeric',
  2950: 'uuid',
};

/**
 * The id column must be a bigint: the shards sort it and the cursor compares it as a number, so a
 * text id (`id::text`, for JSON) would come back in text order and fail at the next page's bound.
 */
function requireBigintColumn(fields: readonly pg.FieldDef[], idColumn: string): void {
  // A column missing is the server's error already (the page's ORDER BY names it).
  const field = fields.find((f) => f.name === idColumn);
  if (field !== undefined && field.dataTypeID !== INT8_OID)
    throw new UsageError(
      `must be a bigint column (found ${TYPE_NAMES[field.dataTypeID] ?? `type oid ${field.dataTypeID}`}): pages are sorted and continued by it as a number; select the id itself (turn it into text after the page, if needed)`,
      { input: 'idColumn', value: idColumn },
    );
}

function rowId(row: pg.QueryResultRow, idColumn: string): bigint {
  const value: unknown = row[idColumn];
  const id = typeof value === 'bigint' ? value : typeof value === 'string' ? parseIdString(value) : undefined;
  if (typeof id !== 'bigint' || id < 0n)
    throw new UsageError(
      `the rows must carry a bigint ${idColumn} of 0 or more to merge by (found ${value === null ? 'null' : typeof value === 'bigint' ? value.toString() : typeof value})`,
      { input: 'idColumn', value: idColumn },
    );
  return id;
}

const CURSOR_PREFIX = 'v1';

/** An opaque cursor: the order and the last id, as a decimal string (never a JS number), base64url. */
export function encodeCursor(order: PageOrder, after: bigint): string {
  return Buffer.from(`${CURSOR_PREFIX}:${order}:${after.toString()}`, 'utf8').toString('base64url');
}

export function decodeCursor(cursor: string, order: PageOrder): bigint {
  const text = typeof cursor === 'string' ? Buffer.from(cursor, 'base64url').toString('utf8') : '';
  const match = /^v1:(newest|oldest):(\d{1,19})$/.exec(text);
  const after = match ? parseIdString(match[2]!) : undefined;
  if (!match || typeof after !== 'bigint')
    throw new UsageError('is not a cursor of queryPage', { input: 'cursor', value: cursor });
  if (match[1] !== order)
    throw new UsageError(`was made for order '${match[1]}', not '${order}'`, { input: 'cursor', value: cursor });
  return after;
}
