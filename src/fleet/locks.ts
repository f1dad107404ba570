import { randomUUID } from 'node:crypto';
import type pg from 'pg';
import type { HostConfig } from '../config/types.js';
import { HostError } from '../errors.js';
import { durationMs } from '../config/duration.js';
import { connectHost, describePgError } from './connect.js';
import { CONTROL, ensureControlLocks } from './control.js';
import { endQuietly, rollbackQuietly } from '../pg/quiet.js';
import { INSUFFICIENT_PRIVILEGE } from '../pg/sqlstate.js';
import { controlRightsError } from './rights.js';
import { sql } from '../pg/sql-template.js';

/**
 * One shardctl runner per host at a time (init, add-schema, migrate, move-shard, rebalance, gc).
 *
 * The runner lock is a table lock on the control schema's runner_lock (sql/control_locks.sql), not an
 * advisory lock: any role that can connect can take any advisory key, so a stranger could block
 * every run; locking a table in SHARE UPDATE EXCLUSIVE mode needs UPDATE, DELETE or TRUNCATE on it,
 * which only its owner has. A table lock lasts until its transaction ends, so it is held by a
 * connection of its own with a transaction open for the run's life (idle_in_transaction_session_timeout
 * off for that session); the coordinator connection goes on committing its own transactions. The lock
 * disappears with that connection, so a killed run never leaves a stale lock behind. But not at the
 * same instant: behind a TCP proxy (PgBouncer, HAProxy, a cloud load balancer, docker-proxy) the
 * server ends a killed run's session a moment later. So a busy lock is waited for, up to the
 * config's lockTimeout, before a second runner fails, naming the holder: an immediate rerun after a
 * kill works, and a live runner still stops the second one within lockTimeout.
 *
 * The runner lock alone is not enough: when a runner dies (SIGKILL, Ctrl-C, a lost coordinator
 * connection), its worker backends go on with the statement they were sent, commits included, until
 * they next talk to the client (connect.ts sets client_connection_check_interval to bound that). So
 * every worker connection records its backend (pid and start time) in the control schema's workers
 * table before it does anything, and a new runner, once it holds the runner lock, waits (up to the
 * config's lockTimeout) until none of the recorded backends is alive and busy: only then has every
 * worker of an earlier run finished, and the catalog it reads next is the one it will change. An
 * idle backend runs nothing (a dead client sends it nothing more; behind a transaction pooler the
 * backend lives on between other clients' transactions), and a run that finishes removes its own
 * records. Only the table's owner can write it, so no stranger can pose as a worker.
 */
export const RUNNER_LOCK_TABLE = `${CONTROL}.runner_lock`;
export const TRACKING_LOCK_TABLE = sql`${CONTROL}.tracking_lock`;
export const WORKERS_TABLE = `${CONTROL}.workers`;

/**
 * Serialises moves that set up change tracking on the same target at once (src/moves/tail.ts): a
 * statement of the tracking transaction, held to its end.
 */
export const TRACKING_LOCK_SQL = sql`LOCK TABLE ${TRACKING_LOCK_TABLE} IN EXCLUSIVE MODE;`;

export interface RunnerLockOptions {
  /**
   * How long to wait for the runner lock held by another session, and then for the workers of an
   * earlier run to finish, e.g. '5s' (the config's lockTimeout).
   */
  readonly workerWait?: string;
}

/** The connection holding each coordinator's runner lock. */
const lockConnections = new WeakMap<pg.Client, pg.Client>();

/** How often a runner looks again for the workers of an earlier run. */
const WORKER_POLL_MS = 50;

/** A runner lock's own connection, opened and not yet locked (see Fleet.lock). */
export interface PendingRunnerLock {
  readonly host: HostConfig;
  readonly client: pg.Client;
  readonly lock: pg.Client;
}

/**
 * A runner lock's own connection, named as the coordinator is (so that a second run's message names
 * what this run is). It neither writes nor locks anything, so the hosts' lock connections can be
 * opened at once; takeRunnerLock, or abandonRunnerLock, ends it.
 */
export async function openRunnerLock(host: HostConfig, client: pg.Client): Promise<PendingRunnerLock> {
  const application = (await client.query<{ name: string }>(`SELECT current_setting('application_name') AS name`))
    .rows[0]!.name;
  // A failure to connect is the host's, like a failed query (Fleet.lock may lose the host), not a refusal.
  const lock = await connectHost(host, { applicationName: application }).catch((error: unknown) => {
    throw new Error(
      `cannot open the runner lock's connection: ${describePgError((error as { cause?: unknown }).cause ?? error)}`,
    );
  });
  return { host, client, lock };
}

