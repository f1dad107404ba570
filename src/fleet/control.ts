import type pg from 'pg';
import type { ShardctlConfig } from '../config/types.js';
import { ID_LOCK_SLOTS, ID_LOCK_TABLES, renderNextIdControlSql, SLOW_PATH_CHANGING_COMMENT } from '../id/sql.js';
import { HostError } from '../errors.js';
import { quoteLiteral } from '../pg/quote.js';
import { EMPTY, ident, lit, sql, type Sql } from '../pg/sql-template.js';
import { SHARD_MOVED_SQLSTATE } from '../config/shard-map.js';
import { loadSqlTemplate, renderSql } from '../pg/template.js';
import { rollbackQuietly, runTransaction } from '../pg/quiet.js';
import { CLIENT_CONNECTION_CHECK_INTERVAL } from './connect.js';
import { sleep } from '../clock.js';

/**
 * The control schema shardctl keeps on every host (sql/control.sql): the id layout the host was
 * built with, its shards and their state, the migrations applied to each, and the moves. Its name
 * is fixed on purpose, and every piece of SQL names it through CONTROL.
 */
export const CONTROL_SCHEMA = 'shardctl';

/** The control schema's name as SQL text, quoted: `"shardctl"`. */
export const CONTROL: Sql = ident(CONTROL_SCHEMA);

/**
 * "This shard is active here": its row of the control schema's shards (as `alias`, when the query
 * names it) says so. A shard fenced by a move, or incoming, is not.
 */
export function shardIsActive(alias?: Sql): Sql {
  return sql`${alias === undefined ? EMPTY : sql`${alias}.`}state = 'active'`;
}

/**
 * The refusal of a moved shard's old copy as a PL/pgSQL RAISE: SQLSTATE SC100
 * (SHARD_MOVED_SQLSTATE, which the router recognises), naming the shard and its new host in the
 * message and in a DETAIL the router parses; `refused` says what is refused. One text for the
 * fence's guard (moves/sql/fence.ts) and, word for word, sql/control.sql's shard_fenced() and
 * shard_moved() (test/unit/sql.test.ts holds them equal).
 */
export function shardMovedRaiseSql(shard: Sql, host: Sql, refused: string, indent = 0): Sql {
  const pad = ' '.repeat(indent) as Sql; // spaces only
  return sql`${pad}RAISE EXCEPTION ${lit(`shard % has moved to host %; ${refused}`)}, ${shard}, ${host}
${pad}  USING ERRCODE = ${lit(SHARD_MOVED_SQLSTATE)},
${pad}        DETAIL = format('shardctl-moved shard=%s host=%s', ${shard}, ${host}),
${pad}        HINT = 'Reload the shard map and retry on the new host.';`;
}

/**
 * The key of a move's detail (`moves.detail`) that an abort sets before it undoes anything: a
 * running move with it can only be aborted again (its undo may be half done), never resumed.
 */
export const MOVE_ABORTING = 'aborting';

/** Whether a row of `moves` records an abort that began, as a boolean column `aborting`. */
export const MOVE_ABORTING_SQL = sql`coalesce((detail->>${lit(MOVE_ABORTING)})::boolean, false) AS aborting`;

/**
 * The moves whose abort began, from the records of any host: one host's record saying so is
 * enough for the move (the other may not have been written, or not answered).
 */
export function abortingMoveIds(
  records: Iterable<{ readonly moveId: string; readonly aborting: boolean }>,
): Set<string> {
  return new Set([...records].filter((r) => r.aborting).map((r) => r.moveId));
}

/**
 * The control schema's own versions, in order: each step's SQL is idempotent and brings a control
 * schema of any earlier version (or none) up to it. controlSchemaSql runs them all in one
 * transaction and records the last version in `layout.control_version` (never lowering it). A host
 * whose recorded version is above CONTROL_VERSION was written by a newer shardctl: this one refuses
 * to write to it (requireKnownControlVersion), since it cannot know what the newer tables mean.
 */
