import { EMPTY, ident, list, lit, sql, type Sql } from '../../pg/sql-template.js';
import { CONTROL } from '../../fleet/control.js';

/**
 * Logical replication of a move: publication, slot, subscription, the markers the target waits
 * for, and the probe preflight creates.
 */

/**
 * The shards' tables (quoted, qualified: publication.ts says why they are named one by one) and this
 * move's marker rows, replicated to the target.
 */
export function createPublicationSql(name: string, tables: readonly Sql[], moveId: string): Sql {
  return sql`CREATE PUBLICATION ${ident(name)} FOR TABLE ${list([...tables, sql`${CONTROL}.move_markers WHERE (move_id = ${lit(moveId)})`])}`;
}

/** The permanent tables (partitions included, partitioned parents not) of the schemas $1, by name. */
export const PUBLISHED_TABLES_SQL = sql`SELECT n.nspname, c.relname
  FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = ANY($1::text[]) AND c.relkind = 'r' AND c.relpersistence = 'p'
 ORDER BY n.nspname, c.relname`;

/**
 * Streams from the slot the copy step created, without copying again (the rows came from the slot's
 * snapshot). Binary only between equal major versions. `failover` (PostgreSQL 17 on both ends): the
 * slot is kept on standbys that sync slots (moves/failover.ts).
 */
export function createSubscriptionSql(
  name: string,
  sourceReplicationUrl: string,
  binary: boolean,
  enabled = true,
  failover = false,
): Sql {
  return sql`CREATE SUBSCRIPTION ${ident(name)} CONNECTION ${lit(sourceReplicationUrl)}
  PUBLICATION ${ident(name)}
  WITH (slot_name = ${lit(name)}, create_slot = false, copy_data = false, binary = ${binary ? sql`true` : sql`false`}${enabled ? EMPTY : sql`, enabled = false`}${failover ? sql`, failover = true` : EMPTY})`;
}

export function enableSubscriptionSql(name: string): Sql {
  return sql`ALTER SUBSCRIPTION ${ident(name)} ENABLE`;
}

/** The replication connection's command: a logical slot whose snapshot the copy reads. */
export function createSlotCommand(name: string): Sql {
  return sql`CREATE_REPLICATION_SLOT ${ident(name)} LOGICAL pgoutput EXPORT_SNAPSHOT`;
}

export function dropSubscriptionSql(name: string, options: { ifExists?: boolean } = {}): Sql {
  return sql`DROP SUBSCRIPTION ${options.ifExists ? sql`IF EXISTS ` : EMPTY}${ident(name)}`;
}

/**
 * A disabled subscription with no slot: creating it makes the target open a replication connection
 * to the source, which is the point (preflight's "target reaches source").
 */
export function probeSubscriptionSql(name: string, sourceReplicationUrl: string): Sql {
  return sql`CREATE SUBSCRIPTION ${ident(name)} CONNECTION ${lit(sourceReplicationUrl)} PUBLICATION shardctl_probe
  WITH (connect = true, enabled = false, create_slot = false, slot_name = NONE)`;
}

/** Detaches a subscription from its slot, for when the source cannot be reached to drop the slot. */
export function detachSubscriptionSql(name: string): Sql {
  return sql`ALTER SUBSCRIPTION ${ident(name)} DISABLE;\nALTER SUBSCRIPTION ${ident(name)} SET (slot_name = NONE)`;
}

export function dropPublicationSql(name: string): Sql {
  return sql`DROP PUBLICATION IF EXISTS ${ident(name)}`;
}

export function insertMarkerSql(moveId: string, kind: string): Sql {
  return sql`INSERT INTO ${CONTROL}.move_markers (move_id, kind) VALUES (${lit(moveId)}, ${lit(kind)}) ON CONFLICT DO NOTHING;`;
}

export const PUBLICATION_EXISTS_SQL = sql`SELECT 1 FROM pg_publication WHERE pubname = $1`;

export const SUBSCRIPTION_EXISTS_SQL = sql`SELECT subenabled AS enabled FROM pg_subscription WHERE subname = $1`;