/**
 * Takes the runner lock on its connection (closed when it fails) for the run whose coordinator
 * connection is `client`, the lock tables created first where they are missing, then waits for the
 * workers of an earlier run. releaseRunnerLock(client) lets it go.
 */
export async function takeRunnerLock(pending: PendingRunnerLock, options: RunnerLockOptions = {}): Promise<void> {
  const { host, client, lock } = pending;
  const wait = options.workerWait ?? '5s';
  try {
    await ensureControlLocks(client);
    if (!(await lockRunner(lock, durationMs(wait)))) {
      const holder = await describeRunnerHolders(lock).catch((error: unknown) => `unknown (${describePgError(error)})`);
      throw new HostError(
        host.name,
        `another shardctl run holds the runner lock (${holder}); waited ${wait}, nothing was written. Run again when it has finished.`,
        {
          code: 'RUNNER_BUSY',
        },
      );
    }
    await waitForWorkers(client, host.name, wait);
  } catch (error) {
    await endQuietly(lock);
    if ((error as { code?: unknown }).code === INSUFFICIENT_PRIVILEGE)
      throw await controlRightsError(client, host, error);
    throw error;
  }
  lockConnections.set(client, lock);
}

/** Closes a lock connection that was opened and will not be locked. */
export async function abandonRunnerLock(pending: PendingRunnerLock): Promise<void> {
  await endQuietly(pending.lock);
}

/**
 * Takes the runner lock on `lock`, waiting up to waitMs for its holder to go; the transaction stays
 * open. The session's timeouts are lifted first: the transaction is idle, on purpose, until the run ends.
 */
async function lockRunner(lock: pg.Client, waitMs: number): Promise<boolean> {
  await lock.query(
    `SET idle_in_transaction_session_timeout = 0; SET statement_timeout = 0;
     SELECT set_config('transaction_timeout', '0', false) WHERE current_setting('server_version_num')::int >= 170000;`,
  );
  try {
    // lock_timeout 0 would wait for ever: no wait is NOWAIT.
    await lock.query(
      waitMs === 0
        ? `BEGIN; LOCK TABLE ${RUNNER_LOCK_TABLE} IN SHARE UPDATE EXCLUSIVE MODE NOWAIT;`
        : `BEGIN; SET LOCAL lock_timeout = '${waitMs}ms'; LOCK TABLE ${RUNNER_LOCK_TABLE} IN SHARE UPDATE EXCLUSIVE MODE;`,
    );
    return true;
  } catch (error) {
    await rollbackQuietly(lock);
    if ((error as { code?: unknown }).code === '55P03') return false;
    throw error;
  }
}

export async function releaseRunnerLock(client: pg.Client): Promise<void> {
  const lock = lockConnections.get(client);
  if (!lock) return;
  lockConnections.delete(client);
  // This run's workers are done: their records go, so the next run has nothing to wait for (through
  // a pooler their backends live on, serving other clients). A worker still busy keeps its record.
  // Best effort: a lost coordinator leaves them to the next run's check.
  await client.query(FINISHED_WORKERS_SQL, [RUN_ID]).catch(() => undefined);
  // Ending the session (a Terminate message) aborts its transaction and so releases the lock.
  await endQuietly(lock);
}

/**
 * Records a worker connection of a run (committed at once), before it does any work, so that a later
 * run waits for it to finish even if this process dies.
 */
export async function registerWorker(client: pg.Client, hostName: string): Promise<void> {
  try {
    await client.query(
      `INSERT INTO ${WORKERS_TABLE} (pid, backend_start, run_id)
       SELECT pid, backend_start, $1 FROM pg_stat_activity WHERE pid = pg_backend_pid()
       ON CONFLICT (pid, backend_start) DO UPDATE SET run_id = EXCLUDED.run_id`,
      [RUN_ID],
    );
  } catch (error) {
    throw new HostError(
      hostName,
      `cannot record a worker connection in ${WORKERS_TABLE}: ${describePgError(error)}; nothing more was written`,
      {
        cause: error,
      },
    );
  }
}

