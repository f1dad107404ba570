/**
 * What a pooled connection's server session is, read when the connection is made: whether a pooler
 * stands between (a transaction pooler may run its next transaction on another server connection)
 * and whether the session kept the timeouts asked for as startup parameters. Used by the router's
 * pools (src/router/pools.ts, the primaries'; src/router/replicas.ts, the standbys'); the marks are
 * read by each routed transaction (src/router/transaction.ts).
 */
import type pg from 'pg';

/** The router's timeouts as pg's client options (sent as startup parameters). */
export type SessionTimeouts = { statement_timeout?: number; idle_in_transaction_session_timeout?: number };

/** Marks a pooled connection whose session has the router's timeouts (inspectConnection). */
const SESSION_TIMEOUTS = Symbol('shardctl.sessionTimeouts');

/** Marks a connection found behind a pooler the config does not declare (inspectConnection). */
const BEHIND_POOLER = Symbol('shardctl.behindPooler');

/** Marks a connection found to be the server's own session, no pooler between (inspectConnection). */
const SERVER_SESSION = Symbol('shardctl.serverSession');

/** Whether the connection was found behind a pooler when it was made: its next transaction may run on another server connection. */
export function behindPooler(client: pg.ClientBase): boolean {
  return (client as unknown as { [BEHIND_POOLER]?: boolean })[BEHIND_POOLER] === true;
}

/**
 * Whether the connection was found to be the server's own session when it was made (the backend pid
 * the server reports is the one given at startup): what it leaves in its session (a session-level
 * SET) stays with this connection, and reaches no other client.
 */
export function serverSession(client: pg.ClientBase): boolean {
  return (client as unknown as { [SERVER_SESSION]?: boolean })[SERVER_SESSION] === true;
}

/** Whether the connection's session has the router's timeouts, so its transactions need not set them. */
export function hasSessionTimeouts(client: pg.ClientBase): boolean {
  return (client as unknown as { [SESSION_TIMEOUTS]?: boolean })[SESSION_TIMEOUTS] === true;
}

/**
 * What a new connection's server session is, read in one query when it connects:
 * - whether it is the server's own session: the backend pid the server reports differs from the one
 *   the connection was given at startup (BackendKeyData) when a pooler stands between them, since
 *   PgBouncer, like other transaction poolers, hands its clients keys of its own (a client's cancel
 *   request must reach whichever server connection runs its query). The connection is marked then
 *   (behindPooler): its next transaction may run on another server connection; else, when the pids
 *   match, it is marked as the server's own session (serverSession).
 * - when it asked for the router's timeouts as startup parameters, whether its session has them (a
 *   pooler may have dropped them): marked when every one is there and no pooler was seen, else its
 *   transactions set them.
 */
export async function inspectConnection(client: pg.ClientBase, wanted?: SessionTimeouts): Promise<void> {
  try {
    const { rows } = await client.query<{ pid: number; name: string | null; setting: string | null }>(
      `SELECT pg_catalog.pg_backend_pid() AS pid, s.name, s.setting
         FROM (SELECT 1) AS one LEFT JOIN pg_catalog.pg_settings AS s ON s.name = ANY($1::text[])`,
      [Object.keys(wanted ?? {})],
    );
    const given = (client as unknown as { processID?: unknown }).processID;
    const pooled = typeof given === 'number' && rows[0] !== undefined && rows[0].pid !== given;
    if (pooled) (client as unknown as { [BEHIND_POOLER]?: boolean })[BEHIND_POOLER] = true;
    else if (typeof given === 'number' && rows[0] !== undefined)
      (client as unknown as { [SERVER_SESSION]?: boolean })[SERVER_SESSION] = true;
    const ok =
      wanted !== undefined &&
      Object.entries(wanted).every(([name, ms]) => rows.some((r) => r.name === name && r.setting === String(ms)));
    if (ok && !pooled) (client as unknown as { [SESSION_TIMEOUTS]?: boolean })[SESSION_TIMEOUTS] = true;
  } catch {
    // Left unmarked: its transactions set the timeouts themselves (a lost connection fails the call).
  }
}