const CONTROL_STEPS: readonly { version: number; sql: (config: ShardctlConfig) => string }[] = [
  // The layout, the shards, migration records, moves and their markers, the fence functions.
  { version: 1, sql: () => renderSql(loadSqlTemplate('control.sql'), { control: { ident: CONTROL_SCHEMA } }).trim() },
  // The fleet: its id, the host registry and the placement copy (src/fleet/placement.ts); the lock
  // tables (sql/control_locks.sql).
  {
    version: 2,
    sql: () =>
      [
        renderSql(loadSqlTemplate('control_fleet.sql'), { control: { ident: CONTROL_SCHEMA } }).trim(),
        controlLocksSql(),
      ].join('\n'),
  },
  // next_id's slow path, once per host instead of once per shard (sql/next_id_control.sql): shard
  // schemas of next_id v2 call it, so it comes before any of them is created or upgraded. Installed
  // changing over (the earlier row lock beside the table lock of version 6): a session may still run
  // the body it replaces. finishSlowPath drops the row lock once none can.
  {
    version: 3,
    sql: (config) =>
      renderNextIdControlSql(config.idLayout, config.schemaPrefix, CONTROL_SCHEMA, { changingOver: true }),
  },
  // The chunks of a move's copy, so that a resumed copy goes on where it stopped (src/moves/chunks.ts).
  {
    version: 4,
    sql: () => renderSql(loadSqlTemplate('control_chunks.sql'), { control: { ident: CONTROL_SCHEMA } }).trim(),
  },
  // What a resumed copy needs to settle its chunks from the source's change log instead of reading
  // them: each chunk's snapshot, each log entry's key and transaction (src/moves/chunks.ts).
  {
    version: 5,
    sql: () => renderSql(loadSqlTemplate('control_deltas.sql'), { control: { ident: CONTROL_SCHEMA } }).trim(),
  },
  // next_id's slow path locks a table (id_lock_0 .. id_lock_15, created by version 2's
  // sql/control_locks.sql) instead of a row of id_locks: no transaction id per call. Its function is
  // version 3's, installed changing over and finished by finishSlowPath.
  { version: 6, sql: () => '' },
];

/** The control schema version this shardctl writes (the last of CONTROL_STEPS). */
export const CONTROL_VERSION = CONTROL_STEPS.at(-1)!.version;

/** Creates (or completes) the control schema and records the layout, in one transaction. */
export function controlSchemaSql(config: ShardctlConfig): string {
  const layout = config.idLayout;
  return [
    'BEGIN;',
    ...CONTROL_STEPS.map((step) => step.sql(config)),
    `INSERT INTO ${CONTROL}.layout (control_version, schema_prefix, shard_count, epoch_ms, shard_bits, sequence_bits)`,
    `VALUES (${CONTROL_VERSION}, ${quoteLiteral(config.schemaPrefix)}, ${config.shards}, ${layout.epochMs}, ${layout.shardBits}, ${layout.sequenceBits})`,
    `ON CONFLICT (singleton) DO UPDATE SET control_version = greatest(${CONTROL}.layout.control_version, EXCLUDED.control_version);`,
    'COMMIT;',
  ].join('\n');
}

/**
 * Runs controlSchemaSql where the host's control schema is older than this shardctl's (or missing);
 * a current one is left as it is (its DDL is about 30 ms a host, and a move's start waits for it).
 */
export async function completeControlSchema(client: pg.Client, config: ShardctlConfig): Promise<void> {
  const recorded = await recordedControlVersion(client);
  if (recorded === null || recorded < CONTROL_VERSION) await client.query(controlSchemaSql(config));
  // A move is about to start: a second at most for the slow path's change-over.
  await finishSlowPath(client, config, { waitMs: 1_000 });
}

