import type pg from 'pg';
import { RuntimeFailure } from '../errors.js';
import { describePgError } from './connect.js';

/**
 * One shardctl runner per host at a time (init, add-schema, migrate, move-shard). A session-level
 * advisory lock held by the run's coordinator connection: it disappears with the connection, so a
 * killed run never leaves a stale lock behind. A second runner fails fast, naming the holder.
 */
export const RUNNER_LOCK_CLASS = 0x73687264; // 'shrd', shared with next_id_locked (objid = sequence oid, never 0)
export const RUNNER_LOCK_OBJID = 0;

export async function acquireRunnerLock(client: pg.Client, hostName: string): Promise<void> {
  const result = await client.query<{ locked: boolean }>('SELECT pg_try_advisory_lock($1, $2) AS locked', [
    RUNNER_LOCK_CLASS,
    RUNNER_LOCK_OBJID,
  ]);
  if (result.rows[0]?.locked) return;
  const holder = await describeHolder(client).catch((error: unknown) => `unknown (${describePgError(error)})`);
  throw new RuntimeFailure(
    'RUNNER_BUSY',
    `host ${hostName}: another shardctl run holds the runner lock (${holder}); nothing was written. Run again when it has finished.`,
    { host: hostName },
  );
}

export async function releaseRunnerLock(client: pg.Client): Promise<void> {
  await client.query('SELECT pg_advisory_unlock($1, $2)', [RUNNER_LOCK_CLASS, RUNNER_LOCK_OBJID]);
}

async function describeHolder(client: pg.Client): Promise<string> {
  const result = await client.query<{ pid: number; application_name: string; backend_start: Date; client_addr: string | null }>(
    `SELECT a.pid, a.application_name, a.backend_start, host(a.client_addr) AS client_addr
       FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
      WHERE l.locktype = 'advisory' AND l.classid = $1 AND l.objid = $2 AND l.objsubid = 2 AND l.granted`,
    [RUNNER_LOCK_CLASS, RUNNER_LOCK_OBJID],
  );
  const row = result.rows[0];
  if (!row) return 'holder not visible';
  return `backend pid ${row.pid}, application ${row.application_name || '?'}, from ${row.client_addr ?? 'local socket'}, connected since ${row.backend_start.toISOString()}`;
}
