import type pg from 'pg';
import { optionKeys, refuseUnknownOptions } from '../config/validate.js';
import { UsageError } from '../errors.js';
import { callsAny, splitSql, splitSqlBothWays, transactionEscape, type SqlStatement } from '../pg/statements.js';
import { ShardFanOutError, type FanOutFailure, type ShardResult } from '../router/errors.js';
import type { ShardRouter } from '../router/router.js';
import { EXEC_SCRIPT } from '../router/script.js';

export interface ExecOptions {
  /** Default: every shard of the map. */
  shards?: readonly number[];
  /** Shards running at once over all hosts (default: the router's poolSize × hosts). */
  concurrency?: number;
  /** Allow writes; without it each shard's transaction is READ ONLY. */
  write?: boolean;
  /**
   * Read-only runs: up to this many shards of a host per round trip and READ ONLY transaction
   * (see ShardRouter.queryEachShard; a failing chunk runs again shard by shard). Default 256;
   * 1 runs every shard in its own transaction. Writes always run one shard per transaction.
   */
  shardsPerQuery?: number;
  onShardDone?: (event: { shard: number; host: string; ok: boolean; done: number; total: number }) => void;
}

/** A value as exec prints it: JSON-safe, bigints and numerics as decimal strings. */
export type ExecValue = string | number | boolean | null | object;

export interface ExecResult {
  /** Column names of the statement's result (the first shard that answered); `shard` is not among them. */
  readonly columns: string[];
  /** Every row of every shard that succeeded, in shard order. */
  readonly rows: { shard: number; host: string; values: ExecValue[] }[];
  readonly failures: readonly FanOutFailure[];
  readonly shards: number;
}

const DEFAULT_SHARDS_PER_QUERY = 256;

/**
 * Runs one SQL text in every listed shard's schema through the router's fan-out (read-only unless
 * `write`), and collects the last statement's rows. Values keep the type a script can rely on:
 * smallint/integer/real/double as numbers, boolean, json/jsonb parsed, and everything else —
 * bigint and numeric included — as the text PostgreSQL prints, never a lossy JavaScript number.
 */
export async function execSql(router: ShardRouter, sql: string, options: ExecOptions = {}): Promise<ExecResult> {
  refuseUnknownOptions(
    'exec options',
    options,
    optionKeys<ExecOptions>({ shards: true, concurrency: true, write: true, shardsPerQuery: true, onShardDone: true }),
  );
  const refusal = execRefusal(sql, options.write ?? false);
  if (refusal) throw new UsageError(refusal, { input: 'sql' });
  const fanOut = {
    ...(options.shards ? { shards: options.shards } : {}),
    ...(options.concurrency ? { concurrency: options.concurrency } : {}),
    ...(options.onShardDone ? { onShardDone: options.onShardDone } : {}),
    readOnly: !options.write,
    shardsPerQuery: options.write ? 1 : (options.shardsPerQuery ?? DEFAULT_SHARDS_PER_QUERY),
    query: { rowMode: 'array', types: EXEC_TYPES },
    [EXEC_SCRIPT]: true as const,
  };
  let results: readonly ShardResult<pg.QueryResult>[];
  let failures: readonly FanOutFailure[] = [];
  try {
    results = await router.queryEachShard(sql, fanOut);
  } catch (error) {
    if (!(error instanceof ShardFanOutError)) throw error;
    results = error.results as ShardResult<pg.QueryResult>[];
    failures = error.failures;
  }
  const columns = results.find((r) => (r.value.fields ?? []).length > 0)?.value.fields.map((f) => f.name) ?? [];
  return {
    columns,
    rows: results.flatMap((r) =>
      (r.value.rows as unknown as ExecValue[][]).map((values) => ({ shard: r.shard, host: r.host, values })),
    ),
    failures,
    shards: results.length + failures.length,
  };
}

const NUMBER_TYPES = new Set([21, 23, 26, 700, 701]); // int2, int4, oid, float4, float8
const JSON_TYPES = new Set([114, 3802]);
const BOOL_TYPE = 16;

/**
 * A json or jsonb value as JavaScript, when that keeps every number as PostgreSQL wrote it; else the
 * text itself. JavaScript numbers hold 15 to 17 significant digits, so a value with a run of 16
 * digits or more (an id, a numeric of many digits; a long digit string too, to be safe) stays text.
 */
function parseJsonExactly(text: string): unknown {
  return /\d{16,}/.test(text) ? text : (JSON.parse(text) as unknown);
}

