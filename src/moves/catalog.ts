import type pg from 'pg';
import { type AclEntry, type PrivilegeKind, type PrivilegeObject } from './privileges.js';
import { type KeyedTableName, type TableName, type TriggerName } from './sql/names.js';

/**
 * The catalog reads of a move: what a shard schema holds (its tables, keys, grants, sequences,
 * views, indexes, triggers), read from pg_catalog on one host. The statements a move sends to
 * change anything are in sql/; what the engine makes of these reads is in the step that asks.
 */

/** A table of a shard schema. */
export interface ShardTable extends TableName {
  /**
   * Every column's type is built in (not user-defined, not a domain, array or composite of one) and
   * not an OID alias (regclass, regtype, ...). Only such tables travel in binary COPY and binary
   * replication (whose array and record formats carry type OIDs that differ between hosts, and whose
   * reg* values are raw OIDs), and only they are checksummed with hash_record_extended (which hashes
   * an enum by its OID).
   */
  readonly portable: boolean;
  /** A partition's partitioned parent (its name in the same schema). */
  readonly parent?: string;
}

/** A table with the types of its columns, as format_type names them without a modifier (shardTables' `columnTypes`). */
export interface TypedShardTable extends ShardTable {
  readonly columnTypes: readonly string[];
  /**
   * A column has a nondeterministic collation (case- or accent-insensitive): its type's hash
   * function hashes values that compare equal alike, so 'Abc' and 'abc' would pass a record-hash
   * checksum as the same row.
   */
  readonly nondeterministic: boolean;
}

const REG_TYPES = `'regclass', 'regtype', 'regproc', 'regprocedure', 'regoper', 'regoperator', 'regconfig', 'regdictionary', 'regnamespace', 'regrole', 'regcollation'`;

/**
 * The tables of these schemas, by schema and name.
 * - 'top': tables and partitioned parents, not partitions.
 * - 'all': every table including partitions: the fence needs a trigger on each, since a statement
 *   trigger on a parent does not fire for a write sent to a partition directly.
 * - 'leaves': tables that hold rows (plain tables and partitions): the unit of COPY and of
 *   verification (a partition is verified like a table, by its own key or log).
 */
export async function shardTables(
  client: pg.Client,
  schemas: string | readonly string[],
  which?: 'top' | 'all' | 'leaves',
): Promise<ShardTable[]>;
export async function shardTables(
  client: pg.Client,
  schemas: string | readonly string[],
  which: 'top' | 'all' | 'leaves',
  options: { columnTypes: true },
): Promise<TypedShardTable[]>;
export async function shardTables(
  client: pg.Client,
  schemas: string | readonly string[],
  which: 'top' | 'all' | 'leaves' = 'top',
  options: { columnTypes?: boolean } = {},
): Promise<ShardTable[]> {
  const filter = {
    top: `c.relkind IN ('r', 'p') AND NOT c.relispartition`,
    all: `c.relkind IN ('r', 'p')`,
    leaves: `c.relkind = 'r'`,
  }[which];
  const types = options.columnTypes
    ? `, coalesce(array_agg(DISTINCT format_type(a.atttypid, NULL)) FILTER (WHERE a.attnum IS NOT NULL), '{}') AS types,
              coalesce(bool_or(NOT co.collisdeterministic), false) AS nondeterministic`
    : '';
  const collations = options.columnTypes ? 'LEFT JOIN pg_collation co ON co.oid = a.attcollation' : '';
  const result = await client.query<{
    nspname: string;
    relname: string;
    parent: string | null;
    portable: boolean;
    types?: string[];
    nondeterministic?: boolean;
  }>(
    `SELECT n.nspname, c.relname, p.relname AS parent,
            coalesce(bool_and(t.oid < 16384 AND (e.oid IS NULL OR e.oid < 16384)
                              AND NOT t.typname IN (${REG_TYPES}) AND NOT coalesce(e.typname IN (${REG_TYPES}), false)), true) AS portable${types}
       FROM pg_class c
       JOIN pg_namespace n ON n.oid = c.relnamespace
       LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
       LEFT JOIN pg_type t ON t.oid = a.atttypid
       LEFT JOIN pg_type e ON e.oid = t.typelem AND t.typcategory = 'A'
       ${collations}
       LEFT JOIN pg_inherits i ON i.inhrelid = c.oid AND c.relispartition
       LEFT JOIN pg_class p ON p.oid = i.inhparent
      WHERE n.nspname = ANY($1::text[]) AND ${filter}
      GROUP BY n.nspname, c.relname, p.relname
      ORDER BY n.nspname, c.relname`,
    [typeof schemas === 'string' ? [schemas] : schemas],
  );
  return result.rows.map((r) => ({
    schema: r.nspname,
    table: r.relname,
    portable: r.portable,
    ...(r.parent === null ? {} : { parent: r.parent }),
    ...(r.types === undefined ? {} : { columnTypes: r.types, nondeterministic: r.nondeterministic ?? false }),
  }));
}

