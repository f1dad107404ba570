import { lit, sql, type Sql } from '../../pg/sql-template.js';
import { CONTROL } from '../../fleet/control.js';

/**
 * What preflight reads of both hosts: shard states, replication settings, migration checksums,
 * roles.
 */

/** Shards $1 with schemas $2: whether each schema exists, and its control state. */
export const SOURCE_SHARD_STATES_SQL = sql`SELECT s.shard, to_regnamespace(s.schema) IS NOT NULL AS exists, (SELECT state FROM ${CONTROL}.shards c WHERE c.shard = s.shard) AS state
       FROM unnest($1::int[], $2::text[]) AS s(shard, schema)`;

/**
 * Shards $1 with schemas $2 on the target: whether each schema exists, and its control state
 * (none where the target has no control schema yet: `initialised` false).
 */
export function targetShardStatesSql(initialised: boolean): Sql {
  return sql`SELECT s.shard, to_regnamespace(s.schema) IS NOT NULL AS exists,
            ${initialised ? sql`(SELECT state FROM ${CONTROL}.shards c WHERE c.shard = s.shard)` : sql`NULL::text`} AS state
       FROM unnest($1::int[], $2::text[]) AS s(shard, schema)`;
}

/**
 * The connecting role, its database, and whether it may create schemas there (the target's copies)
 * and publications (an online move's on the source): the CREATE privilege on the database.
 */
export const DATABASE_RIGHTS_SQL = sql`SELECT current_user AS role, current_database() AS database,
              has_database_privilege(current_database(), 'CREATE') AS can_create`;

/**
 * Whether the current role may take the copy's replica role (BEGIN_COPY_SQL): a superuser, or from
 * PostgreSQL 15 on a role granted SET on session_replication_role.
 */
export function replicaRoleSql(serverVersionNum: number): Sql {
  return serverVersionNum >= 150000
    ? sql`SELECT current_user AS role, (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)
              OR has_parameter_privilege('session_replication_role', 'SET') AS may`
    : sql`SELECT current_user AS role, (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) AS may`;
}

/**
 * What the replica role skips on schemas $1's tables: the triggers that fire on an ordinary write
 * (enabled, not replica-only or always), but for shardctl's own and the internal ones, and the
 * foreign keys from one table to another (whose check depends on the order the tables are copied
 * in; one to the same table is checked once its COPY is whole). Qualified table, and `trigger NAME`
 * or `foreign key NAME`.
 */
export const REPLICA_ROLE_SKIPS_SQL = sql`SELECT format('%I.%I', n.nspname, c.relname) AS table_name, 'trigger ' || t.tgname AS what
       FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace
      WHERE n.nspname = ANY($1::text[]) AND NOT t.tgisinternal AND t.tgenabled = 'O'
        AND t.tgname NOT LIKE 'shardctl\_%'
     UNION ALL
     SELECT format('%I.%I', n.nspname, c.relname), 'foreign key ' || k.conname
       FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid JOIN pg_namespace n ON n.oid = c.relnamespace
      WHERE n.nspname = ANY($1::text[]) AND k.contype = 'f' AND k.confrelid <> k.conrelid AND k.conparentid = 0
      ORDER BY 1, 2`;

/** wal_level, and the free replication slots and WAL senders. */
export const REPLICATION_SETTINGS_SQL = sql`SELECT current_setting('wal_level') AS wal_level,
              current_setting('max_replication_slots')::int - (SELECT count(*) FROM pg_replication_slots)::int AS free_slots,
              current_setting('max_wal_senders')::int - (SELECT count(*) FROM pg_stat_replication)::int AS free_senders`;

/**
 * The bytes of the schemas' tables and indexes from the catalog's page counts (relpages, as of the
 * last VACUUM or ANALYZE): no stat call per file, so a batch of thousands of shards reads it at once.
 */
export const CATALOG_BYTES_SQL = sql`SELECT (coalesce(sum(c.relpages), 0) * current_setting('block_size')::bigint)::text AS bytes
       FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
      WHERE n.nspname = ANY($1::text[]) AND c.relkind IN ('r', 'i', 'm')`;

/** The source's bounds on the WAL a slot may hold, in MB (-1: none). */
export const WAL_LIMITS_SQL = sql`SELECT (SELECT setting FROM pg_settings WHERE name = 'max_slot_wal_keep_size') AS max_slot_wal_keep_size_mb,
              (SELECT setting FROM pg_settings WHERE name = 'wal_keep_size') AS wal_keep_size_mb`;

/** The migrations applied to shards $1, with their checksums. */
export const APPLIED_CHECKSUMS_SQL = sql`SELECT shard, version, checksum FROM ${CONTROL}.migrations WHERE shard = ANY($1) ORDER BY shard, version`;

/** From PostgreSQL 16 on, giving an object to a role needs a membership that may SET ROLE to it. */
export function ownerNeedsSet(serverVersionNum: number): boolean {
  return serverVersionNum >= 160000;
}

/**
 * Roles $1 that exist, and whether the current role may give objects to each: on PostgreSQL 16 and
 * later it must be able to SET ROLE to it (a membership granted WITH SET FALSE is not enough), before
 * that be a member (superusers may always).
 */
export function rolesSql(serverVersionNum: number): Sql {
  const may = ownerNeedsSet(serverVersionNum) ? 'SET' : 'MEMBER';
  return sql`SELECT r.rolname, pg_has_role(r.oid, ${lit(may)}) AS member FROM pg_roles r WHERE r.rolname = ANY($1::text[])`;
}
