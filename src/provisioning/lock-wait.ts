import type pg from 'pg';
import { describePgError } from '../fleet/connect.js';

/**
 * A migration that meets a busy table (lock_timeout, SQLSTATE 55P03) is tried again after a pause
 * instead of failing the shard at once: the application's transaction holding the lock is usually
 * over within seconds. The pauses grow (1 s, 2 s, 4 s, … at most 30 s) and vary by a quarter either
 * way, so that shards that met the same lock do not all come back at the same instant. Each try waits
 * at most lock_timeout for the lock, so the application is never blocked behind the migration for
 * longer than that.
 */
export const DEFAULT_LOCK_RETRIES = 3;
const FIRST_PAUSE_MS = 1_000;
const LONGEST_PAUSE_MS = 30_000;

/** The pause before try number `retry` + 1 (retry counts from 0). */
export function lockRetryPauseMs(retry: number, random: () => number = Math.random): number {
  const base = Math.min(LONGEST_PAUSE_MS, FIRST_PAUSE_MS * 2 ** retry);
  return Math.round(base * (0.75 + random() * 0.5));
}

/** A session holding a lock on a table of the shard's schema when a migration gave up waiting. */
export interface LockHolder {
  readonly pid: number;
  readonly application: string;
  readonly user: string;
  /** Client address, or null for a local socket. */
  readonly client: string | null;
  /** How long its transaction had been open, in milliseconds; null outside a transaction. */
  readonly transactionMs: number | null;
  /** e.g. `AccessExclusiveLock on photos`. */
  readonly locks: string;
}

/**
 * Who holds locks on the tables of `schema` (other than this session), read right after a lock
 * timeout: the lock the migration waited for is not named by the error, but a shard's tables are
 * used only by its schema, so the holders of locks there are the candidates.
 */
export async function findLockHolders(client: pg.Client, schema: string): Promise<LockHolder[]> {
  const result = await client.query<{
    pid: number;
    application_name: string | null;
    usename: string | null;
    client_addr: string | null;
    transaction_ms: string | null;
    locks: string;
  }>(
    `SELECT a.pid, a.application_name, a.usename, host(a.client_addr) AS client_addr,
            round(extract(epoch FROM clock_timestamp() - a.xact_start) * 1000)::bigint::text AS transaction_ms,
            string_agg(DISTINCT l.mode || ' on ' || c.relname, ', ') AS locks
       FROM pg_catalog.pg_locks l
       JOIN pg_catalog.pg_class c ON c.oid = l.relation
       JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
       JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid
      WHERE l.locktype = 'relation' AND l.granted AND l.pid <> pg_catalog.pg_backend_pid()
        AND l.database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = pg_catalog.current_database())
        AND n.nspname = $1
      GROUP BY a.pid, a.application_name, a.usename, a.client_addr, a.xact_start
      ORDER BY a.pid
      LIMIT 5`,
    [schema],
  );
  return result.rows.map((row) => ({
    pid: row.pid,
    application: row.application_name ?? '',
    user: row.usename ?? '',
    client: row.client_addr,
    transactionMs: row.transaction_ms === null ? null : Number(row.transaction_ms),
    locks: row.locks,
  }));
}

/** `pid 4242 (application psql, user app, from 10.0.0.7, transaction open 3.1 s, AccessExclusiveLock on photos)`. */
export function describeLockHolder(holder: LockHolder): string {
  const parts = [
    `application ${holder.application || '?'}`,
    ...(holder.user ? [`user ${holder.user}`] : []),
    `from ${holder.client ?? 'local socket'}`,
    ...(holder.transactionMs === null ? [] : [`transaction open ${(holder.transactionMs / 1000).toFixed(1)} s`]),
    holder.locks,
  ];
  return `pid ${holder.pid} (${parts.join(', ')})`;
}

/** The holders as one phrase for a message, never throwing (the lookup is a courtesy). */
export async function lockHoldersPhrase(
  client: pg.Client,
  schema: string,
): Promise<{ holders: LockHolder[]; phrase: string }> {
  try {
    const holders = await findLockHolders(client, schema);
    if (holders.length === 0)
      return {
        holders,
        phrase: `no session holds a lock in schema ${schema} any more (released, or the table is outside it)`,
      };
    return { holders, phrase: `held by ${holders.map(describeLockHolder).join('; ')}` };
  } catch (error) {
    return { holders: [], phrase: `the holder could not be read (${describePgError(error)})` };
  }
}