/** A table that holds rows (a plain table or a partition), and whether its heap has no page at all. */
export interface LeafTable extends TableName {
  readonly oid: number;
  readonly parent?: string;
  /** pg_relation_size() is 0: not a row in it, visible or not (any insert extends the heap first). */
  readonly empty: boolean;
}

/**
 * The tables of these schemas that hold rows, with their emptiness: a lighter read than
 * shardTables (no column types), for what runs while a wave is fenced.
 */
export async function shardLeaves(client: pg.Client, schemas: readonly string[]): Promise<LeafTable[]> {
  const result = await client.query<{
    oid: number;
    nspname: string;
    relname: string;
    parent: string | null;
    empty: boolean;
  }>(
    `SELECT c.oid, n.nspname, c.relname, p.relname AS parent, pg_relation_size(c.oid) = 0 AS empty
       FROM pg_class c
       JOIN pg_namespace n ON n.oid = c.relnamespace
       LEFT JOIN pg_inherits i ON i.inhrelid = c.oid AND c.relispartition
       LEFT JOIN pg_class p ON p.oid = i.inhparent
      WHERE n.nspname = ANY($1::text[]) AND c.relkind = 'r'
      ORDER BY n.nspname, c.relname`,
    [schemas],
  );
  return result.rows.map((r) => ({
    oid: r.oid,
    schema: r.nspname,
    table: r.relname,
    empty: r.empty,
    ...(r.parent === null ? {} : { parent: r.parent }),
  }));
}

/**
 * The tables of `leaves` (read by shardLeaves before) as they are now, by OID: an index lookup each,
 * where shardLeaves scans the catalog. A table dropped since is left out.
 */
export async function leavesNow(client: pg.Client, leaves: readonly LeafTable[]): Promise<LeafTable[]> {
  const result = await client.query<{ i: number; empty: boolean | null }>(LEAF_SIZES_SQL, [leaves.map((t) => t.oid)]);
  return result.rows.flatMap((r) => (r.empty === null ? [] : [{ ...leaves[r.i - 1]!, empty: r.empty }]));
}

/** Whether each relation $1 (oid[]) has no page, by position (NULL where it no longer exists). */
const LEAF_SIZES_SQL = `SELECT s.i::int AS i, pg_relation_size(s.o) = 0 AS empty FROM unnest($1::oid[]) WITH ORDINALITY AS s(o, i) ORDER BY s.i`;

/**
 * Owners and ACLs of these schemas and of everything a move carries in them (tables and partitions,
 * sequences, views, materialized views, functions and procedures, columns with an ACL of their own),
 * and the schemas' default privileges (pg_default_acl, of every role that may create in the schema), by name, in one query. An ACL the
 * catalog leaves NULL is read as the default it stands for (acldefault), so equal rights compare
 * equal however they were reached. `schemasOnly`: the schemas' own owners and ACLs, nothing in them
 * (what a guarded copy is given at its switch, switch.ts).
 */
