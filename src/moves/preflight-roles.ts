import type pg from 'pg';
import { shardsPhrase } from '../config/ranges.js';
import { quoteIdent } from '../pg/quote.js';
import { inflect } from '../text.js';
import type { PreflightCheck } from './preflight-check.js';
import { rolesNamed, type PrivilegeObject } from './privileges.js';
import {
  DATABASE_RIGHTS_SQL,
  REPLICA_ROLE_SKIPS_SQL,
  ownerNeedsSet,
  replicaRoleSql,
  rolesSql,
} from './sql/preflight.js';
import { CURRENT_USER_SQL } from './sql/session.js';

/**
 * Roles are per cluster: every role the source's owners, ACLs and default privileges name must exist
 * on the target, and the connecting role there must be able to give objects to the owners (and set
 * default privileges for their roles): a superuser, or a member of each (on PostgreSQL 16 and later,
 * one that may SET ROLE to it).
 */
export async function roleChecks(
  objects: readonly PrivilegeObject[],
  dst: pg.Client,
  dstVersionNum: number,
  sourceName: string,
  targetName: string,
  shardOf: (schema: string) => number,
): Promise<PreflightCheck[]> {
  const { all, owners } = rolesNamed(objects);
  const [found, currentUser] = await Promise.all([
    dst.query<{ rolname: string; member: boolean }>(rolesSql(dstVersionNum), [all]),
    dst.query<{ current: string }>(CURRENT_USER_SQL),
  ]);
  const present = new Map(found.rows.map((r) => [r.rolname, r.member]));
  const shardsNaming = (role: string, asOwner: boolean): string => {
    const shards = [
      ...new Set(
        objects
          .filter((o) => o.owner === role || (!asOwner && o.acl.some((a) => a.grantee === role || a.grantor === role)))
          .map((o) => shardOf(o.schema)),
      ),
    ].sort((a, b) => a - b);
    return shardsPhrase(shards);
  };
  const missing = all.filter((role) => !present.has(role));
  const cannotGive = owners.filter((role) => present.get(role) === false);
  const current = currentUser.rows[0]!.current;
  const withSet = ownerNeedsSet(dstVersionNum);
  return [
    {
      name: 'roles on target',
      ok: missing.length === 0,
      message:
        missing.length === 0
          ? `every role the owners, grants and default privileges of the batch name exists on ${targetName}`
          : `${missing.map((role) => `role ${role} (named by ${shardsNaming(role, false)} on ${sourceName})`).join(', ')} ` +
            `${inflect(missing.length, 'does', 'do')} not exist on ${targetName}: roles are per cluster; create the ${inflect(missing.length, 'role')} on ${targetName} first`,
    },
    {
      name: 'owners on target',
      ok: cannotGive.length === 0,
      message:
        cannotGive.length === 0
          ? `${current} on ${targetName} can give the copies to their owners (${owners.join(', ') || 'none'})`
          : `${current} on ${targetName} is neither superuser nor a member of ${cannotGive.map((role) => `${role} (owner in ${shardsNaming(role, true)})`).join(', ')}${withSet ? ' with the SET option' : ''}, ` +
            `so it cannot give the copies to ${cannotGive.length === 1 ? 'that owner' : 'those owners'}; ` +
            `grant ${cannotGive.length === 1 ? 'it' : 'them'} to ${current} on ${targetName} (GRANT ${cannotGive.join(', ')} TO ${current}${withSet ? ' WITH SET TRUE' : ''}), or connect as a superuser`,
    },
  ];
}

/**
 * The connecting role may create in the database: schemas on the target (the copies, either mode)
 * and, for an online move, a publication on the source. An operator that is not a superuser (a
 * managed service has none) may lack it; without this check the move would stop at its first
 * CREATE, after the source was fenced or the slot made.
 */
export async function databaseChecks(
  online: boolean,
  src: pg.Client,
  dst: pg.Client,
  sourceName: string,
  targetName: string,
): Promise<PreflightCheck[]> {
  const read = async (client: pg.Client) =>
    (await client.query<{ role: string; database: string; can_create: boolean }>(DATABASE_RIGHTS_SQL)).rows[0]!;
  const [onSource, onTarget] = await Promise.all([read(src), read(dst)]);
  const check = (name: string, host: string, r: typeof onSource, what: string, orElse = ''): PreflightCheck => ({
    name,
    ok: r.can_create,
    message: r.can_create
      ? `${r.role} may create ${what} in database ${r.database} on ${host}`
      : `${r.role} may not create ${what} in database ${r.database} on ${host}: GRANT CREATE ON DATABASE ${quoteIdent(r.database)} TO ${quoteIdent(r.role)} there (or make it the database's owner)${orElse}`,
  });
  return [
    check('create on target', targetName, onTarget, 'schemas'),
    ...(online ? [check('create on source', sourceName, onSource, 'publications', ', or use --mode offline')] : []),
  ];
}

/** Past this many, what a failed check names is counted, not listed. */
const SKIPS_NAMED = 5;

/**
 * The copy loads the target's tables with the replica role (BEGIN_COPY_SQL), so that the shard's
 * own triggers do not fire on rows that are copied, not written (an audit trigger would add rows
 * the copy brings anyway: a duplicate key, or rows twice; a BEFORE trigger would change the rows),
 * and foreign keys are not checked in the order the tables happen to be copied in (a table copied
 * before the one it references fails). A role that may not take it (not a superuser, no SET on
 * session_replication_role) copies without it; without this check the move would stop at its copy
 * (offline: with the source fenced) or, worse, carry changed rows.
 */
export async function replicaRoleCheck(
  src: pg.Client,
  dst: pg.Client,
  dstVersionNum: number,
  schemas: readonly string[],
  targetName: string,
): Promise<PreflightCheck> {
  const [role, skips] = await Promise.all([
    dst.query<{ role: string; may: boolean }>(replicaRoleSql(dstVersionNum)),
    src.query<{ table_name: string; what: string }>(REPLICA_ROLE_SKIPS_SQL, [schemas]),
  ]);
  const { role: current, may } = role.rows[0]!;
  const name = 'replica role on target';
  if (may)
    return {
      name,
      ok: true,
      message: `${current} may copy with the replica role on ${targetName} (no trigger fires, no foreign key is checked)`,
    };
  if (skips.rows.length === 0)
    return {
      name,
      ok: true,
      message: `no trigger or foreign key between tables of the batch would act on the copy on ${targetName}`,
    };
  const named = skips.rows.slice(0, SKIPS_NAMED).map((t) => `${t.what} on ${t.table_name}`);
  const more = skips.rows.length - named.length;
  return {
    name,
    ok: false,
    message:
      `${current} on ${targetName} may not set session_replication_role, so the copy would fire the shards' triggers ` +
      `and check their foreign keys on every copied row (${named.join(', ')}${more > 0 ? ` and ${more} more` : ''}); ` +
      (dstVersionNum >= 150000
        ? `GRANT SET ON PARAMETER session_replication_role TO ${quoteIdent(current)} on ${targetName}, or connect as a superuser`
        : `connect as a superuser`),
  };
}
