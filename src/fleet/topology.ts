/**
 * What a host is made of now: the address shardctl reached (the primary, for a URL of several
 * addresses; src/pg/multihost.ts), and the standbys streaming from it as the primary reports them in
 * pg_stat_replication, with their lag. Their addresses there are the standbys' client addresses
 * (not necessarily the ones a URL lists); a role without pg_monitor sees no lag figures.
 */
import type pg from 'pg';
import { CONTROL } from './control.js';
import { connectedAddress } from './connect.js';

export interface StandbyStatus {
  /** application_name of its walreceiver (cluster_name, or "walreceiver"). */
  readonly name: string;
  /** client_addr:client_port; null when the role may not see it. */
  readonly address: string | null;
  /** streaming, catchup, backup, … */
  readonly state: string | null;
  /** async, sync, quorum, potential. */
  readonly sync: string | null;
  /** Bytes of WAL the primary wrote that it has not replayed yet. */
  readonly lagBytes: number | null;
  /** replay_lag in ms (null when idle or not visible). */
  readonly replayLagMs: number | null;
}

export interface HostTopology {
  /** The address connected to (host:port), i.e. the host's primary now. */
  readonly primary: string | null;
  /** This server is itself a standby (in recovery): reached through target_session_attrs that allow it. */
  readonly inRecovery: boolean;
  readonly standbys: readonly StandbyStatus[];
}

export const TOPOLOGY_SQL = `SELECT application_name AS name,
    CASE WHEN client_addr IS NULL THEN NULL ELSE host(client_addr) || ':' || client_port END AS address,
    state, sync_state AS sync,
    pg_catalog.pg_wal_lsn_diff(
      CASE WHEN pg_catalog.pg_is_in_recovery() THEN pg_catalog.pg_last_wal_replay_lsn() ELSE pg_catalog.pg_current_wal_lsn() END,
      replay_lsn)::float8 AS lag_bytes,
    (extract(epoch FROM replay_lag) * 1000)::float8 AS replay_lag_ms
   FROM pg_catalog.pg_stat_replication r
  -- Standbys only: a logical walsender (a move's subscription, of this fleet or another database's) is none.
  WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_replication_slots s WHERE s.active_pid = r.pid AND s.slot_type = 'logical')
  ORDER BY application_name, client_addr, client_port`;

export async function readTopology(client: pg.Client): Promise<HostTopology> {
  const [recovery, standbys] = await Promise.all([
    client.query<{ r: boolean }>('SELECT pg_catalog.pg_is_in_recovery() AS r'),
    client.query<{
      name: string;
      address: string | null;
      state: string | null;
      sync: string | null;
      lag_bytes: number | null;
      replay_lag_ms: number | null;
    }>(TOPOLOGY_SQL),
  ]);
  return {
    primary: connectedAddress(client) ?? null,
    inRecovery: recovery.rows[0]!.r,
    standbys: standbys.rows.map((r) => ({
      name: r.name,
      address: r.address,
      state: r.state,
      sync: r.sync,
      lagBytes: r.lag_bytes === null ? null : Math.round(r.lag_bytes),
      replayLagMs: r.replay_lag_ms === null ? null : Math.round(r.replay_lag_ms),
    })),
  };
}

/** "standby1 at 10.0.0.2:51234 (streaming, async, lag 0 B, 3 ms)". */
export function describeStandby(s: StandbyStatus): string {
  const lag = [
    s.lagBytes === null ? null : `${s.lagBytes} B`,
    s.replayLagMs === null ? null : `${s.replayLagMs} ms`,
  ].filter((x) => x !== null);
  const what = [s.state, s.sync, lag.length > 0 ? `lag ${lag.join(', ')}` : null].filter((x) => x !== null);
  return `${s.name}${s.address ? ` at ${s.address}` : ''}${what.length > 0 ? ` (${what.join(', ')})` : ''}`;
}

/** The fleet row of the server `client` is connected to, null when it has none (not initialised). */
export async function readFleetRow(client: pg.Client): Promise<{ fleetId: string; hostName: string } | null> {
  const exists = await client.query<{ ok: boolean }>(`SELECT pg_catalog.to_regclass($1) IS NOT NULL AS ok`, [
    `${CONTROL}.fleet`,
  ]);
  if (!exists.rows[0]!.ok) return null;
  const row = await client.query<{ fleet_id: string; host_name: string }>(
    `SELECT fleet_id::text AS fleet_id, host_name FROM ${CONTROL}.fleet`,
  );
  const first = row.rows[0];
  return first ? { fleetId: first.fleet_id, hostName: first.host_name } : null;
}