export async function shardPrivileges(
  client: pg.Client,
  schemas: readonly string[],
  schemasOnly = false,
): Promise<PrivilegeObject[]> {
  const result = await client.query<{
    kind: PrivilegeKind;
    schema: string;
    name: string | null;
    args: string | null;
    col: string | null;
    owner: string | null;
    linked: boolean;
    grantee: string | null;
    grantor: string | null;
    privilege: string | null;
    grantable: boolean | null;
  }>(
    // The schemas are found by name once; pg_class is scanned once for both the relations and the
    // columns with an ACL (each looked up through pg_attribute's index, per relation), and pg_type
    // and pg_proc are filtered by the schemas' oids where they are scanned. On a host of 2,048
    // shards this is 12 ms for 8 schemas (21 ms joined by name throughout), 153 ms for 512 (257 ms).
    `WITH ns AS MATERIALIZED (SELECT n.oid, n.nspname, n.nspowner, n.nspacl FROM pg_namespace n WHERE n.nspname = ANY($1::text[])),
     ids AS (SELECT coalesce(array_agg(oid), '{}') AS oids FROM ns),
     rels AS MATERIALIZED (
       SELECT c.oid, n.nspname, c.relname, c.relkind, c.relowner, c.relacl
         FROM pg_class c JOIN ns n ON n.oid = c.relnamespace WHERE c.relkind IN ('r', 'p', 'S', 'v', 'm', 'f') AND NOT $2::boolean),
     objects AS (
       SELECT 'schema' AS kind, n.nspname AS schema, NULL::name AS name, NULL::text AS args, NULL::name AS col,
              n.nspowner AS owner, false AS linked, coalesce(n.nspacl, acldefault('n', n.nspowner)) AS acl
         FROM ns n
       UNION ALL
       SELECT CASE c.relkind WHEN 'S' THEN 'sequence' WHEN 'v' THEN 'view' WHEN 'm' THEN 'materialized view' WHEN 'f' THEN 'foreign table' ELSE 'table' END,
              c.nspname, c.relname, NULL, NULL, c.relowner,
              c.relkind = 'S' AND EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid
                                            AND d.refclassid = 'pg_class'::regclass AND d.deptype IN ('a', 'i')),
              coalesce(c.relacl, acldefault(CASE c.relkind WHEN 'S' THEN 's' ELSE 'r' END::"char", c.relowner))
         FROM rels c
       UNION ALL
       SELECT 'column', c.nspname, c.relname, NULL, a.attname, NULL, false, a.attacl
         FROM rels c
              CROSS JOIN LATERAL (SELECT a.attname, a.attacl FROM pg_attribute a
                                   WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped AND a.attacl IS NOT NULL OFFSET 0) a
        WHERE c.relkind IN ('r', 'p', 'v', 'm', 'f')
       UNION ALL
       -- Types of their own: domains, enums, ranges, composite and base types (not a table's row
       -- type, an array type or a range's multirange, whose owners follow their own objects').
       SELECT 'type', n.nspname, t.typname, NULL, NULL, t.typowner, false, coalesce(t.typacl, acldefault('T', t.typowner))
         FROM pg_type t JOIN ns n ON n.oid = t.typnamespace
        WHERE t.typnamespace = ANY((SELECT oids FROM ids)::oid[]) AND t.typtype IN ('b', 'c', 'd', 'e', 'r') AND NOT $2::boolean
          AND (t.typrelid = 0 OR (SELECT c.relkind FROM pg_class c WHERE c.oid = t.typrelid) = 'c')
          AND NOT EXISTS (SELECT 1 FROM pg_type e WHERE e.oid = t.typelem AND e.typarray = t.oid)
       UNION ALL
       SELECT 'routine', n.nspname, p.proname, pg_get_function_identity_arguments(p.oid), NULL, p.proowner, false,
              coalesce(p.proacl, acldefault('f', p.proowner))
         FROM pg_proc p JOIN ns n ON n.oid = p.pronamespace
        WHERE p.pronamespace = ANY((SELECT oids FROM ids)::oid[]) AND NOT $2::boolean
          AND (p.prokind IN ('f', 'p', 'w')
               -- Aggregates but ordered-set ones, whose signature ALTER ROUTINE does not take as printed.
               OR (p.prokind = 'a' AND EXISTS (SELECT 1 FROM pg_aggregate g WHERE g.aggfnoid = p.oid AND g.aggkind = 'n')))
       UNION ALL
       -- Only a role that may create in the schema: any role may record default privileges for
       -- itself in any schema (ALTER DEFAULT PRIVILEGES needs no right on it), where they never apply,
       -- and carrying them would make every such role an owner the move refuses without.
       SELECT 'default', n.nspname, d.defaclobjtype::text, NULL, NULL, d.defaclrole, false, d.defaclacl
         FROM pg_default_acl d JOIN ns n ON n.oid = d.defaclnamespace
        WHERE has_schema_privilege(d.defaclrole, n.oid, 'CREATE') AND NOT $2::boolean
     )
     SELECT o.kind, o.schema, o.name, o.args, o.col, ow.rolname AS owner, o.linked,
            ge.rolname AS grantee, gr.rolname AS grantor, a.privilege_type AS privilege, a.is_grantable AS grantable
       FROM objects o
       LEFT JOIN pg_roles ow ON ow.oid = o.owner
       LEFT JOIN LATERAL aclexplode(o.acl) a ON true
       LEFT JOIN pg_roles ge ON ge.oid = a.grantee
       LEFT JOIN pg_roles gr ON gr.oid = a.grantor
      ORDER BY o.schema, o.kind, o.name, o.args, o.col, ge.rolname NULLS FIRST, a.privilege_type`,
    [schemas, schemasOnly],
  );
  const objects = new Map<string, PrivilegeObject & { acl: AclEntry[] }>();
  for (const r of result.rows) {
    const key = JSON.stringify([r.kind, r.schema, r.name, r.args, r.col, r.kind === 'default' ? r.owner : null]);
    let o = objects.get(key);
    if (!o) {
      o = {
        kind: r.kind,
        schema: r.schema,
        name: r.name,
        args: r.args,
        column: r.col,
        owner: r.owner,
        linked: r.linked,
        acl: [],
      };
      objects.set(key, o);
    }
    if (r.privilege !== null)
      o.acl.push({ grantee: r.grantee, grantor: r.grantor!, privilege: r.privilege, grantable: r.grantable === true });
  }
  return [...objects.values()];
}

