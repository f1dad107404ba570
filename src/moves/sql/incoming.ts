import type pg from 'pg';
import { CONTROL, CONTROL_SCHEMA, shardMovedRaiseSql } from '../../fleet/control.js';
import { ident, lines, list, lit, sql, type Sql } from '../../pg/sql-template.js';
import { lockTimeoutSql } from './locks.js';
import { INCOMING_TRIGGER, incomingGuardName } from './names.js';
import { COPYING_SETTING } from './tail.js';

/**
 * The guard of a move's incoming copies on the target. A client whose map is older than the move
 * (a router that made no call to the shard since it moved away from this host, and has not
 * refreshed its map) places the shard here; once the incoming copy's tables exist, its writes
 * would land in them, be acknowledged, and be lost when the copy truncates or redoes the tables.
 * So every table of an incoming copy gets a statement trigger, created in the transaction that
 * creates the table (appended to each migration of the copy) and again before each copy, that
 * refuses every write with SQLSTATE SC100 naming the shard's current holder (the source), as a
 * fence does: the router reloads its map and writes there.
 *
 * The move's own writes pass: the copy's transactions (COPYING_SETTING), its migrations and chunk
 * plans (BUILDING_SETTING), and the apply worker (the replica role, under which these triggers do
 * not fire). The guard looks the shard up on every write and lets it through once the shard is
 * active here, so the switch changes nothing for it; the clean-up drops the triggers where their
 * tables are free, gc those left behind.
 */

/** The session setting of the move's writes to an incoming copy other than the copy's (migrations, chunk plans). */
export const BUILDING_SETTING = 'shardctl.building';

/** The setting on, for the rest of a transaction. */
export const BUILDING_LOCAL_SQL = sql`SET LOCAL shardctl.building = 'on';`;

/** The setting on for the session, and off again: a no-transaction migration's steps between. */
export const BUILDING_SESSION_SQL = sql`SET shardctl.building = 'on'`;
export const RESET_BUILDING_SQL = sql`RESET shardctl.building`;

/**
 * The guard's function (SECURITY DEFINER: an application role may not read the control schema),
 * its arguments the shard and the host that holds it.
 */
export function incomingGuardFunctionSql(moveId: string): Sql {
  return lines([
    sql`CREATE OR REPLACE FUNCTION ${CONTROL}.${ident(incomingGuardName(moveId))}() RETURNS trigger`,
    sql`LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $guard$`,
    sql`BEGIN`,
    sql`  IF NOT EXISTS (SELECT FROM ${CONTROL}.shards WHERE shard = TG_ARGV[0]::int AND state = 'active') THEN`,
    shardMovedRaiseSql(
      sql`TG_ARGV[0]`,
      sql`TG_ARGV[1]`,
      'its incoming copy here refuses writes until the move switches',
      4,
    ),
    sql`  END IF;`,
    sql`  RETURN NULL;`,
    sql`END`,
    sql`$guard$;`,
  ]);
}

/** A name or value written into a DO block's body: never one that could end its quoting. */
function inBody(value: string): Sql {
  if (value.includes('$')) throw new Error(`incoming guard: ${JSON.stringify(value)} contains "$"`);
  return lit(value);
}

/**
 * The guard's trigger on every table (partitioned parents and partitions) of `schemas` that lacks
 * it, for the shards incoming here (their control rows say so), naming `holder`. One DO block, no
 * transaction of its own: appended to a migration's transaction, or sent alone.
 */
