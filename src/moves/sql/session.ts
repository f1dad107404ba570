import { int, lit, sql, type Sql } from '../../pg/sql-template.js';

/**
 * Session settings and backends of a move's connections: statement timeouts, snapshots, pids.
 */

/** A statement timeout for the session, in ms (see underFence). */
export function statementTimeoutSql(ms: number): Sql {
  return sql`SET statement_timeout = ${int(Math.max(MIN_STATEMENT_TIMEOUT_MS, Math.ceil(ms)), 'a timeout in ms')}`;
}

/**
 * The shortest statement timeout the cut-over sets (statementTimeoutSql): a timeout of a few ms
 * can cancel the statement that resets it (RESET runs under the timeout it replaces), leaving the
 * session unable to run anything, the unfence included. Well within the fence limit's slack (see
 * TIMEOUT_SLACK_MS in fence-limit.ts).
 */
export const MIN_STATEMENT_TIMEOUT_MS = 50;

export const RESET_STATEMENT_TIMEOUT_SQL = sql`RESET statement_timeout`;

export const RESET_SYNCHRONOUS_COMMIT_SQL = sql`RESET synchronous_commit`;

/** This session's backend pid. */
export const BACKEND_PID_SQL = sql`SELECT pg_backend_pid() AS pid`;

/** Ends backend $1 (the slot's creation cancelled; a walsender that holds a slot). */
export const TERMINATE_BACKEND_SQL = sql`SELECT pg_terminate_backend($1)`;

export const CURRENT_USER_SQL = sql`SELECT current_user AS current`;

/** The snapshot of this transaction, for others to import. */
export const EXPORT_SNAPSHOT_SQL = sql`SELECT pg_export_snapshot() AS snapshot`;

/** The first statement of a REPEATABLE READ transaction that reads as of an exported snapshot. */
export function setTransactionSnapshotSql(snapshot: string): Sql {
  return sql`SET TRANSACTION SNAPSHOT ${lit(snapshot)}`;
}
