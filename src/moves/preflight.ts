import { randomBytes } from 'node:crypto';
import { constants } from 'node:fs';
import { access } from 'node:fs/promises';
import { dirname } from 'node:path';
import pg from 'pg';
import { formatShardList, shardsPhrase } from '../config/ranges.js';
import type { HostConfig, ShardctlConfig } from '../config/types.js';
import { hostForShard, shardSchemaName } from '../config/types.js';
import { abortingMoveIds, controlTableExists } from '../fleet/control.js';
import type { HostSession } from '../fleet/session.js';
import type { MigrationFile } from '../migrations/files.js';
import { shardDrift } from '../migrations/rules.js';
import { readShardShapes, shapeDrift, shapeDriftMessage } from '../migrations/shape.js';
import { rolesNamed, type PrivilegeObject } from './privileges.js';
import { RUNNING_MOVES_OF_SQL } from './sql/control.js';
import {
  APPLIED_CHECKSUMS_SQL,
  REPLICATION_SETTINGS_SQL,
  rolesSql,
  ownerNeedsSet,
  SOURCE_SHARD_STATES_SQL,
  targetShardStatesSql,
} from './sql/preflight.js';
import { dropSubscriptionSql, forgetObjectSql, probeSubscriptionSql, recordObjectSql } from './sql/replication.js';
import { CURRENT_USER_SQL } from './sql/session.js';
import { shardPrivileges, REPLICA_IDENTITIES_SQL } from './catalog.js';
import { faultAfter, type MoveMode } from './state.js';
import { bytesPhrase, inflect } from '../text.js';
import { awaitedLater } from '../promises.js';
import { connectedUrl, describePgError } from '../fleet/connect.js';
import { hostClientSettings } from '../fleet/silence.js';
import { libpqCompatible } from '../pg/tls.js';
import { endQuietly } from '../pg/quiet.js';

/**
 * The bytes of the schemas' tables and indexes from the catalog's page counts (relpages, as of the
 * last VACUUM or ANALYZE): no stat call per file, so a batch of thousands of shards reads it at once.
 */
const CATALOG_BYTES_SQL = `SELECT (coalesce(sum(c.relpages), 0) * current_setting('block_size')::bigint)::text AS bytes
       FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
      WHERE n.nspname = ANY($1::text[]) AND c.relkind IN ('r', 'i', 'm')`;

/** The source's bounds on the WAL a slot may hold, in MB (-1: none). */
const WAL_LIMITS_SQL = `SELECT (SELECT setting FROM pg_settings WHERE name = 'max_slot_wal_keep_size') AS max_slot_wal_keep_size_mb,
              (SELECT setting FROM pg_settings WHERE name = 'wal_keep_size') AS wal_keep_size_mb`;

export interface PreflightCheck {
  readonly name: string;
  readonly ok: boolean;
  /**
   * What was found, and when not ok, what to change. This stays words for a person, command names
   * included, rather than a `next` list (errors.ts): most advice here is no shardctl command at all
   * (ALTER TABLE … SET LOGGED, wal_level, dropping a schema), the dry run prints these lines as a
   * report, and a program acts on `name` and `ok`.
   */
  readonly message: string;
}

export interface PreflightInput {
  readonly config: ShardctlConfig;
  /** The batch: shards mapped to the source, ascending. */
  readonly shards: readonly number[];
  readonly mode: MoveMode;
  readonly source: HostSession;
  readonly target: HostSession;
  /**
   * Another session on the source, idle meanwhile (the command's own): the owners and grants,
   * the longest read, are read there beside the others. Without it, on the source's session.
   */
  readonly sourceReader?: pg.Client;
  readonly migrations: readonly MigrationFile[];
  /** Create and drop a disabled subscription on the target to prove it can reach the source. */
  readonly probeReachability: boolean;
  /** The config file the switch rewrites; it must be writable before anything changes. */
  readonly configFile: string;
}

/**
 * Everything checked before a move changes anything, for the whole batch. Each failed check names
 * the shards or tables concerned and says what to change.
 */
export interface PreflightResult {
  readonly checks: PreflightCheck[];
  /** The source's owners and grants of the batch's schemas, as read for the checks: createTargets carries them. */
  readonly sourcePrivileges: readonly PrivilegeObject[];
}

