import type { HostConfig, ShardctlConfig } from '../config/types.js';
import { hostForShard, shardSchemaName } from '../config/types.js';
import { ConfigError, finishMove, RuntimeFailure, ShardctlError, UsageError, type NextStep } from '../errors.js';
import { ID_FUNCTION_VERSION } from '../id/sql.js';
import { formatShardList, shardsPhrase } from '../config/ranges.js';
import type { MigrationFile } from '../migrations/files.js';
import type { HostSnapshot, MovingShard } from '../fleet/catalog.js';
import { abortingMoveIds, CONTROL_VERSION, controlSchemaSql } from '../fleet/control.js';
import { createShardSql, recordShardSql, reinstallNextIdSql } from '../fleet/sql.js';
import { DRIFT_KINDS, driftProblems, pendingMigrations, type DriftKind } from '../migrations/rules.js';
import { migrationSql, noTransactionMigrationSteps } from '../migrations/sql.js';
import { inflect } from '../text.js';

/**
 * Plan, then execute: from the config, the live catalogs and the migration files, compute what
 * must change on each host. The same planner serves init, add-schema, migrate, status and
 * --dry-run, so what a dry run prints is what a run does.
 */

export interface PlanOptions {
  /** Create mapped shards that do not exist yet (init, add-schema), or only migrate (migrate). */
  readonly create: boolean;
  /** Limit to these shards (add-schema). */
  readonly shards?: readonly number[];
  /** Apply migrations up to and including this version (default: the latest file). */
  readonly toVersion?: number;
}

/**
 * One unit of work on one shard. Step SQL is rendered when it is read (getters), so a plan over
 * 8192 shards does not hold every shard's SQL in memory at once.
 */
export interface ShardJob {
  readonly shard: number;
  /** The shard's schema name (unquoted), e.g. to find who holds a lock in it. */
  readonly schema: string;
  readonly creates: boolean;
  readonly reinstallsNextId: boolean;
  readonly migrations: readonly MigrationFile[];
  readonly steps: readonly JobStep[];
}

export interface JobStep {
  /** What a person is told when this step fails, e.g. `migration 0002_likes`. */
  readonly label: string;
  readonly sql: string;
  /** A migration whose record proves the step ran (used to find the failed step of a batch). */
  readonly version?: number;
  /** The lock_timeout the step runs with, when it is not the config's (a migration's marker). */
  readonly lockTimeout?: string;
  /** Must be sent on its own, outside any transaction (no-transaction migrations). */
  readonly alone?: boolean;
  /** The step writes the shard's row in the control schema (its proof, like a migration's record). */
  readonly recordsShard?: boolean;
}

export interface HostPlan {
  readonly host: HostConfig;
  /** Mapped shards whose schema does not exist on the host. */
  readonly missingShards: readonly number[];
  /** SQL creating the control schema, when it is missing or incomplete. */
  readonly controlSql: string | null;
  readonly jobs: readonly ShardJob[];
  /** Mapped shards already at the target level with the current next_id. */
  readonly upToDate: number;
}

export interface Plan {
  readonly hosts: readonly HostPlan[];
  readonly migrations: readonly MigrationFile[];
  readonly targetVersion: number;
}

/** A problem that stops a run before anything is written, with the exit code it deserves. */
export interface Conflict {
  readonly kind: 'layout' | 'misplaced' | 'foreign-schema' | 'moving' | DriftKind;
  readonly host: string;
  readonly message: string;
  /** What resolves it, when a command of shardctl does (the message says it in words). */
  readonly next?: readonly NextStep[];
}

export function planFleet(
  config: ShardctlConfig,
  snapshots: readonly HostSnapshot[],
  migrations: readonly MigrationFile[],
  options: PlanOptions,
): Plan {
  const targetVersion = resolveTarget(migrations, options.toVersion);
  const wanted = options.shards ? new Set(options.shards) : null;
  const target = migrations.filter((m) => m.version <= targetVersion);
  const hosts = snapshots.map((snapshot) => planHost(config, snapshot, target, options.create, wanted));
  return { hosts, migrations, targetVersion };
}

/**
 * A canary: `count` shards with work to do, spread over the hosts (each host's first shard, then
 * each host's second, ...), so that a migration meets every host's server before it meets all shards.
 */
export function canaryShards(plan: Plan, count: number): number[] {
  const chosen: number[] = [];
  for (let i = 0; chosen.length < count; i++) {
    const round = plan.hosts.filter((h) => i < h.jobs.length).map((h) => h.jobs[i]!.shard);
    if (round.length === 0) break;
    chosen.push(...round.slice(0, count - chosen.length));
  }
  return chosen.sort((a, b) => a - b);
}