/** How often subscription $1 failed to sync or apply. */
export const SUBSCRIPTION_ERRORS_SQL = sql`SELECT coalesce(sum(sync_error_count + apply_error_count), 0)::text AS n FROM pg_stat_subscription_stats WHERE subname = $1`;

/** Whether subscription $1 exists (enabled: null when not) and how often it failed to sync or apply. */
export const SUBSCRIPTION_HEALTH_SQL = sql`SELECT (${SUBSCRIPTION_EXISTS_SQL}) AS enabled, (${SUBSCRIPTION_ERRORS_SQL}) AS failures`;

/** Where a target's apply stands: the position slot $1 (on the source) has confirmed. */
export const SLOT_CONFIRMED_SQL = sql`SELECT confirmed_flush_lsn::text AS lsn FROM pg_replication_slots WHERE slot_name = $1`;

/** Subscription $1's tables, and how many of them are not streaming yet. */
export const SUBSCRIPTION_TABLES_SQL = sql`SELECT count(*) AS total, count(*) FILTER (WHERE r.srsubstate <> 'r') AS pending
         FROM pg_subscription_rel r JOIN pg_subscription s ON s.oid = r.srsubid WHERE s.subname = $1`;

/** A row once marker $2 of move $1 is here. */
export const MARKER_ARRIVED_SQL = sql`SELECT 1 FROM ${CONTROL}.move_markers WHERE move_id = $1 AND kind = $2`;

/** What subscription $1's apply worker waits for, and who holds it. */
export const APPLY_WORKER_WAITS_SQL = sql`SELECT w.wait_event_type || '/' || w.wait_event AS wait,
            (SELECT string_agg(format('pid %s (%s, %s: %s)', b.pid, coalesce(nullif(b.application_name, ''), 'no application name'), b.state, left(b.query, 80)), '; ')
               FROM pg_stat_activity b WHERE b.pid = ANY(pg_blocking_pids(w.pid))) AS blockers
       FROM pg_stat_subscription s JOIN pg_stat_activity w ON w.pid = s.pid
      WHERE s.subname = $1 AND s.relid IS NULL`;

/**
 * The server's logical replication workers running (every database's subscriptions: apply, table
 * sync and parallel apply workers) and its slots for them (max_logical_replication_workers). A
 * subscription whose worker finds no free slot waits for one.
 */
export const LOGICAL_WORKERS_SQL = sql`SELECT (SELECT count(*) FROM pg_stat_subscription WHERE pid IS NOT NULL)::int AS workers,
       current_setting('max_logical_replication_workers')::int AS slots`;

/**
 * Why subscription $1 has no apply worker, as far as the target tells: the subscription gone or
 * disabled, its failures (SUBSCRIPTION_HEALTH_SQL; the reasons are in the server log), and the host's logical replication workers running against max_logical_replication_workers
 * (a worker waits for a free slot).
 */
export const APPLY_WORKER_ABSENT_SQL = sql`SELECT h.enabled, h.failures, w.workers, w.slots
  FROM (${SUBSCRIPTION_HEALTH_SQL}) h, (${LOGICAL_WORKERS_SQL}) w`;

/** Move $1's markers. */
export const DELETE_MARKERS_SQL = sql`DELETE FROM ${CONTROL}.move_markers WHERE move_id = $1`;

/** The walsender holding slot $1 (a row only while the slot exists). */
export const SLOT_ACTIVE_PID_SQL = sql`SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1`;

/** Slot $1 dropped (fails while a walsender holds it). */
export const DROP_SLOT_SQL = sql`SELECT pg_drop_replication_slot($1)`;

/** Recorded before the probe subscription is created, so a kill in between leaves a recorded leftover. */
export function recordObjectSql(name: string, kind: 'probe-subscription'): Sql {
  return sql`INSERT INTO ${CONTROL}.objects (name, kind) VALUES (${lit(name)}, ${lit(kind)}) ON CONFLICT DO NOTHING`;
}

export function forgetObjectSql(name: string): Sql {
  return sql`DELETE FROM ${CONTROL}.objects WHERE name = ${lit(name)}`;
}

/** The probe subscriptions recorded on this host. */
export const PROBE_SUBSCRIPTIONS_SQL = sql`SELECT name FROM ${CONTROL}.objects WHERE kind = 'probe-subscription' ORDER BY name`;
