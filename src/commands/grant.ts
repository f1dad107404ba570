import type { ShardctlConfig } from '../config/types.js';
import { optionKeys, refuseUnknownOptions } from '../config/validate.js';
import { HostError, UsageError } from '../errors.js';
import { controlRightsError } from '../fleet/rights.js';
import { describePgError } from '../fleet/connect.js';
import { GUARDED_SCHEMAS_SQL } from '../moves/sql/incoming.js';
import { CONTROL } from '../fleet/control.js';
import { Fleet } from '../fleet/session.js';
import { quoteIdent } from '../pg/quote.js';
import { rollbackQuietly } from '../pg/quiet.js';

/**
 * `shardctl grant <role> --app | --readonly`: what an application's role (a router that reads and
 * writes rows) or a read-only role (a router's readOnly calls, `exec` without --write) needs on
 * every shard of every host, and nothing more:
 *
 *   app:      USAGE on the shard schemas; SELECT, INSERT, UPDATE, DELETE on their tables; USAGE and
 *             SELECT on their sequences (next_id() draws with nextval() and reads currval())
 *   readonly: USAGE on the shard schemas; SELECT on their tables and sequences; SELECT on the
 *             control tables `shardctl status` reads too (STATUS_CONTROL_TABLES), for monitoring
 *
 * both with the same default privileges in each shard schema, so tables and sequences that later
 * migrations create there are covered (for the role that runs the migrations: the one running this
 * command), and both with what a router reads of the control schema (USAGE, SELECT on the layout,
 * the shards, the fleet, the host registry, the placement and the moves): no control table
 * becomes writable, and nothing of the schemas' owner (DDL, TRUNCATE, REFERENCES, TRIGGER). The
 * shard count is fixed at init, so every shard schema exists; a move carries the grants and default
 * privileges to its target (docs/moves.md). Idempotent: GRANT of what is held is a no-op.
 */
export type GrantMode = 'app' | 'readonly';

export interface GrantHostResult {
  readonly host: string;
  /** Shard schemas granted on (those the host's control schema records). */
  readonly schemas: number;
  /** The SQL run (or, with dryRun, that would run), one transaction per chunk of schemas. */
  readonly sql: readonly string[];
}

export interface GrantResult {
  readonly role: string;
  readonly mode: GrantMode;
  readonly dryRun: boolean;
  readonly hosts: readonly GrantHostResult[];
}

/** The control tables a router reads (discovery, following a move); SELECT only. */
export const ROUTER_CONTROL_TABLES = [
  'layout',
  'shards',
  'fleet',
  'hosts',
  'placement',
  'moves',
  'move_shards',
] as const;

/**
 * What `shardctl status` reads besides (the migrations applied, the leftovers recorded): a
 * read-only role gets these too, so that monitoring can run status as it. Nothing secret: versions,
 * names and checksums of migrations, names of objects a move left.
 */
export const STATUS_CONTROL_TABLES = ['migrations', 'objects'] as const;

/** The control tables `mode` may read. */
export function controlTablesFor(mode: GrantMode): readonly string[] {
  return mode === 'readonly' ? [...ROUTER_CONTROL_TABLES, ...STATUS_CONTROL_TABLES] : ROUTER_CONTROL_TABLES;
}

/** Schemas per transaction: GRANT takes a lock on every object it changes. */
const SCHEMAS_PER_TRANSACTION = 256;

/**
 * The transactions that give `role` what `mode` needs on `schemas` and on the control schema; no
 * USAGE on the schemas in `withheld` (a move's guarded incoming copies, whose switch grants it).
 */
export function grantSql(
  role: string,
  mode: GrantMode,
  schemas: readonly string[],
  withheld: ReadonlySet<string> = new Set(),
): string[] {
  const to = quoteIdent(role);
  const tablePrivileges = mode === 'app' ? 'SELECT, INSERT, UPDATE, DELETE' : 'SELECT';
  const sequencePrivileges = mode === 'app' ? 'USAGE, SELECT' : 'SELECT';
  const transactions: string[] = [];
  for (let i = 0; i < schemas.length; i += SCHEMAS_PER_TRANSACTION) {
    const part = schemas.slice(i, i + SCHEMAS_PER_TRANSACTION);
    const list = part.map(quoteIdent).join(', ');
    const usable = part.filter((schema) => !withheld.has(schema));
    transactions.push(
      [
        'BEGIN;',
        ...(usable.length > 0 ? [`GRANT USAGE ON SCHEMA ${usable.map(quoteIdent).join(', ')} TO ${to};`] : []),
        `GRANT ${tablePrivileges} ON ALL TABLES IN SCHEMA ${list} TO ${to};`,
        `GRANT ${sequencePrivileges} ON ALL SEQUENCES IN SCHEMA ${list} TO ${to};`,
        `ALTER DEFAULT PRIVILEGES IN SCHEMA ${list} GRANT ${tablePrivileges} ON TABLES TO ${to};`,
        `ALTER DEFAULT PRIVILEGES IN SCHEMA ${list} GRANT ${sequencePrivileges} ON SEQUENCES TO ${to};`,
        'COMMIT;',
      ].join('\n'),
    );
  }
  transactions.push(
    [
      'BEGIN;',
      `GRANT USAGE ON SCHEMA ${CONTROL} TO ${to};`,
      `GRANT SELECT ON ${controlTablesFor(mode)
        .map((t) => `${CONTROL}.${t}`)
        .join(', ')} TO ${to};`,
      'COMMIT;',
    ].join('\n'),
  );
  return transactions;
}

