import type pg from 'pg';
import { shardsPhrase } from '../config/ranges.js';
import type { ShardctlConfig } from '../config/types.js';
import { hostForShard, shardSchemaName } from '../config/types.js';
import { abortingMoveIds, controlTableExists } from '../fleet/control.js';
import type { HostSession } from '../fleet/session.js';
import type { MigrationFile } from '../migrations/files.js';
import { shardDrift } from '../migrations/rules.js';
import { evenSample, readShardShapes, shapeDrift, shapeDriftMessage, shapesAgree } from '../migrations/shape.js';
import type { PrivilegeObject } from './privileges.js';
import {
  APPLIED_CHECKSUMS_SQL,
  CATALOG_BYTES_SQL,
  REPLICATION_SETTINGS_SQL,
  SOURCE_SHARD_STATES_SQL,
  targetShardStatesSql,
  WAL_LIMITS_SQL,
} from './sql/preflight.js';
import { shardPrivileges, REPLICA_IDENTITIES_SQL } from './catalog.js';
import type { MoveMode } from './state.js';
import { bytesPhrase, inflect } from '../text.js';
import { onlineChecks } from './preflight-online.js';
import { LOGICAL_WORKERS_SQL } from './sql/replication.js';
import { awaitedLater } from '../promises.js';
import type { PreflightCheck } from './preflight-check.js';
import { canRewrite, reachabilityChecks } from './preflight-probes.js';
import { databaseChecks, replicaRoleCheck, roleChecks } from './preflight-roles.js';
import { describeRunningMove, inactiveMessage, runningMovesOf } from './running-moves.js';

export type { PreflightCheck } from './preflight-check.js';

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

/** The other shards of each host whose shapes the batch's are compared with first (evenSample). */
const SHAPE_SAMPLE = 64;

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

  // The shapes of the batch, compared with a sample of the hosts' other shards: a host of thousands
  // of shards read whole is the preflight's longest read. Read whole only when they differ.
  const batch = new Set(shards);
  const sourceSample = evenSample(source.shards, SHAPE_SAMPLE, batch);
  const targetSample = evenSample(target.shards, SHAPE_SAMPLE, batch);

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
    workers:
      mode === 'online' ? awaitedLater(dst.query<{ workers: number; slots: number }>(LOGICAL_WORKERS_SQL)) : null,
    identities:
      mode === 'online'
        ? awaitedLater(
            src.query<{ name: string; identity: boolean; logged: boolean }>(REPLICA_IDENTITIES_SQL, [schemas]),
          )
        : null,
    sourceShapes: awaitedLater(readShardShapes(src, source.name, [...shards, ...sourceSample])),
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
    reads.targetInitialised.then((initialised) =>
      sameMajor && initialised ? readShardShapes(dst, target.name, targetSample) : [],
    ),
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
    const settings = (await reads.settings)!.rows[0]!;
    const tables = (await reads.identities)!.rows;
    const workers = (await reads.workers)!.rows[0]!;
    checks.push(...onlineChecks(versions, source.name, target.name, settings, tables, workers));
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
  let shapes = [...(await reads.sourceShapes), ...(await targetShapesRead)];
  if (!shapesAgree(shapes, batch))
    // Both hosts whole, at once (each on its own session).
    shapes = (
      await Promise.all([
        readShardShapes(src, source.name),
        sameMajor && targetInitialised ? readShardShapes(dst, target.name) : [],
      ])
    ).flat();
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
  checks.push(...(await databaseChecks(mode === 'online', src, dst, source.name, target.name)));
  checks.push(await replicaRoleCheck(src, dst, input.target.serverVersionNum, schemas, target.name));

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
  await reachabilityChecks(probe, checks, source, target, src, dst);
  return { checks, sourcePrivileges };
}
