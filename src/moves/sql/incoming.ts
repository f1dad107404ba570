import type pg from 'pg';
import { CONTROL, CONTROL_SCHEMA, shardMovedRaiseSql } from '../../fleet/control.js';
import { ident, int, lines, list, lit, sql, type Sql } from '../../pg/sql-template.js';
import { dropUnusedFenceGuardsSql } from './leftovers.js';
import { INSUFFICIENT_PRIVILEGE } from '../../pg/sqlstate.js';
import { lockTimeoutSql } from './locks.js';
import { INCOMING_TRIGGER, incomingGuardName } from './names.js';
import { COPYING_SETTING } from './tail.js';

/**
 * The guard of a move's incoming copies on the target. A client whose map is older than the move
 * (a router that made no call to the shard since it moved away from this host, and has not
 * refreshed its map) places the shard here; once the incoming copy's tables exist, its writes
 * would land in them, be acknowledged, and be lost when the copy truncates or redoes the tables.
 * Only a host that held the shard before can be in such a map, so the copies of shards this host
 * held before (its records of moves say a move took them away: targets.ts, heldBefore) are
 * guarded: every table of such a copy gets a statement trigger, created in the transaction that
 * creates the table (appended to each migration of the copy) and again before each chunk of
 * copies, that refuses every write with SQLSTATE SC100 naming the shard's current holder (the
 * source), as a fence does: the router reloads its map and writes there.
 *
 * The move's own writes pass: the copy's transactions (COPYING_SETTING), its migrations and chunk
 * plans (BUILDING_SETTING), and the apply worker (the replica role, under which these triggers do
 * not fire). The guard looks the shard up on every write and lets it through once the shard is
 * active here, so the switch changes nothing for it; the clean-up drops the triggers where their
 * tables are free, gc those left behind. It is a safety net for clients on an old map, not a
 * permission: any session may set the two settings.
 */

/**
 * Of shards $2 (int[]), those that a finished move took away from host $1 (this host's name), by
 * this host's records of moves.
 */
export const HELD_BEFORE_SQL = heldBeforeSql(sql`$2::int[]`);

function heldBeforeSql(shards: Sql): Sql {
  return sql`SELECT DISTINCT s AS shard
       FROM ${CONTROL}.moves m, unnest(coalesce(m.shards, ARRAY[m.shard])) AS s
      WHERE m.source = $1 AND m.status = 'done' AND s = ANY (${shards})`;
}

/**
 * The schemas of this host's guarded incoming copies (host $1, this host's name): shards incoming
 * here that a finished move took away from here. Their schemas are their owners' alone until the
 * switch (moves/privileges.ts withheldSchemaAcl), so `shardctl grant` gives them no USAGE meanwhile
 * (the switch grants the schema what the source's has then, the grant included).
 */
export const GUARDED_SCHEMAS_SQL = sql`SELECT sh.schema_name::text AS schema FROM ${CONTROL}.shards sh
  WHERE sh.state = 'incoming' AND EXISTS (${heldBeforeSql(sql`ARRAY[sh.shard]`)})`;

/** The session setting of the move's writes to an incoming copy other than the copy's (migrations, chunk plans). */
export const BUILDING_SETTING = 'shardctl.building';

/** The setting on, for the rest of a transaction. */
export const BUILDING_LOCAL_SQL = sql`SET LOCAL shardctl.building = 'on';`;

/** The setting on for the session, and off again: a no-transaction migration's steps between. */
export const BUILDING_SESSION_SQL = sql`SET shardctl.building = 'on'`;
export const RESET_BUILDING_SQL = sql`RESET shardctl.building`;

/**
 * The move's two functions: the guard (SECURITY DEFINER: an application role may not read the
 * control schema), whose arguments are the shard and the host that holds it; and the one that
 * gives a shard's tables the guard's trigger (incomingGuardsSql), where a PL/pgSQL function's plans
 * are kept by the session, where a DO block's catalog query was planned anew each time (0.6-1.4 ms
 * of every migration of every copy).
 */
