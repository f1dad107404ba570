import { EMPTY, fromCatalog, ident, list, sql, type Sql } from '../pg/sql-template.js';
import { qualified } from './sql/names.js';

/**
 * ACL planning for a move: the statements that give the target's copy of a shard schema the
 * source's owners, ACLs and default privileges, computed from both catalogs. Plans statements;
 * runs none.
 */

/** One entry of an ACL, by role name. */
export interface AclEntry {
  /** Null: PUBLIC. */
  readonly grantee: string | null;
  readonly grantor: string;
  readonly privilege: string;
  readonly grantable: boolean;
}

export type PrivilegeKind =
  | 'schema'
  | 'type'
  | 'table'
  | 'foreign table'
  | 'sequence'
  | 'view'
  | 'materialized view'
  | 'routine'
  | 'column'
  | 'default';

/**
 * An object of a shard schema with its owner and ACL, as read by shardPrivileges (verify.ts), or a
 * pg_default_acl row of the schema ('default': `name` is the object type letter, `owner` the role
 * whose new objects it applies to).
 */
export interface PrivilegeObject {
  readonly kind: PrivilegeKind;
  readonly schema: string;
  /** The relation or routine; a column's table; null for the schema. */
  readonly name: string | null;
  /** A routine's identity arguments (pg_get_function_identity_arguments). */
  readonly args: string | null;
  readonly column: string | null;
  /** Null for a column. */
  readonly owner: string | null;
  /** A sequence owned by a table column: its owner follows the table's and cannot be set alone. */
  readonly linked: boolean;
  /** The effective ACL (the default one where the catalog holds none). */
  readonly acl: readonly AclEntry[];
}

const PRIVILEGES: ReadonlyMap<string, Sql> = new Map(
  [
    sql`SELECT`,
    sql`INSERT`,
    sql`UPDATE`,
    sql`DELETE`,
    sql`TRUNCATE`,
    sql`REFERENCES`,
    sql`TRIGGER`,
    sql`EXECUTE`,
    sql`USAGE`,
    sql`CREATE`,
    sql`MAINTAIN`,
  ].map((p) => [p, p]),
);

/** A privilege's keyword, as the catalog names it (aclexplode): one of those GRANT takes, or an error. */
export function privilege(name: string): Sql {
  const keyword = PRIVILEGES.get(name);
  if (keyword === undefined) throw new Error(`unknown privilege ${JSON.stringify(name)}`);
  return keyword;
}

const DEFAULT_OBJECT_TYPES: Record<string, Sql> = {
  r: sql`TABLES`,
  S: sql`SEQUENCES`,
  f: sql`FUNCTIONS`,
  T: sql`TYPES`,
};

const KIND_ORDER: readonly PrivilegeKind[] = [
  'schema',
  'type',
  'table',
  'foreign table',
  'sequence',
  'view',
  'materialized view',
  'routine',
  'column',
  'default',
];

/** Privileges that exist on only one side of a move (by server version), which syncPrivilegesSql leaves alone. */
export interface PrivilegeVersions {
  readonly sourceOnly: ReadonlySet<string>;
  readonly targetOnly: ReadonlySet<string>;
}

/** MAINTAIN exists from PostgreSQL 17 (and is in the owner's default ACL there). */
export function privilegeVersions(sourceVersionNum: number, targetVersionNum: number): PrivilegeVersions {
  const maintain = (v: number): boolean => v >= 170000;
  return {
    sourceOnly: new Set(maintain(sourceVersionNum) && !maintain(targetVersionNum) ? ['MAINTAIN'] : []),
    targetOnly: new Set(maintain(targetVersionNum) && !maintain(sourceVersionNum) ? ['MAINTAIN'] : []),
  };
}

/** The roles a shard's objects name: owners, grantees, grantors, roles with default privileges. */
export function rolesNamed(objects: readonly PrivilegeObject[]): { all: string[]; owners: string[] } {
  const all = new Set<string>();
  const owners = new Set<string>();
  for (const o of objects) {
    if (o.owner !== null) {
      all.add(o.owner);
      owners.add(o.owner);
    }
    for (const a of o.acl) {
      if (a.grantee !== null) all.add(a.grantee);
      all.add(a.grantor);
    }
  }
  return { all: [...all].sort(), owners: [...owners].sort() };
}

/**
 * A guarded copy's objects as the move first gives them (targets.ts): the schema's ACL kept to its
 * owner's own entries, everything else as the source has it. No other role can use the schema, so
 * a client on an old map that reads the copy as an application role finds none of its tables
 * (42P01, 42501) instead of a copy still being filled, and follows the shard (router/follow.ts).
 * The switch gives the schema the source's ACL in the transaction that makes the copy active
 * (switch.ts). The move's role has the owner's rights (preflight-roles.ts), the schema's owner and
 * a superuser bypass the withholding: for them only writes are refused (the guard's triggers).
 */