export interface GrantOptions {
  /** Read every host and say what would be granted; grant nothing. */
  readonly dryRun?: boolean;
}
const GRANT_OPTION_KEYS = optionKeys<GrantOptions>({ dryRun: true });

export async function grant(
  config: ShardctlConfig,
  role: string,
  mode: GrantMode,
  options: GrantOptions = {},
): Promise<GrantResult> {
  refuseUnknownOptions('grant options', options, GRANT_OPTION_KEYS);
  if (role.length === 0 || role.length > 63)
    throw new UsageError('must be a role name of 1 to 63 characters', { input: 'role', value: role });
  // PostgreSQL reserves the prefix for its predefined roles (pg_read_all_data, pg_signal_backend, …),
  // whose members are chosen for other reasons: a grant there reaches every one of them.
  if (role.startsWith('pg_'))
    throw new UsageError(
      "is one of PostgreSQL's predefined roles; grant to a role of your own (CREATE ROLE), made a member of it if need be",
      { input: 'role', value: role },
    );
  if (mode !== 'app' && mode !== 'readonly')
    throw new UsageError('must be app or readonly', { input: 'mode', value: String(mode) });
  const dryRun = options.dryRun ?? false;
  // One connection per host for the whole run. Every host is read first: a role missing on one host
  // (or a superuser) refuses the whole run before anything is granted anywhere.
  const fleet = await Fleet.open(config.hosts, { applicationName: 'shardctl grant' });
  try {
    fleet.requireAll();
    // A host that cannot be read (a role that may not read the control schema) is named by Fleet.each.
    const plans = await fleet.each(
      async ({ host, client }) => {
        const found = await client.query<{ superuser: boolean | null; schemas: string[] | null; owns: boolean }>(
          `SELECT (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = $1) AS superuser,
                  (SELECT array_agg(schema_name::text ORDER BY shard) FROM ${CONTROL}.shards
                    WHERE to_regnamespace(quote_ident(schema_name)) IS NOT NULL) AS schemas,
                  (SELECT pg_catalog.pg_has_role(current_user, n.nspowner, 'USAGE')
                     FROM pg_catalog.pg_namespace n WHERE n.nspname = $2)
                    OR (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user) AS owns`,
          [role, CONTROL],
        );
        const { superuser, schemas, owns } = found.rows[0]!;
        // Only the fleet's owner can grant on what it owns: another role is refused here, before
        // anything is sent anywhere (PostgreSQL would only warn on the shards' objects, then refuse
        // on the control tables), with the owner to run it as.
        if (!owns)
          throw await controlRightsError(client, host, new Error(`only the owner of ${CONTROL} can grant on it`));
        if (superuser === null)
          throw new HostError(
            host.name,
            `role ${JSON.stringify(role)} does not exist; create it first (CREATE ROLE); nothing was granted`,
            { code: 'ROLE_MISSING' },
          );
        if (superuser)
          throw new HostError(
            host.name,
            `role ${JSON.stringify(role)} is a superuser: it needs no grants and bypasses every one; nothing was granted`,
            { code: 'ROLE_SUPERUSER' },
          );
        const guarded = await client.query<{ schema: string }>(GUARDED_SCHEMAS_SQL, [host.name]);
        return { host, client, schemas: schemas ?? [], withheld: new Set(guarded.rows.map((r) => r.schema)) };
      },
      { doing: 'cannot read the shards' },
    );
    const hosts = await Promise.all(
      plans.map(async ({ host, client, schemas, withheld }) => {
        const sql = grantSql(role, mode, schemas, withheld);
        if (!dryRun) {
          for (const transaction of sql) {
            try {
              await client.query(transaction);
            } catch (error) {
              await rollbackQuietly(client);
              throw new HostError(host.name, `cannot grant to ${JSON.stringify(role)}: ${describePgError(error)}`, {
                code: 'GRANT_FAILED',
                cause: error,
              });
            }
          }
        }
        return { host: host.name, schemas: schemas.length, sql };
      }),
    );
    return { role, mode, dryRun, hosts };
  } finally {
    await fleet.close();
  }
}