/** Whether the host's slow path is changing over (finishSlowPath): it takes both locks, the row's too. */
export async function slowPathChangingOver(client: pg.Client): Promise<boolean> {
  const r = await client.query<{ changing: boolean }>(
    `SELECT coalesce(pg_catalog.obj_description(to_regprocedure($1), 'pg_proc') = $2, false) AS changing`,
    [`${CONTROL_SCHEMA}.next_id_locked(regclass, integer)`, SLOW_PATH_CHANGING_COMMENT],
  );
  return r.rows[0]!.changing;
}

/** How long finishSlowPath waits by default for the transactions it must outlast. */
export const SLOW_PATH_WAIT_MS = 5_000;

/** The transactions of this database that hold a lock on a sequence (not this session's, nor prepared ones). */
const SEQUENCE_HOLDERS_SQL = `SELECT coalesce(pg_catalog.array_agg(DISTINCT l.virtualtransaction), '{}') AS holders
  FROM pg_catalog.pg_locks l
 WHERE l.locktype = 'relation'
   AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname = pg_catalog.current_database())
   AND l.pid IS DISTINCT FROM pg_catalog.pg_backend_pid()
   AND l.pid IS NOT NULL
   AND EXISTS (SELECT FROM pg_catalog.pg_class c WHERE c.oid = l.relation AND c.relkind = 'S')`;

/** How many of these transactions still run: each holds the lock of its own virtual transaction id. */
const STILL_RUNNING_SQL = `SELECT count(*)::int AS n FROM pg_catalog.pg_locks
 WHERE locktype = 'virtualxid' AND granted AND virtualxid = ANY($1::text[])`;

/**
 * Ends the slow path's change-over on a host (control schema version 6): its next_id_locked takes
 * the earlier row lock beside its table lock (sql/next_id_control.sql) until no session can still
 * run the body it replaced, and then only the table lock, which takes no transaction id.
 *
 * Which sessions can: a backend checks a PL/pgSQL function's definition when it calls it, but sees
 * a new one only once it has taken in the catalog's changes, which it does when its transaction
 * begins and when it takes a lock it did not hold. next_id() draws (nextval(), which locks the
 * sequence for the rest of the transaction) before it calls the slow path; so a call can run the
 * replaced body only in a transaction that had drawn from some sequence before the change-over was
 * committed, and still holds that lock. This waits until every transaction that holds a sequence's
 * lock now (at least as long ago as the change-over) has ended, up to waitMs, then installs the body
 * without the row lock. When some are still running, or a query fails, nothing changes: the slow
 * path is correct meanwhile (at the earlier cost), and the next run that completes the control
 * schema (init, migrate, adopt, a move) tries again. Never throws: returns whether the slow path is
 * finished (or never was changing over, or does not exist).
 */
export async function finishSlowPath(
  client: pg.Client,
  config: ShardctlConfig,
  { waitMs = SLOW_PATH_WAIT_MS }: { readonly waitMs?: number } = {},
): Promise<boolean> {
  try {
    if (!(await slowPathChangingOver(client))) return true;
    const holders = (await client.query<{ holders: string[] }>(SEQUENCE_HOLDERS_SQL)).rows[0]!.holders;
    const deadline = performance.now() + waitMs;
    while (holders.length > 0) {
      const running = (await client.query<{ n: number }>(STILL_RUNNING_SQL, [holders])).rows[0]!.n;
      if (running === 0) break;
      if (performance.now() >= deadline) return false;
      await sleep(Math.min(50, Math.max(1, deadline - performance.now())));
    }
    await runTransaction(
      client,
      `BEGIN;\n${renderNextIdControlSql(config.idLayout, config.schemaPrefix, CONTROL_SCHEMA)}\nCOMMIT;`,
    );
    return true;
  } catch {
    // Another run finishing it at the same moment ("tuple concurrently updated") is done either way.
    return !(await slowPathChangingOver(client).catch(() => true));
  }
}