export function incomingGuardFunctionSql(moveId: string): Sql {
  const create = [
    `CREATE TRIGGER ${INCOMING_TRIGGER} BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON %I.%I FOR EACH STATEMENT`,
    `WHEN (current_setting(%L, true) IS DISTINCT FROM 'on' AND current_setting(%L, true) IS DISTINCT FROM 'on')`,
    `EXECUTE FUNCTION %I.%I(%L, %L)`,
  ].join(' ');
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
    sql`CREATE OR REPLACE FUNCTION ${guardTablesName(moveId)}(guarded_schema text, guarded_shard int, holder_host text) RETURNS int`,
    sql`LANGUAGE plpgsql AS $tables$`,
    sql`DECLARE`,
    sql`  r record;`,
    sql`  made int := 0;`,
    sql`BEGIN`,
    sql`  IF NOT EXISTS (SELECT FROM ${CONTROL}.shards s WHERE s.shard = guarded_shard AND s.state = 'incoming') THEN`,
    sql`    RETURN 0;`,
    sql`  END IF;`,
    // The schema's tables by their dependency on it (pg_depend's index): pg_class has no index by
    // schema, and a scan of it grows with every shard of the host.
    sql`  FOR r IN SELECT c.relname FROM pg_catalog.pg_depend d JOIN pg_catalog.pg_class c ON c.oid = d.objid`,
    sql`             WHERE d.refclassid = 'pg_catalog.pg_namespace'::pg_catalog.regclass`,
    sql`               AND d.refobjid = pg_catalog.to_regnamespace(pg_catalog.quote_ident(guarded_schema))`,
    sql`               AND d.classid = 'pg_catalog.pg_class'::pg_catalog.regclass AND d.objsubid = 0 AND c.relkind IN ('r', 'p')`,
    sql`               AND NOT EXISTS (SELECT FROM pg_catalog.pg_trigger t WHERE t.tgrelid = c.oid AND t.tgname = ${lit(INCOMING_TRIGGER)})`,
    sql`             ORDER BY 1 LOOP`,
    sql`    EXECUTE pg_catalog.format(${lit(create)}, guarded_schema, r.relname, ${lit(COPYING_SETTING)}, ${lit(BUILDING_SETTING)}, ${lit(CONTROL_SCHEMA)}, ${lit(incomingGuardName(moveId))}, guarded_shard, holder_host);`,
    sql`    made := made + 1;`,
    sql`  END LOOP;`,
    sql`  RETURN made;`,
    sql`END`,
    sql`$tables$;`,
    sql`REVOKE ALL ON FUNCTION ${guardTablesName(moveId)}(text, int, text) FROM PUBLIC;`,
  ]);
}

/** The move's function that gives a shard's tables their guard (incomingGuardFunctionSql). */
function guardTablesName(moveId: string): Sql {
  return sql`${CONTROL}.${ident(`${incomingGuardName(moveId)}_tables`)}`;
}

/**
 * The guard's trigger on every table (partitioned parents and partitions) of these shards' copies
 * that lacks it, for those incoming here (their control rows say so), naming `holder`. One
 * statement, no transaction of its own: appended to a migration's transaction, or sent alone.
 */
export function incomingGuardsSql(
  moveId: string,
  shards: readonly { readonly shard: number; readonly schema: string }[],
  holder: string,
): Sql {
  const schemas = list(shards.map(({ schema }) => lit(schema)));
  const numbers = list(shards.map(({ shard }) => int(shard, 'a shard number')));
  return sql`SELECT ${guardTablesName(moveId)}(s.schema_name, s.shard, ${lit(holder)}) FROM unnest(ARRAY[${schemas}]::text[], ARRAY[${numbers}]::int[]) AS s(schema_name, shard);`;
}

/** A name or value written into a DO block's body: never one that could end its quoting. */
function inBody(value: string): Sql {
  if (value.includes('$')) throw new Error(`incoming guard: ${JSON.stringify(value)} contains "$"`);
  return lit(value);
}

/**
 * The guard's triggers on `schemas` dropped, each only if its table is free at once (lock_timeout
 * 1 ms) and the move's role may (it owns the table, or is a member of its owner's role): one kept
 * lets every write through now that the shard is active, and gc drops it later. One transaction;
 * none of these fails it.
 */
export function dropIncomingGuardsSql(schemas: readonly string[]): Sql {
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
    sql`    EXCEPTION WHEN lock_not_available OR insufficient_privilege THEN NULL;`,
    sql`    END;`,
    sql`  END LOOP;`,
    sql`END`,
    sql`$incoming$;`,
    sql`COMMIT;`,
  ]);
}

/** Shards' schemas per round trip of dropIncomingGuards. */
const DROP_GUARDS_SCHEMAS = 256;

/**
 * dropIncomingGuardsSql for `schemas`, a round trip per DROP_GUARDS_SCHEMAS of them; then the move's
 * functions that no trigger calls any more (dropUnusedFenceGuardsSql: the guard's, once no table
 * kept its trigger, and the one that made them), unless the move's role may not drop them.
 */
export async function dropIncomingGuards(client: pg.Client, moveId: string, schemas: readonly string[]): Promise<void> {
  for (let i = 0; i < schemas.length; i += DROP_GUARDS_SCHEMAS)
    await client.query(dropIncomingGuardsSql(schemas.slice(i, i + DROP_GUARDS_SCHEMAS)));
  await client.query(dropUnusedFenceGuardsSql({ moveId })).catch((error: unknown) => {
    if ((error as { code?: unknown }).code !== INSUFFICIENT_PRIVILEGE) throw error;
  });
}