/** A table whose tail can be verified by key: its replica-identity key columns and their types. */
export interface KeyedTable extends KeyedTableName {
  readonly table: ShardTable;
}

/**
 * Key types whose JSON form (to_jsonb) reads back to the same value (jsonb_to_recordset): the
 * lookup must find exactly the row that was recorded.
 */
export const EXACT_KEY_TYPES = [
  'int2',
  'int4',
  'int8',
  'numeric',
  'text',
  'varchar',
  'uuid',
  'bool',
  'date',
  'timestamp',
  'timestamptz',
  'bytea',
];

/** Tables holding rows (plain tables and partitions) of `schemas` with an exact-typed replica-identity key. */
export async function keyedTables(client: pg.Client, schemas: readonly string[]): Promise<KeyedTable[]> {
  const result = await client.query<{
    nspname: string;
    relname: string;
    columns: string[];
    types: string[];
    exact: boolean;
  }>(
    `SELECT n.nspname, c.relname, array_agg(a.attname::text ORDER BY k.ord) AS columns,
            array_agg(format_type(a.atttypid, a.atttypmod) ORDER BY k.ord) AS types,
            bool_and(t.oid < 16384 AND t.typname = ANY($2::text[])) AS exact
       FROM pg_class c
       JOIN pg_namespace n ON n.oid = c.relnamespace
       JOIN pg_index i ON i.indrelid = c.oid AND ((c.relreplident = 'd' AND i.indisprimary) OR (c.relreplident = 'i' AND i.indisreplident))
       CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, ord)
       JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = k.attnum
       JOIN pg_type t ON t.oid = a.atttypid
      WHERE n.nspname = ANY($1::text[]) AND c.relkind = 'r'
      GROUP BY n.nspname, c.relname
      ORDER BY n.nspname, c.relname`,
    [schemas, EXACT_KEY_TYPES],
  );
  return result.rows
    .filter((r) => r.exact)
    .map((r) => ({
      table: { schema: r.nspname, table: r.relname, portable: true },
      columns: r.columns,
      types: r.types,
    }));
}