/** The control schema version a host records, or null when it has none (a fresh host). */
export async function recordedControlVersion(client: pg.Client): Promise<number | null> {
  const exists = await client.query<{ e: boolean }>(`SELECT to_regclass($1) IS NOT NULL AS e`, [`${CONTROL}.layout`]);
  if (!exists.rows[0]!.e) return null;
  const result = await client.query<{ v: number | null }>(`SELECT max(control_version) AS v FROM ${CONTROL}.layout`);
  return result.rows[0]?.v ?? null;
}

/**
 * Refuses to write to a host whose control schema a newer shardctl made (ControlVersionError,
 * naming both versions).
 */
export async function requireKnownControlVersion(client: pg.Client, hostName: string): Promise<void> {
  const recorded = await recordedControlVersion(client);
  if (recorded !== null && recorded > CONTROL_VERSION) throw new ControlVersionError(hostName, recorded);
}

export class ControlVersionError extends HostError {
  constructor(hostName: string, recorded: number) {
    super(
      hostName,
      `its control schema is version ${recorded}, written by a newer shardctl; this one knows versions up to ${CONTROL_VERSION} and writes nothing there. Upgrade shardctl.`,
      { code: 'CONTROL_TOO_NEW', data: { recorded, supported: CONTROL_VERSION } },
    );
  }
}

/**
 * Sets up a move's worker session as it is put to work (not when it is opened ahead: a move refused
 * by its preflight leaves nothing behind): commits without waiting for the WAL flush (see
 * DURABLE_FLUSH_SQL), and the server checks during its statements that the client is still there
 * (client_connection_check_interval; skipped where the platform cannot). Only on a session shardctl
 * owns for its life (a move's connections, which go to the host's directUrl): through a transaction
 * pooler a session setting stays on the server connection and reaches the pooler's next clients.
 * Provisioning uses WORKER_TRANSACTION_SQL.
 */
export const ASYNC_COMMIT_SQL = ['SET synchronous_commit = off;', clientCheckSql(false)].join(' ');

/**
 * What a worker sends after each shard's migration (migrations/sql.ts): the session back to the
 * server's defaults, then `own`, the worker's own session settings, again (a move's workers:
 * ASYNC_COMMIT_SQL and theirs). A migration file cannot say `SET` or `LISTEN` for the session
 * (migrations/files.ts), but a function or `DO` body it runs can, out of the check's sight (`EXECUTE
 * 'SET session_replication_role = replica'`): left there, it would reach the next shards' migrations
 * on the connection (their triggers off), or the pooler's next clients. RESET ALL leaves what the
 * client sent at connect (application_name) alone. A temporary table one made is dropped too.
 */
export function sessionResetSql(own = ''): string {
  return `RESET ALL; ${own ? `${own.replace(/;?\s*$/, ';')} ` : ''}UNLISTEN *; DISCARD TEMP;`;
}

/** client_connection_check_interval for the session or the transaction, where the server's platform allows it (22023 otherwise). */
export function clientCheckSql(local: boolean): string {
  return `DO $shardctl$ BEGIN PERFORM pg_catalog.set_config('client_connection_check_interval', '${CLIENT_CONNECTION_CHECK_INTERVAL}', ${local}); EXCEPTION WHEN invalid_parameter_value THEN NULL; END $shardctl$;`;
}

/**
 * What a worker's transaction sets for itself (inside it): every shard transaction of provisioning
 * (createShardSql, migrationSql, reinstallNextIdSql, recordShardSql) and a move's target creation
 * starts with it, so nothing outlives the transaction and a pooled server connection goes back to the
 * pooler with the server's defaults. It commits without a WAL flush (see DURABLE_FLUSH_SQL), and has
 * the server check during its statements that the client is still there
 * (client_connection_check_interval, PostgreSQL 14+): a killed run's worker is ended within a second
 * instead of running its statement (and holding its locks) to the end. A server whose platform cannot
 * check (22023, "must be set to 0 on this platform") goes without.
 */
export const WORKER_TRANSACTION_SQL = ['SET LOCAL synchronous_commit = off;', clientCheckSql(true)].join('\n');