const EXEC_TYPES = {
  getTypeParser: (oid: number, format?: string) => {
    if (format === 'binary') return (value: unknown) => value;
    if (NUMBER_TYPES.has(oid)) return (text: string) => (Number.isFinite(Number(text)) ? Number(text) : text);
    if (JSON_TYPES.has(oid)) return parseJsonExactly;
    if (oid === BOOL_TYPE) return (text: string) => text === 't';
    return (text: string) => text;
  },
} as unknown as pg.CustomTypesConfig;

/** What a read-only exec text may start with: statements that only read (PostgreSQL's READ ONLY refuses the rest of their writes). */
const READING_STATEMENTS = new Set(['select', 'with', 'values', 'table', 'show', 'explain']);

/**
 * Functions a read-only exec refuses by name, because READ ONLY does not stop them: they act
 * outside the transaction (locks other sessions wait for, other connections, files on the
 * server, notifications, other backends, replication, server state) or change a setting beyond
 * the shard. A function of the database that calls one of them is not seen: a read-only role is
 * the guard for that (README, "exec").
 */
const REFUSED_FUNCTIONS: readonly (string | RegExp)[] = [
  /^pg_(try_)?advisory_/,
  /^dblink/,
  /^lo_/,
  'lowrite',
  'loread',
  'pg_notify',
  /^pg_file_/,
  'pg_terminate_backend',
  'pg_cancel_backend',
  'pg_reload_conf',
  'pg_rotate_logfile',
  'pg_switch_wal',
  'pg_promote',
  /^pg_wal_replay_/,
  'pg_create_restore_point',
  /^pg_(start|stop)_backup$/,
  /^pg_backup_(start|stop)$/,
  /^pg_(create|drop|copy)_\w*replication_slot$/,
  /^pg_logical_slot_(get|peek)/,
  'pg_replication_slot_advance',
  /^pg_replication_origin_/,
  'pg_logical_emit_message',
  /^pg_stat_reset/,
  /^pg_background/,
];

/**
 * Why exec cannot run a text safely, or undefined. Read-only (the default): every statement must
 * start with SELECT, WITH, VALUES, TABLE, SHOW or EXPLAIN (run inside BEGIN READ ONLY, PostgreSQL
 * itself refuses their writes, data-modifying CTEs, SELECT INTO, FOR UPDATE and nextval), and
 * call none of REFUSED_FUNCTIONS. Either way no statement may end the shard's transaction or
 * change the session beyond it (search_path, role, settings), since that would let a shard's SQL
 * run outside its schema or reach the shards that follow on the same connection.
 */
export function execRefusal(sql: string, write: boolean): string | undefined {
  const standard = splitSql(sql).statements.length;
  const where = (statement: SqlStatement, index: number): string => {
    const which =
      index >= standard
        ? 'a statement (as read with standard_conforming_strings off)'
        : standard === 1
          ? 'the statement'
          : `statement ${index + 1}`;
    return `${which}${statement.line > 1 ? ` (line ${statement.line})` : ''} ${JSON.stringify(abbreviate(statement.code))}`;
  };
  const statements = splitSqlBothWays(sql);
  for (const [index, statement] of statements.entries()) {
    const escape = transactionEscape(statement);
    if (escape)
      return `${where(statement, index)}: ${escape}; exec runs each shard's SQL in a transaction of its own with search_path set to that shard's schema`;
    if (write) continue;
    const first = statement.tokens.find((t) => !(t.kind === 'symbol' && t.value === '('));
    const keyword = first?.kind === 'word' ? first.value : undefined;
    if (keyword === undefined || !READING_STATEMENTS.has(keyword)) {
      return `${where(statement, index)}: ${keyword ? keyword.toUpperCase() : 'this statement'} is not a read; read-only exec runs only SELECT, WITH, VALUES, TABLE, SHOW and EXPLAIN (writes need --write)`;
    }
    const refused = callsAny(statement, (name) =>
      REFUSED_FUNCTIONS.some((f) => (typeof f === 'string' ? f === name : f.test(name))),
    );
    if (refused)
      return `${where(statement, index)}: ${refused} acts outside the transaction, which read-only exec does not allow`;
  }
  return undefined;
}

function abbreviate(text: string): string {
  const flat = text.replace(/\s+/g, ' ');
  return flat.length > 60 ? `${flat.slice(0, 57)}...` : flat;
}