/** Which of the schemas $1 exist. */
export const EXISTING_SCHEMAS_SQL = `SELECT nspname FROM pg_namespace WHERE nspname = ANY($1)`;

/**
 * The indexes of tables $1 (quoted names) with their tables and the constraints owning them (primary
 * key, unique, exclusion), qualified, and the definitions that build them again (RebuildableIndex,
 * sql/copy.ts); the conditions of each list follow.
 */
const INDEXES_OF_TABLES = `SELECT format('%I.%I', n.nspname, ic.relname) AS index_name, format('%I.%I', n.nspname, t.relname) AS table_name,
            c.conname, pg_get_indexdef(i.indexrelid) AS indexdef, CASE WHEN c.oid IS NOT NULL THEN pg_get_constraintdef(c.oid) END AS condef
       FROM pg_index i
       JOIN pg_class ic ON ic.oid = i.indexrelid
       JOIN pg_class t ON t.oid = i.indrelid
       JOIN pg_namespace n ON n.oid = t.relnamespace
       LEFT JOIN pg_constraint c ON c.conindid = i.indexrelid AND c.conrelid = i.indrelid AND c.contype IN ('p', 'u', 'x')
      WHERE t.oid = ANY($1::text[]::regclass[])`;

/** The indexes of tables $1 that can be dropped and built again exactly from their definition (see dropIndexesForCopy in copy.ts). */
export const REBUILDABLE_INDEXES_SQL = `${INDEXES_OF_TABLES}
        AND pg_has_role(t.relowner, 'USAGE')
        AND i.indisvalid AND i.indisready AND i.indislive AND NOT i.indisreplident AND NOT i.indisclustered
        AND ic.reltablespace = 0
        AND NOT EXISTS (SELECT 1 FROM pg_inherits h WHERE h.inhrelid = i.indexrelid)
        AND (c.oid IS NULL OR c.conparentid = 0)
        AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.refclassid = 'pg_class'::regclass AND d.refobjid = i.indexrelid)
        AND (c.oid IS NULL OR NOT EXISTS (
              SELECT 1 FROM pg_depend d WHERE d.refclassid = 'pg_constraint'::regclass AND d.refobjid = c.oid
                 AND NOT (d.classid = 'pg_class'::regclass AND d.objid = i.indexrelid)))
        AND NOT EXISTS (SELECT 1 FROM pg_description x
                         WHERE (x.classoid = 'pg_class'::regclass AND x.objoid = i.indexrelid) OR (x.classoid = 'pg_constraint'::regclass AND x.objoid = c.oid))
        AND NOT EXISTS (SELECT 1 FROM pg_seclabel x
                         WHERE (x.classoid = 'pg_class'::regclass AND x.objoid = i.indexrelid) OR (x.classoid = 'pg_constraint'::regclass AND x.objoid = c.oid))
        AND NOT EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = i.indexrelid AND a.attstattarget > 0)
      ORDER BY i.indexrelid`;

/**
 * The indexes of tables $1 (quoted names) that no parent index attaches (a partition's share of a
 * partitioned index), each with the constraint owning it (primary key, unique, exclusion) if any:
 * their qualified names and definitions, in their order of creation. Read on the source, what a
 * chunked copy builds on the target after its last chunk (table-copy.ts); read on the target, what
 * it has.
 */
export const TABLE_INDEXES_SQL = `${INDEXES_OF_TABLES}
        AND NOT EXISTS (SELECT 1 FROM pg_inherits h WHERE h.inhrelid = i.indexrelid)
      ORDER BY i.indexrelid`;