function lockTimeoutOf(migration: MigrationFile): { lockTimeout?: string } {
  return migration.lockTimeout ? { lockTimeout: migration.lockTimeout } : {};
}

function resolveTarget(migrations: readonly MigrationFile[], toVersion: number | undefined): number {
  const latest = migrations.at(-1)?.version ?? 0;
  if (toVersion === undefined) return latest;
  if (!migrations.some((m) => m.version === toVersion)) {
    throw new UsageError(`no migration file has version ${toVersion}`, { input: 'toVersion', value: toVersion });
  }
  return toVersion;
}

function planHost(
  config: ShardctlConfig,
  snapshot: HostSnapshot,
  target: readonly MigrationFile[],
  create: boolean,
  wanted: ReadonlySet<number> | null,
): HostPlan {
  const jobs: ShardJob[] = [];
  let upToDate = 0;
  const fresh = snapshot.layout === null;
  for (const shard of snapshot.host.shards) {
    if (wanted && !wanted.has(shard)) continue;
    const exists = snapshot.schemas.has(shard);
    const recorded = snapshot.recorded.has(shard);
    if (!exists && !create) continue;
    // A recorded shard whose schema is gone was dropped by hand: its records describe nothing.
    const applied = exists ? snapshot.applied.get(shard) : undefined;
    const pending = pendingMigrations(applied, target);
    const steps: JobStep[] = [];
    let creates = false;
    let reinstalls = false;
    if (!exists) {
      creates = true;
      const stale = recorded || snapshot.applied.has(shard);
      steps.push({
        label: 'create schema',
        // Stale rows exist before the step runs, so they cannot prove it ran.
        recordsShard: !stale,
        get sql() {
          return createShardSql(config, shard, stale);
        },
      });
    } else {
      if (!recorded)
        steps.push({
          label: 'record shard',
          recordsShard: true,
          get sql() {
            return recordShardSql(config, shard);
          },
        });
      if (snapshot.schemas.get(shard)!.nextIdVersion !== ID_FUNCTION_VERSION) {
        reinstalls = true;
        steps.push({
          label: 'install next_id',
          get sql() {
            return reinstallNextIdSql(config, shard);
          },
        });
      }
    }
    for (const migration of pending) {
      if (migration.noTransaction) {
        for (const sql of noTransactionMigrationSteps(config, shard, migration)) {
          steps.push({
            label: `migration ${migration.name}`,
            sql,
            version: migration.version,
            alone: true,
            ...lockTimeoutOf(migration),
          });
        }
      } else {
        steps.push({
          label: `migration ${migration.name}`,
          version: migration.version,
          ...lockTimeoutOf(migration),
          get sql() {
            return migrationSql(config, shard, migration);
          },
        });
      }
    }
    if (steps.length === 0) {
      upToDate += 1;
      continue;
    }
    jobs.push({
      shard,
      schema: shardSchemaName(config, shard),
      creates,
      reinstallsNextId: reinstalls,
      migrations: pending,
      steps,
    });
  }
  const needsControl = fresh || snapshot.recorded.size === 0;
  // A control schema of an earlier version is brought up to this one's (its steps are idempotent).
  const outdated = (snapshot.layout?.controlVersion ?? 0) < CONTROL_VERSION;
  const controlSql = fresh || outdated || (needsControl && jobs.length > 0) ? controlSchemaSql(config) : null;
  const missingShards = snapshot.host.shards.filter((s) => !snapshot.schemas.has(s));
  return { host: snapshot.host, missingShards, controlSql, jobs, upToDate };
}

/**
 * Everything that must stop a run before it writes anything: a host built with another layout, a
 * mapped shard whose schema lives on another host, a schema shardctl did not create, and migration
 * drift (a changed or deleted file for an applied version).
 */
export function findConflicts(
  config: ShardctlConfig,
  snapshots: readonly HostSnapshot[],
  migrations: readonly MigrationFile[],
  options: { shards?: readonly number[]; checkDrift: boolean },
): Conflict[] {
  const conflicts: Conflict[] = [];
  const wanted = options.shards ? new Set(options.shards) : null;
  for (const snapshot of snapshots) {
    conflicts.push(...layoutConflicts(config, snapshot));
  }
  conflicts.push(...movingShards(snapshots, wanted));
  conflicts.push(...misplacedShards(config, snapshots, wanted));
  for (const snapshot of snapshots) {
    const foreign = handBuiltShards(
      snapshot,
      snapshot.host.shards.filter((s) => !wanted || wanted.has(s)),
    );
    if (foreign.length > 0) {
      conflicts.push({
        kind: 'foreign-schema',
        host: snapshot.host.name,
        message:
          `host ${snapshot.host.name}: ${inflect(foreign.length, 'schema')} for ${inflect(foreign.length, 'shard')} ` +
          `${formatShardList(foreign)} ${inflect(foreign.length, 'exists', 'exist')} but shardctl did not create ${inflect(foreign.length, 'it', 'them')} ` +
          `(no next_id, no record in shardctl.shards); adopt ${inflect(foreign.length, 'it', 'them')} (a fleet built from the Instagram article), ` +
          `drop ${inflect(foreign.length, 'it', 'them')}, or choose another schemaPrefix`,
        next: [{ action: 'adopt', shards: foreign }],
      });
    }
  }
  if (options.checkDrift) {
    for (const snapshot of snapshots)
      conflicts.push(
        ...driftProblems(snapshot.host.name, existingApplied(snapshot), snapshot.appliedNames, migrations),
      );
  }
  return conflicts;
}

