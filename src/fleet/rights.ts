import type pg from 'pg';
import type { HostConfig } from '../config/types.js';
import { HostError, RuntimeFailure } from '../errors.js';
import { quoteIdent } from '../pg/quote.js';
import { hasSqlState, INSUFFICIENT_PRIVILEGE } from '../pg/sqlstate.js';
import { describePgError } from './connect.js';
import { CONTROL_SCHEMA } from './control.js';

/**
 * What a role is told when the control schema refuses it (SQLSTATE 42501): who owns it and what
 * would let the role in, by what the role came to do.
 */

/**
 * A rights check run on every target before anything is written, so that a role refused anywhere
 * stops the command with nothing written: the refusals are thrown together as one CONTROL_RIGHTS
 * failure, `heading` (given their number) above the list; with `alone`, a single refusal is thrown
 * as it is. What each check settled to is returned: a check that failed (its connection lost) is
 * the caller's to report.
 */
export async function requireRights<T>(
  targets: readonly T[],
  check: (target: T) => Promise<HostError | null | undefined>,
  heading: (count: number) => string,
  options: { readonly alone?: boolean } = {},
): Promise<PromiseSettledResult<HostError | null | undefined>[]> {
  const checks = await Promise.allSettled(targets.map(check));
  const refused = checks.flatMap((c) => (c.status === 'fulfilled' && c.value ? [c.value] : []));
  if (refused.length === 0) return checks;
  if (refused.length === 1 && options.alone) throw refused[0]!;
  throw new RuntimeFailure(
    'CONTROL_RIGHTS',
    `${heading(refused.length)}:\n${refused.map((e) => `  - ${e.message}`).join('\n')}`,
    { hosts: refused.map((e) => e.host) },
    refused.map((e) => e.message),
  );
}

/**
 * The runner lock refused for want of rights: the connecting role is not the one that built the
 * fleet (a team that moved from a superuser to an operator role of its own, a second operator), or
 * may not create the control schema. Says whose the control schema is and what would let the role
 * in; membership of a superuser owner is not offered, since it would let the role become that superuser.
 */
export async function controlRightsError(client: pg.Client, host: HostConfig, error: unknown): Promise<HostError> {
  const cause = describePgError(error);
  try {
    const r = (
      await client.query<{ role: string; database: string; owner: string | null; superuser: boolean | null }>(
        `SELECT current_user AS role, current_database() AS database, o.rolname AS owner, o.rolsuper AS superuser
           FROM (SELECT 1) x
           LEFT JOIN pg_catalog.pg_namespace n ON n.nspname = $1
           LEFT JOIN pg_catalog.pg_roles o ON o.oid = n.nspowner`,
        [CONTROL_SCHEMA],
      )
    ).rows[0]!;
    const reason =
      r.owner === null
        ? `${r.role} may not create the control schema ${CONTROL_SCHEMA} in database ${r.database} (${cause}): GRANT CREATE ON DATABASE ${quoteIdent(r.database)} TO ${quoteIdent(r.role)} there, or run shardctl as the database's owner`
        : `${r.role} has no rights on the control schema ${CONTROL_SCHEMA}, which belongs to ${r.owner} (${cause}): run shardctl as ${r.owner}, the role that built the fleet` +
          (r.superuser ? '' : `, or GRANT ${quoteIdent(r.owner)} TO ${quoteIdent(r.role)}`);
    return new HostError(host.name, reason, { code: 'CONTROL_RIGHTS', cause: error });
  } catch {
    // The session itself failed: the error as it came.
    return new HostError(host.name, cause, { cause: error });
  }
}

/**
 * What lets the role of a host's url read the control schema, for the commands that only read it
 * (status, map show, map pull) and a router opened from seeds: a grant by the owner, `--readonly`
 * or `--app` (README, Roles); appended to the host's refusal. Not for `map set-address`, which
 * writes the registry: only the owner may.
 */
export function controlReadHint(url: string): string {
  let role = '<role>';
  try {
    const user = decodeURIComponent(new URL(url).username);
    if (user) role = user;
  } catch {
    // Not a URL with a user (a key/value string, or the user from the environment): said generically.
  }
  return (
    `; the role ${role === '<role>' ? "of the host's url" : role} may not read the control schema: ` +
    `\`shardctl grant ${role} --readonly\` (run with the owner's config) lets it run status, map show and map pull, \`--app\` lets an application's router read the map (README, Roles)`
  );
}

/** `reason`, with controlReadHint when `error` is a refusal for want of rights (42501, itself or wrapped). */
export function withReadHint(reason: string, error: unknown, url: string): string {
  return hasSqlState(error, INSUFFICIENT_PRIVILEGE) ? reason + controlReadHint(url) : reason;
}