export async function preflight(input: PreflightInput): Promise<PreflightResult> {
  const { config, shards, mode } = input;
  const [source, target] = [input.source.host, input.target.host];
  const [src, dst] = [input.source.client, input.target.client];
  const schemas = shards.map((s) => shardSchemaName(config, s));
  const checks: PreflightCheck[] = [];
  const add = (name: string, ok: boolean, message: string): void => {
    checks.push({ name, ok, message });
  };
  const list = (items: readonly number[]): string => shardsPhrase([...items]);
  // Shapes are compared across hosts only between equal majors (definition texts may differ between them).
  const sameMajor =
    Math.floor(input.source.serverVersionNum / 10000) === Math.floor(input.target.serverVersionNum / 10000);

  // Every read starts now, each host's queued on its session, so that the two hosts answer at
  // once; the checks below take them in their order.
  const reads = {
    onSource: awaitedLater(
      src.query<{ shard: number; exists: boolean; state: string | null }>(SOURCE_SHARD_STATES_SQL, [shards, schemas]),
    ),
    running: awaitedLater(Promise.all([runningMovesOf(src, shards), runningMovesOf(dst, shards)])),
    settings:
      mode === 'online'
        ? awaitedLater(
            src.query<{ wal_level: string; free_slots: number; free_senders: number }>(REPLICATION_SETTINGS_SQL),
          )
        : null,
    identities:
      mode === 'online'
        ? awaitedLater(
            src.query<{ name: string; identity: boolean; logged: boolean }>(REPLICA_IDENTITIES_SQL, [schemas]),
          )
        : null,
    sourceShapes: awaitedLater(readShardShapes(src, source.name)),
    privileges: awaitedLater(shardPrivileges(input.sourceReader ?? src, schemas)),
    applied: awaitedLater(
      src.query<{ shard: number; version: number; checksum: string }>(APPLIED_CHECKSUMS_SQL, [shards]),
    ),
    targetInitialised: awaitedLater(controlTableExists(dst, 'shards')),
    space: awaitedLater(src.query<{ bytes: string }>(CATALOG_BYTES_SQL, [schemas])),
    walLimits:
      mode === 'online'
        ? awaitedLater(src.query<{ max_slot_wal_keep_size_mb: string; wal_keep_size_mb: string }>(WAL_LIMITS_SQL))
        : null,
    writable: awaitedLater(canRewrite(input.configFile)),
  };
  const onTargetRead = awaitedLater(
    reads.targetInitialised.then((initialised) =>
      dst.query<{ shard: number; exists: boolean; state: string | null }>(targetShardStatesSql(initialised), [
        shards,
        schemas,
      ]),
    ),
  );
  const targetShapesRead = awaitedLater(
    reads.targetInitialised.then((initialised) => (sameMajor && initialised ? readShardShapes(dst, target.name) : [])),
  );

  const unmapped = shards.filter((s) => hostForShard(config, s)?.name !== source.name);
  add(
    'map',
    unmapped.length === 0,
    unmapped.length === 0
      ? `the map puts ${list(shards)} on ${source.name}`
      : `the map does not put ${list(unmapped)} on ${source.name}`,
  );

  const onSource = await reads.onSource;
  // One per move; an abort that began is said by either host's record.
  const onHosts = (await reads.running).flat();
  const aborting = abortingMoveIds(onHosts);
  const running = onHosts
    .filter((m, i) => onHosts.findIndex((o) => o.moveId === m.moveId) === i)
    .map((m) => ({ ...m, aborting: aborting.has(m.moveId) }));
  const missing = onSource.rows.filter((r) => !r.exists).map((r) => r.shard);
  const inactive = onSource.rows.filter((r) => r.exists && r.state !== 'active');
  add(
    'shards on source',
    missing.length === 0 && inactive.length === 0,
    missing.length > 0
      ? `no schema for ${list(missing)} on ${source.name}; nothing to move`
      : inactive.length > 0
        ? inactiveMessage(list(inactive.map((r) => r.shard)), source.name, inactive, running)
        : `the schemas of ${list(shards)} exist on ${source.name} and are active`,
  );

  const targetInitialised = await reads.targetInitialised;
  const onTarget = await onTargetRead;
  const oldCopies = onTarget.rows.filter((r) => r.state === 'fenced').map((r) => r.shard);
  const recorded = onTarget.rows.filter((r) => r.state !== null && r.state !== 'fenced').map((r) => r.shard);
  const present = onTarget.rows.filter((r) => r.exists && r.state === null).map((r) => r.shard);
  add(
    'target free',
    oldCopies.length + recorded.length + present.length === 0,
    oldCopies.length > 0
      ? `${target.name} still holds old fenced copies of ${list(oldCopies)}; remove them with shardctl gc first`
      : recorded.length > 0
        ? `${target.name} already records ${list(recorded)}; finish or undo the move that put them there (move-shard --resume / --abort)`
        : present.length > 0
          ? present.length === 1
            ? `the schema of ${list(present)} already exists on ${target.name} but shardctl did not create it there; drop it first`
            : `the schemas of ${list(present)} already exist on ${target.name} but shardctl did not create them there; drop them first`
          : `no schema of the batch on ${target.name}`,
  );
  add(
    'target initialised',
    targetInitialised,
    targetInitialised
      ? `${target.name} has the shardctl control schema`
      : `${target.name} has no shardctl control schema; run shardctl init first`,
  );

  let probe = false;
  const versions = [
    { num: input.source.serverVersionNum, text: input.source.serverVersion },
    { num: input.target.serverVersionNum, text: input.target.serverVersion },
  ] as const;
  if (mode === 'online') {
    const ok = versions.every((v) => v.num >= 150000);
    add(
      'versions',
      ok,
      `PostgreSQL ${versions[0].text} on ${source.name}, ${versions[1].text} on ${target.name}` +
        (ok ? '' : '; online mode needs 15 or later on both (use --mode offline)'),
    );
    const settings = (await reads.settings)!;
    const s = settings.rows[0]!;
    add(
      'wal_level',
      s.wal_level === 'logical',
      s.wal_level === 'logical'
        ? `wal_level=logical on ${source.name}`
        : `wal_level=${s.wal_level} on ${source.name}; set wal_level=logical and restart it, or use --mode offline`,
    );
    add(
      'replication slots',
      s.free_slots > 0 && s.free_senders > 0,
      `${s.free_slots} free replication slots and ${s.free_senders} free WAL senders on ${source.name}` +
        (s.free_slots > 0 && s.free_senders > 0 ? '' : '; raise max_replication_slots / max_wal_senders'),
    );
    const tables = (await reads.identities)!;
    const noIdentity = tables.rows.filter((t) => !t.identity).map((t) => t.name);
    add(
      'replica identity',
      noIdentity.length === 0,
      noIdentity.length === 0
        ? 'every table of the batch has a replica identity'
        : `${tableList(noIdentity)} ${inflect(noIdentity.length, 'has', 'have')} no replica identity; add a primary key or ALTER TABLE … REPLICA IDENTITY FULL, or use --mode offline`,
    );
    // Logical replication does not carry unlogged tables: their writes after the copy would be lost.
    const unlogged = tables.rows.filter((t) => !t.logged).map((t) => t.name);
    add(
      'logged tables',
      unlogged.length === 0,
      unlogged.length === 0
        ? 'every table of the batch is logged (replicated)'
        : `${tableList(unlogged)} ${inflect(unlogged.length, 'is', 'are')} UNLOGGED, which logical replication does not carry; ALTER TABLE … SET LOGGED, or use --mode offline (which copies them with writes fenced)`,
    );
    probe = input.probeReachability;
    if (!probe) add('target reaches source', true, 'not probed in --dry-run (it would create and drop a subscription)');
  } else {
    add('versions', true, `PostgreSQL ${versions[0].text} on ${source.name}, ${versions[1].text} on ${target.name}`);
  }

  const writable = await reads.writable;
  add(
    'config file',
    writable === null,
    writable === null
      ? `${input.configFile} will be rewritten at the switch`
      : `the map cannot be rewritten at the switch: ${writable}; the move would be stuck after the target went live`,
  );

  add(
    'no other move',
    running.length === 0,
    running.length === 0 ? `no move of these shards is running` : running.map(describeRunningMove).join('; '),
  );

  const schemaOf = (shard: number): string => shardSchemaName(config, shard);
  const shapes = [...(await reads.sourceShapes), ...(await targetShapesRead)];
  const handMade = await shapeDrift(
    new Map([
      [source.name, src],
      [target.name, dst],
    ]),
    shapes,
    schemaOf,
    new Set(shards),
  );
  add(
    'same tables as the migrations build',
    handMade.length === 0,
    handMade.length === 0
      ? `the tables of the batch match the other shards with the same migrations`
      : `${handMade.map((d) => shapeDriftMessage(d, schemaOf)).join('; ')}. The target copy is built by the migrations and could not take these rows: make the shard match its migrations, or change every shard with a migration`,
  );

  const sourcePrivileges = await reads.privileges;
  for (const check of await roleChecks(
    sourcePrivileges,
    dst,
    input.target.serverVersionNum,
    source.name,
    target.name,
    (schema) => shards[schemas.indexOf(schema)]!,
  ))
    checks.push(check);

  const applied = await reads.applied;
  const byShard = new Map<number, Map<number, string>>();
  for (const r of applied.rows) {
    let m = byShard.get(r.shard);
    if (!m) byShard.set(r.shard, (m = new Map<number, string>()));
    m.set(r.version, r.checksum);
  }
  const drifted = [...byShard].flatMap(([shard, versions]) =>
    shardDrift(versions, input.migrations).map((v) => ({ shard, v })),
  );
  add(
    'migrations',
    drifted.length === 0,
    drifted.length === 0
      ? `the same migration files will build the target copies`
      : `migration ${inflect(new Set(drifted.map((d) => d.v)).size, 'version')} ${[...new Set(drifted.map((d) => d.v))].join(', ')} applied to ${list([...new Set(drifted.map((d) => d.shard))])} ${inflect(drifted.length, 'has', 'have')} no matching file (changed or deleted); restore them first`,
  );
  const space = await reads.space;
  const needed = bytesPhrase(Number(space.rows[0]?.bytes ?? 0));
  // PostgreSQL has no SQL view of free disk space (pg_tablespace_size is what is used, not what is
  // left): said, not guessed.
  add(
    'target disk',
    true,
    `the copies need about ${needed} on ${target.name} (tables and indexes, from the source's catalog page counts); ` +
      `PostgreSQL cannot tell its free disk space through SQL, so check ${target.name}'s data directory has that much free`,
  );
  if (reads.walLimits) {
    const limits = (await reads.walLimits).rows[0]!;
    const keep = Number(limits.max_slot_wal_keep_size_mb);
    add(
      'source WAL limits',
      true,
      (keep < 0
        ? `max_slot_wal_keep_size is unlimited on ${source.name}: the move's slot keeps the WAL written from the copy's start until the target confirms it (bound it with --max-slot-wal)`
        : `max_slot_wal_keep_size = ${bytesPhrase(keep * 1024 * 1024)} on ${source.name}: a slot holding more WAL is invalidated and the move must start again (the copy stops before with --max-slot-wal below it)`) +
        `; wal_keep_size = ${bytesPhrase(Number(limits.wal_keep_size_mb) * 1024 * 1024)}`,
    );
  }
  // Last, and only when everything else passed: shardctl's own replication connection to the source
  // (the copy's snapshot needs one: a pooler refuses it), then a subscription created and dropped.
  if (probe && checks.every((c) => c.ok)) {
    const own = await probeReplicationConnection(source, src);
    add(
      'replication connection',
      own === null,
      own === null
        ? `shardctl can open a replication connection to ${source.name}`
        : `shardctl cannot open a replication connection to ${source.name}: ${own}` +
            (/unsupported startup parameter/i.test(own)
              ? `; that address looks like a connection pooler's: set ${source.name}'s directUrl to the server's own address`
              : ''),
    );
  }
  if (probe && checks.every((c) => c.ok)) {
    const reach = await probeSubscription(dst, source.replicationUrl);
    add(
      'target reaches source',
      reach === null,
      reach === null
        ? `${target.name} can connect to ${source.name} for replication`
        : /unsupported startup parameter/i.test(reach)
          ? `${target.name} cannot connect to ${source.name} at its replicationUrl: ${reach}; that address looks like a connection pooler's: set ${source.name}'s directUrl (or replicationUrl) to the server's own address`
          : `${target.name} cannot connect to ${source.name} at its replicationUrl: ${reach}; set hosts[].replicationUrl to an address ${target.name} can reach`,
    );
  } else if (probe) {
    add('target reaches source', true, 'not probed: other checks failed');
  }
  return { checks, sourcePrivileges };
}