/**
 * Of `shards`, those whose schema exists on the host but that shardctl neither created nor took
 * over: no next_id(seq) of its own and no record in the control schema (a fleet built by hand from
 * the Instagram article, or shards a killed or partial `adopt` did not reach). init refuses them,
 * adopt takes them over.
 */
export function handBuiltShards(snapshot: HostSnapshot, shards: readonly number[]): number[] {
  return shards.filter((s) => snapshot.schemas.get(s)?.nextIdVersion === null && !snapshot.recorded.has(s));
}

/** The applied migrations of the shards whose schema exists (records of a dropped schema are stale). */
export function existingApplied(snapshot: HostSnapshot): Map<number, ReadonlyMap<number, string>> {
  const existing = new Map<number, ReadonlyMap<number, string>>();
  for (const [shard, versions] of snapshot.applied) if (snapshot.schemas.has(shard)) existing.set(shard, versions);
  return existing;
}

function layoutConflicts(config: ShardctlConfig, snapshot: HostSnapshot): Conflict[] {
  const recorded = snapshot.layout;
  if (!recorded) return [];
  const differences: string[] = [];
  const layout = config.idLayout;
  if (recorded.schemaPrefix !== config.schemaPrefix)
    differences.push(`schemaPrefix ${recorded.schemaPrefix} (config: ${config.schemaPrefix})`);
  if (recorded.shardCount !== config.shards)
    differences.push(`shards ${recorded.shardCount} (config: ${config.shards})`);
  if (recorded.epochMs !== layout.epochMs) {
    differences.push(`idLayout.epoch ${new Date(Number(recorded.epochMs)).toISOString()} (config: ${config.epochIso})`);
  }
  if (recorded.shardBits !== layout.shardBits)
    differences.push(`idLayout.shardBits ${recorded.shardBits} (config: ${layout.shardBits})`);
  if (recorded.sequenceBits !== layout.sequenceBits) {
    differences.push(`idLayout.sequenceBits ${recorded.sequenceBits} (config: ${layout.sequenceBits})`);
  }
  if (differences.length === 0) return [];
  return [
    {
      kind: 'layout',
      host: snapshot.host.name,
      message:
        `host ${snapshot.host.name} was built with ${differences.join(', ')}; changing these would route keys to the wrong ` +
        `shards or repeat ids, so shardctl refuses (restore the config's values)`,
    },
  ];
}

/**
 * Shards in an unfinished move: changing them now (a migration on one copy only, a re-created
 * schema) would make the two copies differ. Named with the move, and how to finish or undo it.
 */
function movingShards(snapshots: readonly HostSnapshot[], wanted: ReadonlySet<number> | null): Conflict[] {
  return [...unfinishedMoves(snapshots, (shard) => !wanted || wanted.has(shard))].map(([moveId, m]) => {
    const shards = formatShardList(m.shards);
    return {
      kind: 'moving' as const,
      host: m.source,
      message:
        `${inflect(m.shards.length, 'shard')} ${shards} ${inflect(m.shards.length, 'is', 'are')} in the unfinished move ${moveId} from ${m.source} to ${m.target} (last step done: ${m.step}); ` +
        `${finishing(m.aborting)}, then run this again`,
      next: finishMove(m.shards, m.aborting),
    };
  });
}

/** The unfinished moves the hosts record, by move id, with the shards of theirs that `include` keeps (ascending). */
function unfinishedMoves(
  snapshots: readonly HostSnapshot[],
  include: (shard: number, move: MovingShard) => boolean,
): Map<string, MovingShard & { shards: number[] }> {
  const aborting = abortingMoveIds(snapshots.flatMap((s) => [...s.moving.values()]));
  const moves = new Map<string, MovingShard & { shards: number[] }>();
  for (const snapshot of snapshots) {
    for (const [shard, move] of snapshot.moving) {
      if (!include(shard, move)) continue;
      let entry = moves.get(move.moveId);
      if (!entry) moves.set(move.moveId, (entry = { ...move, aborting: aborting.has(move.moveId), shards: [] }));
      if (!entry.shards.includes(shard)) entry.shards.push(shard);
    }
  }
  for (const m of moves.values()) m.shards.sort((a, b) => a - b);
  return moves;
}