/**
 * Provisioning, and a move's target creation and copy, commit each shard's transaction with
 * synchronous_commit off (no WAL flush, and no wait for a synchronous standby, per shard: the bulk
 * of migrate's time otherwise). This transaction ends such a run: it writes (the layout row,
 * unchanged) and commits with synchronous_commit on, so its commit waits until the WAL is flushed,
 * and confirmed by synchronous standbys, up to its own commit record, which comes after every
 * commit the run made on the host. Until it returns, a crash can lose the run's last commits, each
 * shard's change together with its record (one transaction), so a rerun applies them again; once it
 * returns, they are as durable as any commit.
 */
export const DURABLE_FLUSH_SQL = `BEGIN; SET LOCAL synchronous_commit = on; UPDATE ${CONTROL}.layout SET control_version = control_version; COMMIT;`;

/** Whether the control schema has `table` (hosts never initialised, or older control schemas, lack it). */
export async function controlTableExists(
  client: pg.Client,
  table: 'shards' | 'moves' | 'objects' | 'move_deltas',
): Promise<boolean> {
  // From the catalog, not to_regclass(): that needs USAGE on the schema, and a role without it (not
  // the fleet's owner) would fail here, before the runner lock can say whose the schema is.
  const result = await client.query<{ e: boolean }>(
    `SELECT EXISTS (SELECT FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
                     WHERE n.nspname = $1 AND c.relname = $2) AS e`,
    [CONTROL_SCHEMA, table],
  );
  return result.rows[0]!.e;
}

/**
 * The lock tables of the control schema (sql/control_locks.sql): the runner lock, the tracking lock,
 * the workers' records and next_id's slow-path lock rows. A file of its own because the runner lock
 * needs them before a run has read anything, on a host that has no control schema yet, or an older one.
 */
export function controlLocksSql(): string {
  return renderSql(loadSqlTemplate('control_locks.sql'), {
    control: { ident: CONTROL_SCHEMA },
    controlLiteral: { literal: CONTROL_SCHEMA },
    idLockSlots: { int: ID_LOCK_SLOTS },
    idTableSlots: { int: ID_LOCK_TABLES },
  }).trim();
}

/** The lock tables of control_locks.sql, qualified. */
const LOCK_TABLES = [
  'runner_lock',
  'tracking_lock',
  'workers',
  'id_locks',
  ...Array.from({ length: ID_LOCK_TABLES }, (_, i) => `id_lock_${i}`),
].map((t) => `${CONTROL_SCHEMA}.${t}`);

/**
 * Installs the lock tables when one is missing (a host never initialised, or by an older shardctl)
 * or next_id's lock rows are not all there, in a transaction of its own. Two runs doing this at once
 * on a fresh host can collide on the catalog's unique indexes; the loser tries again, and then finds
 * them.
 */
export async function ensureControlLocks(client: pg.Client): Promise<void> {
  for (let attempt = 1; ; attempt += 1) {
    // The tables, and the workers' run_id (added after the table: hosts of an earlier release lack it).
    const missing = await client.query<{ missing: boolean }>(
      `SELECT bool_or(to_regclass(t) IS NULL)
              OR NOT EXISTS (SELECT FROM pg_attribute WHERE attrelid = to_regclass($2) AND attname = 'run_id' AND NOT attisdropped)
              AS missing
         FROM unnest($1::text[]) t`,
      [LOCK_TABLES, `${CONTROL}.workers`],
    );
    if (!missing.rows[0]!.missing) {
      const rows = await client.query<{ n: number }>(`SELECT count(*)::int AS n FROM ${CONTROL}.id_locks`);
      if (rows.rows[0]!.n === ID_LOCK_SLOTS) return;
    }
    try {
      await client.query(`BEGIN;\n${controlLocksSql()}\nCOMMIT;`);
      return;
    } catch (error) {
      await rollbackQuietly(client);
      const code = (error as { code?: unknown }).code;
      if (attempt >= 3 || (code !== '23505' && code !== '42P06' && code !== '42P07')) throw error;
    }
  }
}