/**
 * The sequences of schemas $1 and their increments, from the catalogs alone: the pg_sequences view
 * opens each sequence, so a DDL statement holding one (or queued on it) would hold the list too.
 */
export const SHARD_SEQUENCES_SQL = `SELECT n.nspname AS schemaname, c.relname AS sequencename, s.seqincrement::text AS increment_by
  FROM pg_sequence s JOIN pg_class c ON c.oid = s.seqrelid JOIN pg_namespace n ON n.oid = c.relnamespace
  WHERE n.nspname = ANY($1) ORDER BY 1, 2`;

/** The materialized views of schemas $1. */
export const MATERIALIZED_VIEWS_SQL = `SELECT schemaname, matviewname FROM pg_matviews WHERE schemaname = ANY($1) ORDER BY 1, 2`;

/** Schema $1's grants to others than its owner. */
export const SCHEMA_GRANTS_SQL = `SELECT n.nspname, r.rolname AS grantee, a.privilege_type AS privilege FROM pg_namespace n, aclexplode(n.nspacl) a
       LEFT JOIN pg_roles r ON r.oid = a.grantee WHERE n.nspname = ANY($1::text[]) AND a.grantee <> n.nspowner`;

/** The grants on schema $1's tables to others than their owners. */
export const TABLE_GRANTS_SQL = `SELECT n.nspname, c.relname, r.rolname AS grantee, a.privilege_type AS privilege
       FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace, aclexplode(c.relacl) a
       LEFT JOIN pg_roles r ON r.oid = a.grantee
      WHERE n.nspname = ANY($1::text[]) AND c.relkind IN ('r', 'p') AND a.grantee <> c.relowner`;

/** The tables of schemas $1: whether each has a replica identity and is logged. */
export const REPLICA_IDENTITIES_SQL = `SELECT format('%s.%s', n.nspname, c.relname) AS name,
              NOT (c.relreplident = 'n' OR (c.relreplident = 'd' AND NOT EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary))) AS identity,
              c.relpersistence <> 'u' AS logged
         FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = ANY($1) AND c.relkind = 'r'
        ORDER BY 1`;

/** Catalog rows of several shard schemas grouped by schema, in their order. */
export function groupBySchema<T>(rows: readonly T[], schemaOf: (row: T) => string): Map<string, T[]> {
  const map = new Map<string, T[]>();
  for (const row of rows) {
    const list = map.get(schemaOf(row));
    if (list) list.push(row);
    else map.set(schemaOf(row), [row]);
  }
  return map;
}

/** The triggers named `names` on the tables of `schemas`, enabled or not, with the function each calls. */
export async function shardTriggers(
  client: pg.Client,
  schemas: readonly string[],
  names: readonly string[],
): Promise<(TriggerName & { readonly enabled: boolean; readonly calls: readonly [string, string] })[]> {
  const result = await client.query<{
    nspname: string;
    relname: string;
    tgname: string;
    enabled: boolean;
    fn_schema: string;
    fn: string;
  }>(
    `SELECT n.nspname, c.relname, t.tgname, t.tgenabled <> 'D' AS enabled, pn.nspname AS fn_schema, p.proname AS fn
       FROM pg_trigger t
       JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace
       JOIN pg_proc p ON p.oid = t.tgfoid JOIN pg_namespace pn ON pn.oid = p.pronamespace
      WHERE t.tgname = ANY($2::text[]) AND n.nspname = ANY($1::text[])`,
    [schemas, names],
  );
  return result.rows.map((r) => ({
    schema: r.nspname,
    table: r.relname,
    trigger: r.tgname,
    enabled: r.enabled,
    calls: [r.fn_schema, r.fn] as const,
  }));
}

/** Whether the relation `name` (qualified) exists. */
export async function relationExists(client: pg.Client, name: string): Promise<boolean> {
  return (await client.query<{ e: boolean }>(`SELECT to_regclass($1) IS NOT NULL AS e`, [name])).rows[0]!.e;
}
