import type pg from 'pg';
import { HostError } from '../errors.js';
import { durationMs } from '../config/duration.js';
import { ID_LOCK_CLASS } from '../id/sql.js';
import { describePgError } from './connect.js';

/**
 * One shardctl runner per host at a time (init, add-schema, migrate, move-shard). A session-level
 * advisory lock held by the run's coordinator connection: it disappears with the connection, so a
 * killed run never leaves a stale lock behind. But not at the same instant: behind a TCP proxy
 * (PgBouncer, HAProxy, a cloud load balancer, docker-proxy) or in the middle of a statement, the
 * server ends a killed run's session a moment later (connect.ts sets client_connection_check_interval
 * to bound that moment). So a busy lock is waited for, up to the config's lockTimeout, before a
 * second runner fails, naming the holder: an immediate rerun after a kill works, and a live
 * runner still stops the second one within lockTimeout.
 *
 * The coordinator's lock alone is not enough: when a runner dies (SIGKILL, Ctrl-C, a lost
 * coordinator connection), its worker backends go on with the statement they were sent, commits
 * included, until they next talk to the client. So every worker connection holds the worker lock
 * in shared mode, and a new runner, once it holds the runner lock, waits (up to the config's
 * lockTimeout) until it can take the worker lock exclusively: only then has every worker of an
 * earlier run finished, and the catalog it reads next is the one it will change.
 */
/** One advisory-lock class for everything shardctl locks: next_id_locked uses sequence oids as objid, never 0 or 1. */
export const RUNNER_LOCK_CLASS = ID_LOCK_CLASS;
export const RUNNER_LOCK_OBJID = 0;
export const WORKER_LOCK_OBJID = 1;
/** Serialises moves that set up change tracking on the same target at once (src/moves/tail.ts). */
export const TRACKING_LOCK_OBJID = 2;

export interface RunnerLockOptions {
  /**
   * How long to wait for the runner lock held by another session, and then for the workers of an
   * earlier run to finish, e.g. '5s' (the config's lockTimeout).
   */
  readonly workerWait?: string;
}

export async function acquireRunnerLock(client: pg.Client, hostName: string, options: RunnerLockOptions = {}): Promise<void> {
  const wait = options.workerWait ?? '5s';
  if (!(await lockRunner(client, durationMs(wait)))) {
    const holder = await describeHolders(client, RUNNER_LOCK_OBJID).catch((error: unknown) => `unknown (${describePgError(error)})`);
    throw new HostError(hostName, `another shardctl run holds the runner lock (${holder}); waited ${wait}, nothing was written. Run again when it has finished.`, {
      code: 'RUNNER_BUSY',
    });
  }
  try {
    await waitForWorkers(client, hostName, options.workerWait ?? '5s');
  } catch (error) {
    await releaseRunnerLock(client).catch(() => undefined);
    throw error;
  }
}

/**
 * Takes the runner lock, waiting up to waitMs for its holder to go. The wait runs in a transaction
 * only for SET LOCAL lock_timeout; the session-level lock outlives it.
 */
async function lockRunner(client: pg.Client, waitMs: number): Promise<boolean> {
  const tried = await client.query<{ locked: boolean }>('SELECT pg_try_advisory_lock($1, $2) AS locked', [RUNNER_LOCK_CLASS, RUNNER_LOCK_OBJID]);
  if (tried.rows[0]?.locked) return true;
  if (waitMs === 0) return false;
  try {
    await client.query(
      `BEGIN; SET LOCAL lock_timeout = '${waitMs}ms'; SELECT pg_advisory_lock(${RUNNER_LOCK_CLASS}, ${RUNNER_LOCK_OBJID}); COMMIT;`,
    );
    return true;
  } catch (error) {
    await client.query('ROLLBACK').catch(() => undefined);
    if ((error as { code?: unknown }).code === '55P03') return false;
    throw error;
  }
}

export async function releaseRunnerLock(client: pg.Client): Promise<void> {
  await client.query('SELECT pg_advisory_unlock($1, $2)', [RUNNER_LOCK_CLASS, RUNNER_LOCK_OBJID]);
}

/** Taken by every worker connection of a run, for the connection's life. */
export async function acquireWorkerLock(client: pg.Client, hostName: string): Promise<void> {
  const result = await client.query<{ locked: boolean }>('SELECT pg_try_advisory_lock_shared($1, $2) AS locked', [
    RUNNER_LOCK_CLASS,
    WORKER_LOCK_OBJID,
  ]);
  if (result.rows[0]?.locked) return;
  // Only a runner holding the runner lock takes the worker lock exclusively, and this run holds it.
  throw new HostError(hostName, 'another shardctl run is checking for workers; nothing more was written', { code: 'RUNNER_BUSY' });
}

async function waitForWorkers(client: pg.Client, hostName: string, wait: string): Promise<void> {
  const waitMs = durationMs(wait);
  try {
    if (waitMs === 0) {
      const result = await client.query<{ locked: boolean }>('SELECT pg_try_advisory_xact_lock($1, $2) AS locked', [
        RUNNER_LOCK_CLASS,
        WORKER_LOCK_OBJID,
      ]);
      if (!result.rows[0]?.locked) throw Object.assign(new Error('worker lock busy'), { code: '55P03' });
    } else {
      // A transaction-level lock: released by the COMMIT as soon as it is granted.
      await client.query(
        `BEGIN; SET LOCAL lock_timeout = '${waitMs}ms'; SELECT pg_advisory_xact_lock(${RUNNER_LOCK_CLASS}, ${WORKER_LOCK_OBJID}); COMMIT;`,
      );
    }
  } catch (error) {
    await client.query('ROLLBACK').catch(() => undefined);
    if ((error as { code?: unknown }).code !== '55P03') throw error;
    const holders = await describeHolders(client, WORKER_LOCK_OBJID).catch((e: unknown) => `unknown (${describePgError(e)})`);
    throw new HostError(
      hostName,
      `workers of another shardctl run are still running after ${wait} (${holders}); nothing was written. ` +
        'Their run was killed or lost its coordinator connection; run again when they have finished, or end them with pg_terminate_backend(pid).',
      { code: 'RUNNER_BUSY' },
    );
  }
}

async function describeHolders(client: pg.Client, objid: number): Promise<string> {
  const result = await client.query<{ pid: number; application_name: string; backend_start: Date; client_addr: string | null }>(
    `SELECT a.pid, a.application_name, a.backend_start, host(a.client_addr) AS client_addr
       FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
      WHERE l.locktype = 'advisory' AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
        AND l.classid = $1 AND l.objid = $2 AND l.objsubid = 2 AND l.granted AND l.pid <> pg_backend_pid()
      ORDER BY a.pid`,
    [RUNNER_LOCK_CLASS, objid],
  );
  if (result.rows.length === 0) return 'holder not visible';
  return result.rows
    .map(
      (row) =>
        `backend pid ${row.pid}, application ${row.application_name || '?'}, from ${row.client_addr ?? 'local socket'}, ` +
        `connected since ${row.backend_start.toISOString()}`,
    )
    .join('; ');
}