/**
 * Roles are per cluster: every role the source's owners, ACLs and default privileges name must exist
 * on the target, and the connecting role there must be able to give objects to the owners (and set
 * default privileges for their roles): a superuser, or a member of each (on PostgreSQL 16 and later,
 * one that may SET ROLE to it).
 */
async function roleChecks(
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

function tableList(names: readonly string[]): string {
  const shown = names.slice(0, 5).join(', ');
  return `${inflect(names.length, 'table')} ${shown}${names.length > 5 ? ` and ${names.length - 5} more` : ''}`;
}

/** Null when the file and its folder (for the atomic rename) are writable; else why not. */
async function canRewrite(file: string): Promise<string | null> {
  if (file === '<inline>') return 'the config was not read from a file (pass configFile)';
  try {
    await access(file, constants.R_OK | constants.W_OK);
    await access(dirname(file), constants.W_OK);
    return null;
  } catch (error) {
    return (error as Error).message;
  }
}

/** Shards on the source that are not active: in a running move (named), or not recorded (init). */
function inactiveMessage(
  which: string,
  host: string,
  inactive: readonly { shard: number; state: string | null }[],
  running: readonly RunningMove[],
): string {
  const moves = running.filter((m) => inactive.some((r) => m.shards.includes(r.shard)));
  const be = inflect(inactive.length, 'is', 'are');
  if (moves.length > 0)
    return `${which} on ${host} ${be} ${inactive[0]!.state ?? 'not active'}: ${moves.map(describeRunningMove).join('; ')}`;
  if (inactive.every((r) => r.state === null))
    return `${which} on ${host} ${be} not recorded by shardctl; run shardctl init first`;
  return `${which} on ${host} ${be} ${inactive[0]!.state} and no unfinished move of ${inflect(inactive.length, 'it', 'them')} is recorded; run shardctl status to see why`;
}

interface RunningMove {
  readonly moveId: string;
  readonly shards: readonly number[];
  readonly source: string;
  readonly target: string;
  readonly step: string;
  /** An abort of it began and was cut off: it can only be aborted again. */
  readonly aborting: boolean;
}

async function runningMovesOf(client: pg.Client, shards: readonly number[]): Promise<RunningMove[]> {
  if (!(await controlTableExists(client, 'moves'))) return [];
  const r = await client.query<{
    move_id: string;
    shards: number[];
    source: string;
    target: string;
    step: string;
    aborting: boolean;
  }>(RUNNING_MOVES_OF_SQL, [shards]);
  return r.rows.map((row) => ({
    moveId: row.move_id,
    shards: row.shards,
    source: row.source,
    target: row.target,
    step: row.step,
    aborting: row.aborting,
  }));
}

/**
 * The unfinished move, named so that a second operator can tell it from theirs, and the commands
 * that finish or undo it.
 */
export function describeRunningMove(move: RunningMove): string {
  const shards = formatShardList([...move.shards]);
  return (
    `move ${move.moveId} (${inflect(move.shards.length, 'shard')} ${shards}, ${move.source} → ${move.target}, last step done: ${move.step}) is unfinished; ` +
    (move.aborting
      ? `its abort was cut off: finish the undo with shardctl move-shard ${shards} --abort`
      : `finish it with shardctl move-shard ${shards} --resume, or undo it with shardctl move-shard ${shards} --abort`)
  );
}

/**
 * Null when shardctl can open a replication connection (the kind the copy's snapshot is taken on)
 * to the address the source's session reached; else the error, redacted.
 */
async function probeReplicationConnection(host: HostConfig, session: pg.Client): Promise<string | null> {
  // node-postgres supports replication connections; its type definitions do not list the option.
  const config: pg.ClientConfig & { replication: string } = {
    connectionString: libpqCompatible(connectedUrl(host, session)),
    replication: 'database',
    application_name: 'shardctl move',
    ...hostClientSettings(host),
  };
  const client = new pg.Client(config);
  client.on('error', () => undefined);
  try {
    await client.connect();
    return null;
  } catch (error) {
    return describePgError(error);
  } finally {
    await endQuietly(client);
  }
}

/**
 * Null when the target could open a replication connection to the source; else the error. The probe
 * subscription is recorded in the control schema before it is created, so a run killed in between
 * leaves a leftover that status lists and gc or --abort removes (src/moves/leftovers.ts).
 */
async function probeSubscription(target: pg.Client, sourceUrl: string): Promise<string | null> {
  // Unique per call: the moves of a batch probe the same target at the same moment.
  const name = `shardctl_probe_${process.pid}_${randomBytes(4).toString('hex')}`;
  await target.query(recordObjectSql(name, 'probe-subscription'));
  try {
    await target.query(probeSubscriptionSql(name, sourceUrl));
    faultAfter('probe');
    await target.query(dropSubscriptionSql(name));
    return null;
  } catch (error) {
    // A failed CREATE SUBSCRIPTION leaves nothing to drop; on a broken connection the record below stays, a
    // leftover that gc and an abort remove.
    await target.query(dropSubscriptionSql(name, { ifExists: true })).catch(() => undefined);
    return (error as Error).message;
  } finally {
    // Fails only on a broken connection: the record then stays, a leftover that gc and an abort remove.
    await target.query(forgetObjectSql(name)).catch(() => undefined);
  }
}