export function incomingGuardsSql(moveId: string, schemas: readonly string[], holder: string): Sql {
  const names = list(schemas.map(inBody));
  const create = [
    `CREATE TRIGGER ${INCOMING_TRIGGER} BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON %I.%I FOR EACH STATEMENT`,
    `WHEN (current_setting(%L, true) IS DISTINCT FROM 'on' AND current_setting(%L, true) IS DISTINCT FROM 'on')`,
    `EXECUTE FUNCTION %I.%I(%L, %L)`,
  ].join(' ');
  return lines([
    sql`DO $incoming$`,
    sql`DECLARE r record;`,
    sql`BEGIN`,
    sql`  FOR r IN SELECT n.nspname, c.relname, s.shard FROM pg_catalog.pg_class c`,
    sql`             JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace`,
    sql`             JOIN ${CONTROL}.shards s ON s.schema_name = n.nspname AND s.state = 'incoming'`,
    sql`            WHERE n.nspname = ANY (ARRAY[${names}]::text[]) AND c.relkind IN ('r', 'p')`,
    sql`              AND NOT EXISTS (SELECT FROM pg_catalog.pg_trigger t WHERE t.tgrelid = c.oid AND t.tgname = ${lit(INCOMING_TRIGGER)})`,
    sql`            ORDER BY 1, 2 LOOP`,
    sql`    EXECUTE pg_catalog.format(${lit(create)}, r.nspname, r.relname, ${lit(COPYING_SETTING)}, ${lit(BUILDING_SETTING)}, ${lit(CONTROL_SCHEMA)}, ${inBody(incomingGuardName(moveId))}, r.shard, ${inBody(holder)});`,
    sql`  END LOOP;`,
    sql`END`,
    sql`$incoming$;`,
  ]);
}

/**
 * The guard's triggers on `schemas` dropped, each only if its table is free at once (lock_timeout
 * 1 ms; a busy table keeps it, gc drops it later: it lets every write through once the shard is
 * active), then the move's guard function if no trigger calls it any more. One transaction.
 */
export function dropIncomingGuardsSql(moveId: string, schemas: readonly string[]): Sql {
  return lines([
    sql`BEGIN;`,
    lockTimeoutSql(1),
    sql`DO $incoming$`,
    sql`DECLARE r record;`,
    sql`BEGIN`,
    sql`  FOR r IN SELECT n.nspname, c.relname FROM pg_catalog.pg_trigger t`,
    sql`             JOIN pg_catalog.pg_class c ON c.oid = t.tgrelid`,
    sql`             JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace`,
    sql`            WHERE t.tgname = ${lit(INCOMING_TRIGGER)} AND n.nspname = ANY (ARRAY[${list(schemas.map(inBody))}]::text[])`,
    sql`            ORDER BY 1, 2 LOOP`,
    sql`    BEGIN`,
    sql`      EXECUTE pg_catalog.format('DROP TRIGGER IF EXISTS %I ON %I.%I', ${lit(INCOMING_TRIGGER)}, r.nspname, r.relname);`,
    sql`    EXCEPTION WHEN lock_not_available THEN NULL;`,
    sql`    END;`,
    sql`  END LOOP;`,
    sql`  IF NOT EXISTS (SELECT FROM pg_catalog.pg_trigger t JOIN pg_catalog.pg_proc p ON p.oid = t.tgfoid`,
    sql`                  WHERE p.proname = ${inBody(incomingGuardName(moveId))} AND p.pronamespace = pg_catalog.to_regnamespace(${lit(CONTROL_SCHEMA)})) THEN`,
    sql`    DROP FUNCTION IF EXISTS ${CONTROL}.${ident(incomingGuardName(moveId))}();`,
    sql`  END IF;`,
    sql`END`,
    sql`$incoming$;`,
    sql`COMMIT;`,
  ]);
}

/** Shards' schemas per round trip of dropIncomingGuards. */
const DROP_GUARDS_SCHEMAS = 256;

/** dropIncomingGuardsSql for `schemas`, a round trip per DROP_GUARDS_SCHEMAS of them. */
export async function dropIncomingGuards(client: pg.Client, moveId: string, schemas: readonly string[]): Promise<void> {
  for (let i = 0; i < schemas.length; i += DROP_GUARDS_SCHEMAS)
    await client.query(dropIncomingGuardsSql(moveId, schemas.slice(i, i + DROP_GUARDS_SCHEMAS)));
}