export function withheldSchemaAcl(objects: readonly PrivilegeObject[]): PrivilegeObject[] {
  return objects.map((o) =>
    o.kind === 'schema' ? { ...o, acl: o.acl.filter((e) => e.grantee !== null && e.grantee === o.owner) } : o,
  );
}

/**
 * The statements that give the target's copy of one shard schema the source's owners, ACLs and
 * default privileges, computed from both catalogs (nothing for what is already equal). An object
 * whose ACL differs has every privilege revoked (from every role the target's ACL names, and
 * PUBLIC) and the source's granted again, so privileges a migration granted and the source revoked
 * by hand are gone too. Grants are made by the owner (as the server records a superuser's or a
 * member's grant), so an entry the source got from another grantor comes back granted by the owner.
 * Objects the source has and the target lacks are not the migrations' and are left alone.
 */
export function syncPrivilegesSql(
  source: readonly PrivilegeObject[],
  target: readonly PrivilegeObject[],
  versions: PrivilegeVersions = { sourceOnly: new Set(), targetOnly: new Set() },
): Sql[] {
  // A privilege only one side's server has: the target keeps its own entries of one only it has
  // (MAINTAIN moving from 16 to 17: the owner keeps it), and is not given one it lacks.
  const wantedFrom = (s: readonly AclEntry[], current: readonly AclEntry[]): AclEntry[] => [
    ...s.filter((e) => !versions.sourceOnly.has(e.privilege)),
    ...current.filter((e) => versions.targetOnly.has(e.privilege)),
  ];
  const onTarget = new Map(target.map((o) => [privilegeKey(o), o]));
  const ordered = [...source].sort((a, b) => KIND_ORDER.indexOf(a.kind) - KIND_ORDER.indexOf(b.kind));
  const statements: Sql[] = [];
  const revokedTables = new Set<string>();
  for (const s of ordered) {
    if (s.kind === 'default') continue;
    // A column without an ACL of its own is not read: on the target that is an empty one.
    const t = onTarget.get(privilegeKey(s)) ?? (s.kind === 'column' ? { ...s, acl: [] } : undefined);
    if (!t) continue;
    let current = t.acl;
    if (s.owner !== null && t.owner !== null && s.owner !== t.owner) {
      if (!s.linked) statements.push(sql`ALTER ${ALTER_KEYWORD[s.kind]} ${objectName(s)} OWNER TO ${ident(s.owner)};`);
      // ALTER … OWNER TO moves the old owner's entries to the new owner, as grantee and as grantor.
      const from = t.owner;
      const to = s.owner;
      current = current.map((a) => ({
        ...a,
        grantee: a.grantee === from ? to : a.grantee,
        grantor: a.grantor === from ? to : a.grantor,
      }));
    }
    const tableRevoked = s.kind === 'column' && revokedTables.has(qualified(s.schema, s.name!));
    const wanted = wantedFrom(s.acl, current);
    if (!sameAcl(wanted, current) || (tableRevoked && wanted.length > 0)) {
      statements.push(
        ...replaceAclSql(GRANT_TARGET[s.kind](s), current, wanted, s.kind === 'column' ? s.column : null),
      );
      if (s.kind === 'table' || s.kind === 'foreign table' || s.kind === 'view' || s.kind === 'materialized view')
        revokedTables.add(qualified(s.schema, s.name!));
    }
  }
  // Column privileges the target has and the source does not (a migration's, revoked by hand).
  const onSource = new Set(source.map(privilegeKey));
  for (const t of target) {
    if (t.kind === 'column' && t.acl.length > 0 && !onSource.has(privilegeKey(t)))
      statements.push(...replaceAclSql(GRANT_TARGET.column(t), t.acl, [], t.column));
  }
  // Default privileges: every (role, object type) either side has.
  const defaults = new Map<string, { s?: PrivilegeObject; t?: PrivilegeObject }>();
  for (const [side, list] of [
    ['s', source],
    ['t', target],
  ] as const) {
    for (const o of list) {
      if (o.kind !== 'default') continue;
      const key = privilegeKey(o);
      defaults.set(key, { ...defaults.get(key), [side]: o });
    }
  }
  for (const { s, t } of [...defaults.values()].sort((a, b) =>
    privilegeKey((a.s ?? a.t)!).localeCompare(privilegeKey((b.s ?? b.t)!)),
  )) {
    const o = (s ?? t)!;
    const wanted = wantedFrom(s?.acl ?? [], t?.acl ?? []);
    if (sameAcl(wanted, t?.acl ?? [])) continue;
    statements.push(...alterDefaultPrivilegesSql(o.schema, o.owner!, o.name!, t?.acl ?? [], wanted));
  }
  return statements;
}

function privilegeKey(o: PrivilegeObject): string {
  return JSON.stringify([o.kind, o.schema, o.name, o.args, o.column, o.kind === 'default' ? o.owner : null]);
}

function sameAcl(a: readonly AclEntry[], b: readonly AclEntry[]): boolean {
  const text = (acl: readonly AclEntry[]): string =>
    JSON.stringify(
      [...new Set(acl.map((e) => JSON.stringify([e.grantee, e.grantor, e.privilege, e.grantable])))].sort(),
    );
  return text(a) === text(b);
}

