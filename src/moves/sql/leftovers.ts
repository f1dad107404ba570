import { EMPTY, int, lines, list, lit, sql, type Sql } from '../../pg/sql-template.js';
import { CONTROL, shardIsActive } from '../../fleet/control.js';
import {
  DELTA_TRIGGERS,
  FENCE_TRIGGER,
  INCOMING_TRIGGER,
  TRACK_TRIGGERS,
  deltaFunctionPrefix,
  incomingGuardName,
  replicationName,
} from './names.js';

/**
 * What moves left behind (unused guard and log functions, triggers, replication objects), for gc
 * and for a move's start.
 */

/** The names of the running moves' objects (replicationName): their publication, slot, subscription, fence guard. */
export const RUNNING_MOVE_NAMES_SQL = sql`SELECT 'shardctl_move_' || move_id FROM ${CONTROL}.moves WHERE status = 'running'`;

/**
 * The fence guards (fenceGuardSql), change-log functions (deltaFunctionName) and incoming copies'
 * guard functions (sql/incoming.ts) that no trigger calls any more, dropped: those of moves whose
 * old copies are gone (gc, --drop-source), whose fence was undone, or whose clean-up dropped the
 * incoming guards. `moveId`: that move's only; else every one but a running move's guard (its
 * next wave creates it again, and its log function with its logs).
 */
export function dropUnusedFenceGuardsSql(
  which: { readonly moveId: string } | { readonly movesRecorded: boolean },
): Sql {
  const names =
    'moveId' in which
      ? sql`(p.proname = ${lit(replicationName(which.moveId))}${list(
          [deltaFunctionPrefix(which.moveId), incomingGuardName(which.moveId)].map(
            (prefix) => sql` OR left(p.proname, ${int(prefix.length)}) = ${lit(prefix)}`,
          ),
          '',
        )})`
      : sql`p.proname LIKE 'shardctl\\_move\\_%'${which.movesRecorded ? sql` AND p.proname NOT IN (${RUNNING_MOVE_NAMES_SQL})` : EMPTY}`;
  return lines([
    sql`DO $guards$`,
    sql`DECLARE f regprocedure;`,
    sql`BEGIN`,
    sql`  FOR f IN SELECT p.oid::regprocedure FROM pg_catalog.pg_proc p`,
    sql`            WHERE p.pronamespace = pg_catalog.to_regnamespace(${lit(CONTROL)}) AND ${names}`,
    sql`              AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_trigger t WHERE t.tgfoid = p.oid) LOOP`,
    sql`    EXECUTE pg_catalog.format('DROP FUNCTION %s', f);`,
    sql`  END LOOP;`,
    sql`END`,
    sql`$guards$`,
  ]);
}

/**
 * The triggers of moves (the fence's, the change logs', the target's tracking, an incoming copy's
 * guard) that are left on tables of shards active on this host and in no running move this host
 * records, each kept by a table that was busy at every removal: a fence trigger that is disabled or
 * calls a move's guard, a change-log or tracking trigger (calling a function of the control schema:
 * a finished move's log function does nothing), an incoming guard (sql/incoming.ts: it lets every
 * write to an active shard through). An enabled trigger calling shard_fenced refuses writes, and is not
 * one of these. A partition's copy of its parent's trigger goes with the parent's, and is not
 * listed. Rows: shard, schema, table, trigger.
 */
export function leftTriggersSql(movesRecorded: boolean): Sql {
  const names = list([FENCE_TRIGGER, ...DELTA_TRIGGERS, ...TRACK_TRIGGERS, INCOMING_TRIGGER].map((name) => lit(name)));
  return sql`SELECT s.shard, n.nspname AS schema, c.relname AS table, t.tgname AS trigger
       FROM pg_catalog.pg_trigger t
       JOIN pg_catalog.pg_class c ON c.oid = t.tgrelid
       JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
       JOIN pg_catalog.pg_proc p ON p.oid = t.tgfoid
       JOIN ${CONTROL}.shards s ON s.schema_name = n.nspname AND ${shardIsActive(sql`s`)}
      WHERE t.tgname IN (${names})
        AND p.pronamespace = pg_catalog.to_regnamespace(${lit(CONTROL)})
        AND NOT (p.proname = 'shard_fenced' AND t.tgenabled <> 'D')
        AND t.tgparentid = 0${
          movesRecorded
            ? sql`
        AND NOT EXISTS (SELECT 1 FROM ${CONTROL}.moves m WHERE m.status = 'running' AND s.shard = ANY(coalesce(m.shards, ARRAY[m.shard])))`
            : EMPTY
        }
      ORDER BY 2, 3, 4`;
}

/**
 * The publications, subscriptions and slots named like a move's (shardctl_move_<id>) that no
 * running move accounts for; `movesRecorded`: the host has the control schema's moves table.
 */
export function leftoverReplicationSql(movesRecorded: boolean): Sql {
  const running = movesRecorded ? RUNNING_MOVE_NAMES_SQL : sql`SELECT NULL::text WHERE false`;
  return sql`SELECT kind, name FROM (
        SELECT 'publication' AS kind, pubname::text AS name FROM pg_publication
        UNION ALL SELECT 'subscription', subname::text FROM pg_subscription WHERE subdbid = (SELECT oid FROM pg_database WHERE datname = current_database())
        UNION ALL SELECT 'slot', slot_name::text FROM pg_replication_slots WHERE database = current_database()
      ) o
      WHERE name LIKE 'shardctl\\_move\\_%' AND name NOT IN (${running})
      ORDER BY kind, name`;
}