/** What finishes an unfinished move, in words (finishMove says it as data). */
function finishing(aborting: boolean): string {
  return aborting ? 'its abort was cut off: finish the undo (abort)' : 'finish it (resume) or undo it (abort)';
}

/**
 * What to do about misplaced shards. While a move runs, "move them" is the wrong advice: the
 * running move is named with the commands that finish or undo it.
 */
function misplacedAdvice(
  misplaced: readonly number[],
  host: string,
  snapshots: readonly HostSnapshot[],
): { text: string; next: NextStep[] } {
  const running = unfinishedMoves(snapshots, (_, move) => move.source === host || move.target === host);
  if (running.size === 0)
    return {
      text: `Move ${inflect(misplaced.length, 'it', 'them')} to the host the map names, or fix the map`,
      next: [{ action: 'move', shards: misplaced }],
    };
  const moves = [...running].map(([moveId, m]) => ({
    text: `move ${moveId} (${shardsPhrase(m.shards)}, ${m.source} → ${m.target}, last step done: ${m.step}${m.aborting ? ', its abort cut off: abort it again' : ''})`,
    next: finishMove(m.shards, m.aborting),
  }));
  return {
    text: `A move on ${host} is unfinished; finish it (resume) or undo it (abort) first, then run this again: ${moves.map((m) => m.text).join('; ')}`,
    next: moves.flatMap((m) => m.next),
  };
}

function misplacedShards(
  config: ShardctlConfig,
  snapshots: readonly HostSnapshot[],
  wanted: ReadonlySet<number> | null,
): Conflict[] {
  const conflicts: Conflict[] = [];
  for (const snapshot of snapshots) {
    const misplaced: number[] = [];
    for (const shard of snapshot.schemas.keys()) {
      if (wanted && !wanted.has(shard)) continue;
      if (shard >= config.shards) continue;
      const mapped = hostForShard(config, shard);
      if (!mapped || mapped.name === snapshot.host.name) continue;
      // A fenced copy is the old side of a finished move: it stays until gc and is not live. A copy in
      // an unfinished move is reported as such (movingShards).
      if (snapshot.recorded.get(shard)?.state === 'fenced' || snapshot.moving.has(shard)) continue;
      misplaced.push(shard);
    }
    if (misplaced.length === 0) continue;
    misplaced.sort((a, b) => a - b);
    const owners = [...new Set(misplaced.map((s) => hostForShard(config, s)!.name))].join(', ');
    const advice = misplacedAdvice(misplaced, snapshot.host.name, snapshots);
    conflicts.push({
      kind: 'misplaced',
      host: snapshot.host.name,
      message:
        `${shardsPhrase(misplaced)} ${inflect(misplaced.length, 'is', 'are')} mapped to ${owners} ` +
        `but ${inflect(misplaced.length, 'its schema exists', 'their schemas exist')} on host ${snapshot.host.name} ` +
        `(e.g. ${shardSchemaName(config, misplaced[0]!)}); creating ${inflect(misplaced.length, 'it', 'them')} again would split the data. ` +
        advice.text,
      next: advice.next,
    });
  }
  return conflicts;
}

/** Turns conflicts into the error a command throws: drift is a check failure (3), the rest stop the run (1 or 2). */
export function conflictError(conflicts: readonly Conflict[]): ShardctlError {
  const messages = conflicts.map((c) => c.message);
  const data = { conflicts: conflicts.map((c) => ({ ...c })) };
  if (conflicts.every((c) => c.kind === 'layout')) {
    // The config disagrees with what the hosts were built with: a config error (exit 2), each
    // message naming the fields and both values.
    return new ConfigError(
      'the config',
      conflicts.map((c) => ({ path: '', message: c.message })),
    );
  }
  if (conflicts.every((c) => DRIFT_KINDS.has(c.kind))) {
    return new ShardctlError(
      'MIGRATION_DRIFT',
      `migration drift: nothing was applied\n${messages.map((m) => `  - ${m}`).join('\n')}`,
      {
        exitCode: 3,
        details: messages,
        data,
      },
    );
  }
  const next = conflicts.flatMap((c) => c.next ?? []);
  return new RuntimeFailure(
    'CONFLICT',
    `refusing to run, nothing was written:\n${messages.map((m) => `  - ${m}`).join('\n')}`,
    data,
    messages,
    next,
  );
}