function objectName(o: PrivilegeObject): Sql {
  if (o.kind === 'schema') return ident(o.schema);
  // Identity arguments are the server's own rendering of the signature (names and types), as pg_get_indexdef is of an index.
  if (o.kind === 'routine') return sql`${qualified(o.schema, o.name!)}(${fromCatalog(o.args ?? '')})`;
  return qualified(o.schema, o.name!);
}

const ALTER_KEYWORD: Record<PrivilegeKind, Sql> = {
  schema: sql`SCHEMA`,
  type: sql`TYPE`,
  table: sql`TABLE`,
  'foreign table': sql`FOREIGN TABLE`,
  sequence: sql`SEQUENCE`,
  view: sql`VIEW`,
  'materialized view': sql`MATERIALIZED VIEW`,
  routine: sql`ROUTINE`,
  column: sql`TABLE`,
  default: EMPTY,
};

const GRANT_TARGET: Record<PrivilegeKind, (o: PrivilegeObject) => Sql> = {
  schema: (o) => sql`SCHEMA ${objectName(o)}`,
  type: (o) => sql`TYPE ${objectName(o)}`,
  table: (o) => sql`TABLE ${objectName(o)}`,
  'foreign table': (o) => sql`TABLE ${objectName(o)}`,
  sequence: (o) => sql`SEQUENCE ${objectName(o)}`,
  view: (o) => sql`TABLE ${objectName(o)}`,
  'materialized view': (o) => sql`TABLE ${objectName(o)}`,
  routine: (o) => sql`ROUTINE ${objectName(o)}`,
  column: (o) => sql`TABLE ${objectName(o)}`,
  default: () => EMPTY,
};

function grantee(name: string | null): Sql {
  return name === null ? sql`PUBLIC` : ident(name);
}

function privilegeList(entries: readonly AclEntry[], column: string | null): Sql {
  const names = [...new Set(entries.map((e) => e.privilege))].sort();
  return list(names.map((p) => (column === null ? privilege(p) : sql`${privilege(p)} (${ident(column)})`)));
}

/** Grants grouped by grantee and grant option: GRANT a, b ON … TO r [WITH GRANT OPTION]. */
function grantGroups(acl: readonly AclEntry[]): { grantee: string | null; grantable: boolean; entries: AclEntry[] }[] {
  const groups = new Map<string, { grantee: string | null; grantable: boolean; entries: AclEntry[] }>();
  for (const e of acl) {
    const key = JSON.stringify([e.grantee, e.grantable]);
    if (!groups.has(key)) groups.set(key, { grantee: e.grantee, grantable: e.grantable, entries: [] });
    groups.get(key)!.entries.push(e);
  }
  return [...groups.values()].sort((a, b) =>
    JSON.stringify([a.grantee, a.grantable]).localeCompare(JSON.stringify([b.grantee, b.grantable])),
  );
}

function revokedFrom(current: readonly AclEntry[]): Sql {
  const names = [...new Set(current.map((e) => e.grantee).filter((g): g is string => g !== null))].sort();
  return list([sql`PUBLIC`, ...names.map((name) => ident(name))]);
}

/** REVOKE ALL from every role the target's ACL names and PUBLIC, then the source's grants (column ones when `column`). */
export function replaceAclSql(
  on: Sql,
  current: readonly AclEntry[],
  wanted: readonly AclEntry[],
  column: string | null = null,
): Sql[] {
  const all = column === null ? sql`ALL` : sql`ALL (${ident(column)})`;
  return [
    sql`REVOKE ${all} ON ${on} FROM ${revokedFrom(current)} CASCADE;`,
    ...grantGroups(wanted).map(
      (g) =>
        sql`GRANT ${privilegeList(g.entries, column)} ON ${on} TO ${grantee(g.grantee)}${g.grantable ? sql` WITH GRANT OPTION` : EMPTY};`,
    ),
  ];
}

/** One pg_default_acl row of a schema made equal to the source's: everything revoked, then granted again. */
export function alterDefaultPrivilegesSql(
  schema: string,
  role: string,
  objectType: string,
  current: readonly AclEntry[],
  wanted: readonly AclEntry[],
): Sql[] {
  const on = DEFAULT_OBJECT_TYPES[objectType];
  if (on === undefined) throw new Error(`unknown default privilege object type ${JSON.stringify(objectType)}`);
  const prefix = sql`ALTER DEFAULT PRIVILEGES FOR ROLE ${ident(role)} IN SCHEMA ${ident(schema)}`;
  return [
    sql`${prefix} REVOKE ALL ON ${on} FROM ${revokedFrom(current)} CASCADE;`,
    ...grantGroups(wanted).map(
      (g) =>
        sql`${prefix} GRANT ${privilegeList(g.entries, null)} ON ${on} TO ${grantee(g.grantee)}${g.grantable ? sql` WITH GRANT OPTION` : EMPTY};`,
    ),
  ];
}
