import { ident, list, lockWait, sql, type Sql } from '../../pg/sql-template.js';
import { qualified } from './names.js';

/**
 * Bounded lock waits: the lock_timeout a move's transactions set, the locks of a fence, and who
 * holds the locks it waits for.
 */

/** SET LOCAL lock_timeout, in whole ms (at least 1: 0 would mean no limit). */
export function lockTimeoutSql(ms: number): Sql {
  return sql`SET LOCAL lock_timeout = ${lockWait(ms)};`;
}

/**
 * Half the server's deadlock_timeout, in ms (float8): the longest a lock of the move may wait on a
 * lock an application's transaction (or the move's own copy) could be waiting on in turn, so that
 * the move's wait runs out before either side's deadlock check cancels the other's statement.
 */
export const HALF_DEADLOCK_TIMEOUT_MS = sql`(extract(epoch FROM current_setting('deadlock_timeout')::interval) * 500)::float8`;

/** A transaction's lock waits bounded by 50 ms, or half the deadlock timeout if that is shorter (see subscribeEarly). */
export const EARLY_SUBSCRIPTION_LOCK_WAIT_SQL = sql`SELECT set_config('lock_timeout', greatest(1, least(50, ${HALF_DEADLOCK_TIMEOUT_MS}::int)) || 'ms', true);`;

/**
 * The first statements of a fence transaction (and of its preparation): every table locked in SHARE
 * ROW EXCLUSIVE mode by one LOCK whose wait is bounded in all by `lockWaitMs` (see fenceSql); none
 * when there is no table.
 */
export function lockTablesSql(tables: readonly Sql[], lockWaitMs: number, { firstAlone = false } = {}): Sql[] {
  if (tables.length === 0) return [];
  const bounded = (ms: number, locked: readonly Sql[]): Sql[] => [
    lockTimeoutSql(ms),
    sql`SET LOCAL statement_timeout = ${lockWait(ms)};`,
    sql`LOCK TABLE ${list(locked)} IN SHARE ROW EXCLUSIVE MODE;`,
  ];
  // firstAlone: the first table waits lockWaitMs, the others a quarter of it (50 ms at most). Once
  // the first is held, a writer holding another table and waiting for the first (its own order the
  // reverse of this one) cannot finish: waiting for it only holds up the application, so the
  // attempt gives up early and the next one comes sooner. In all it waits 1.25 × lockWaitMs at
  // most, still below deadlock_timeout (lockWaitMs is at most half of it).
  const locks =
    firstAlone && tables.length > 1
      ? [
          ...bounded(lockWaitMs, tables.slice(0, 1)),
          ...bounded(Math.max(1, Math.min(FIRST_ALONE_REST_MAX_MS, lockWaitMs / 4)), tables.slice(1)),
        ]
      : bounded(lockWaitMs, tables);
  return [...locks, sql`SET LOCAL statement_timeout TO DEFAULT;`];
}

/** The longest the tables after the first may wait in a lockTablesSql with firstAlone. */
const FIRST_ALONE_REST_MAX_MS = 50;

/**
 * What bounds the fence's locks on the source: half its deadlock_timeout in ms, and the lock slots
 * one transaction can count on (the shared lock table holds max_locks_per_transaction per connection).
 */
export const LOCK_LIMITS_SQL = sql`SELECT ${HALF_DEADLOCK_TIMEOUT_MS} AS half_deadlock_ms, current_setting('max_locks_per_transaction')::int AS max_locks`;

/** Who holds locks on the relations of schemas $1: the first three sessions, each named by a table or sequence it holds when it holds one (not one of their indexes). */
export const LOCK_HOLDERS_SQL = sql`SELECT DISTINCT ON (a.pid) a.pid, a.application_name, extract(epoch FROM now() - a.xact_start)::int AS age, c.relname, left(a.query, 80) AS query
       FROM pg_locks l JOIN pg_class c ON c.oid = l.relation JOIN pg_stat_activity a ON a.pid = l.pid
      WHERE c.relnamespace IN (SELECT to_regnamespace(s) FROM unnest($1::text[]) AS s) AND l.granted AND l.pid <> pg_backend_pid()
      ORDER BY a.pid, c.relkind NOT IN ('r', 'p', 'S', 'v', 'm', 'f'), c.relname LIMIT 3`;

/** The transactions holding a transaction id on the server (any database) but backend $1, oldest first. */
export const XID_HOLDERS_SQL = sql`SELECT pid, datname, application_name, extract(epoch FROM now() - xact_start)::int AS age, left(query, 80) AS query
       FROM pg_stat_activity
      WHERE (backend_xid IS NOT NULL OR backend_xmin IS NOT NULL) AND pid <> pg_backend_pid() AND pid <> $1 AND backend_type = 'client backend'
      ORDER BY xact_start LIMIT 3`;

/** A trigger dropped only if its table is free now (lock_timeout 1 ms): no statement queues behind the drop. */
export function dropTriggerIfFreeSql(schema: string, table: string, trigger: string): Sql {
  return sql`BEGIN;\n${lockTimeoutSql(1)}\nDROP TRIGGER IF EXISTS ${ident(trigger)} ON ${qualified(schema, table)};\nCOMMIT;`;
}

/** A trigger disabled only if no writer holds its table now (lock_timeout 1 ms; readers do not block it). */
export function disableTriggerIfFreeSql(schema: string, table: string, trigger: string): Sql {
  return sql`BEGIN;\n${lockTimeoutSql(1)}\nALTER TABLE ${qualified(schema, table)} DISABLE TRIGGER ${ident(trigger)};\nCOMMIT;`;
}