/**
 * Whether backend a.pid holds the runner lock: once this run holds it, that backend is this run's
 * own lock session (behind a transaction pooler, a backend recorded for an earlier run's worker may
 * be the one the pooler pinned to it).
 */
const HOLDS_RUNNER_LOCK = `EXISTS (SELECT FROM pg_locks l WHERE l.pid = a.pid AND l.locktype = 'relation'
     AND l.relation = '${RUNNER_LOCK_TABLE}'::regclass AND l.mode = 'ShareUpdateExclusiveLock' AND l.granted)`;

/**
 * This process's runs, as their workers record themselves: the records of a run that finished are
 * removed by it (FINISHED_WORKERS_SQL), those of a killed run by the next run once they are idle.
 */
const RUN_ID = randomUUID();

/**
 * Backends recorded as workers that may still be doing a killed run's work: alive (the same pid and
 * start time), not idle, and running a statement of shardctl's (its application_name). An idle
 * backend runs nothing: a dead client sends it nothing more, and behind a transaction pooler (where
 * the backend lives on and serves other clients) it is between transactions. A backend running
 * another client's statement is not a worker any more: a pooler hands a killed run's server
 * connections to applications, and sets each client's application_name on it (PgBouncer does).
 */
const LIVE_WORKERS_SQL = `SELECT a.pid, a.application_name, a.backend_start, host(a.client_addr) AS client_addr
   FROM ${WORKERS_TABLE} w JOIN pg_stat_activity a ON a.pid = w.pid AND a.backend_start = w.backend_start
  WHERE a.pid <> pg_backend_pid() AND a.state IS DISTINCT FROM 'idle' AND NOT ${HOLDS_RUNNER_LOCK}
    AND starts_with(a.application_name, 'shardctl')
  ORDER BY a.pid`;

/** The records of this run's workers whose backends are gone or idle ($1: RUN_ID). */
const FINISHED_WORKERS_SQL = `DELETE FROM ${WORKERS_TABLE} w WHERE w.run_id = $1
   AND NOT EXISTS (SELECT FROM pg_stat_activity a WHERE a.pid = w.pid AND a.backend_start = w.backend_start
                    AND a.pid <> pg_backend_pid() AND a.state IS DISTINCT FROM 'idle')`;

async function waitForWorkers(client: pg.Client, hostName: string, wait: string): Promise<void> {
  const deadline = Date.now() + durationMs(wait);
  for (;;) {
    const live = await client.query<Holder>(LIVE_WORKERS_SQL);
    if (live.rows.length === 0) break;
    if (Date.now() >= deadline) {
      throw new HostError(
        hostName,
        `workers of another shardctl run are still running after ${wait} (${describeHolders(live.rows)}); nothing was written. ` +
          'Their run was killed or lost its coordinator connection; run again when they have finished, or end them with pg_terminate_backend(pid).',
        { code: 'RUNNER_BUSY' },
      );
    }
    await new Promise((resolve) => setTimeout(resolve, Math.min(WORKER_POLL_MS, Math.max(1, deadline - Date.now()))));
  }
  await client.query(
    `DELETE FROM ${WORKERS_TABLE} w WHERE NOT EXISTS (SELECT FROM pg_stat_activity a WHERE a.pid = w.pid AND a.backend_start = w.backend_start
                                                      AND a.pid <> pg_backend_pid() AND a.state IS DISTINCT FROM 'idle')`,
  );
}

interface Holder {
  pid: number;
  application_name: string;
  backend_start: Date;
  client_addr: string | null;
}

async function describeRunnerHolders(client: pg.Client): Promise<string> {
  const result = await client.query<Holder>(
    `SELECT a.pid, a.application_name, a.backend_start, host(a.client_addr) AS client_addr
       FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
      WHERE l.locktype = 'relation' AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
        AND l.relation = $1::regclass AND l.mode = 'ShareUpdateExclusiveLock' AND l.granted AND l.pid <> pg_backend_pid()
      ORDER BY a.pid`,
    [RUNNER_LOCK_TABLE],
  );
  return describeHolders(result.rows);
}

function describeHolders(rows: readonly Holder[]): string {
  if (rows.length === 0) return 'holder not visible';
  return rows
    .map(
      (row) =>
        `backend pid ${row.pid}, application ${row.application_name || '?'}, from ${row.client_addr ?? 'local socket'}, ` +
        `connected since ${row.backend_start.toISOString()}`,
    )
    .join('; ');
}
