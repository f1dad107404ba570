import { elapsed } from '../clock.js';
import { shardSchemaName, type ShardctlConfig } from '../config/types.js';
import { optionKeys } from '../config/validate.js';
import { readHostSnapshot, type HostSnapshot } from '../fleet/catalog.js';
import { randomUUID } from 'node:crypto';
import { controlSchemaSql, finishSlowPath } from '../fleet/control.js';
import {
  fleetRecord,
  lockAfterPlacement,
  readFleetPlacement,
  registerFleetSql,
  requireCurrentMap,
  requireCurrentMapLocked,
  type FleetPlacement,
} from '../fleet/placement.js';
import { loadConfig } from '../config/load.js';
import { Fleet, type LostHost } from '../fleet/session.js';
import { readMigrations, type MigrationFile } from '../migrations/files.js';
import { fleetLevel, pendingMigrations } from '../migrations/rules.js';
import { handMadeDrift } from '../migrations/shape.js';
import { executeHostPlan, FailureBudget, type HostOutcome, type ProgressEvent } from './execute.js';
import {
  canaryShards,
  conflictError,
  findConflicts,
  planFleet,
  type Conflict,
  type Plan,
  type PlanOptions,
} from './plan.js';

/**
 * The one code path behind init, add-schema and migrate: lock every host, read its catalog, plan,
 * refuse on any conflict before writing, then execute all hosts in parallel.
 *
 * init and add-schema need every host (a schema may be created only where no host holds a copy);
 * migrate goes on without a host it cannot reach, or that fails before its work starts, and
 * reports that host's shards as behind.
 */

export type ProvisionMode = 'init' | 'add-schema' | 'migrate';

export interface ProvisionOptions {
  readonly dryRun?: boolean;
  /** add-schema: the shards to provision; migrate: the shards of this stage (default: every shard). */
  readonly shards?: readonly number[];
  /** migrate: only this many shards with work to do, spread over the hosts (within `shards`). */
  readonly canary?: number;
  /** Stop starting shards once this many have failed, over all hosts (default: no limit). */
  readonly maxFailures?: number;
  /** How many times a step that met lock_timeout is tried again (default DEFAULT_LOCK_RETRIES). */
  readonly lockRetries?: number;
  /** The pause before each lock retry (default lockRetryPauseMs); tests shorten it. */
  readonly lockRetryPauseMs?: (retry: number) => number;
  /** migrate --to. */
  readonly toVersion?: number;
  readonly onProgress?: (event: ProgressEvent) => void;
  /** Non-fatal news for a person (e.g. a host that could not be reached during migrate). */
  readonly onNotice?: (message: string) => void;
}

/** The options init and add-schema take, as their functions declare them. */
export type CommonProvisionOptions = Pick<ProvisionOptions, 'dryRun' | 'onProgress' | 'onNotice'>;

/** The keys of CommonProvisionOptions (the compiler checks the record is whole). */
export const COMMON_PROVISION_FLAGS: { readonly [K in keyof Required<CommonProvisionOptions>]: true } = {
  dryRun: true,
  onProgress: true,
  onNotice: true,
};
export const COMMON_PROVISION_KEYS = optionKeys<CommonProvisionOptions>(COMMON_PROVISION_FLAGS);

export interface ProvisionResult {
  readonly mode: ProvisionMode;
  readonly dryRun: boolean;
  readonly targetVersion: number;
  /** The plan that was (or, in a dry run, would be) executed; hosts left behind are not in it. */
  readonly plan: Plan;
  /** In a dry run, only the hosts that could not be read (each with its hostError). */
  readonly hosts: readonly HostOutcome[];
  /**
   * A staged migrate (shards, canary): the shards this run took on, and how many shards with work to
   * do it left to later stages. Null when the run covered every shard.
   */
  readonly stage: {
    readonly shards: readonly number[];
    readonly canary: boolean;
    readonly pendingElsewhere: number;
    /** A canary: the shards that already had the file being rolled out (they count towards it). */
    readonly reached?: readonly number[];
  } | null;
  /** The failure limit stopped the run: shards were left without being started. */
  readonly stoppedEarly: boolean;
  readonly ok: boolean;
  readonly durationMs: number;
}

/** What a read-only look at the fleet found: the plan, every conflict, and the hosts not read. */
export interface FleetInspection {
  readonly plan: Plan;
  readonly conflicts: readonly Conflict[];
  readonly lostHosts: readonly LostHost[];
  /** What each host that was read holds. */
  readonly snapshots: readonly HostSnapshot[];
  /** Shards whose tables differ from the others' of the same migrations (a change by hand), as status says. */
  readonly handMade: readonly string[];
}

export async function provision(
  given: ShardctlConfig,
  mode: ProvisionMode,
  options: ProvisionOptions = {},
): Promise<ProvisionResult> {
  const started = performance.now();
  const dryRun = options.dryRun ?? false;
  const migrations = await readMigrations(given.migrationsDir);
  const fleet = await Fleet.open(given.hosts);
  try {
    const tolerateLoss = mode === 'migrate';
    if (!tolerateLoss) fleet.requireAll();
    // With the placement from before the locks: what a move that finishes while this run waits changes.
    const before = dryRun
      ? undefined
      : await lockAfterPlacement(fleet, { lockTimeout: given.lockTimeout, tolerateLoss });
    let snapshots = await fleet.each((s) => readHostSnapshot(s, given), { tolerateLoss });
    for (const lost of fleet.lost)
      options.onNotice?.(`host ${lost.host.name}: ${lost.reason}; its shards are left behind`);
    const placement = await readFleetPlacement(fleet);
    // A run that waited for the runner locks behind a move read its map before the move's switch:
    // the shard lists as the fleet or the rewritten file has them now, as gc and rebalance do.
    let config = given;
    if (dryRun) requireCurrentMap(given, placement);
    else config = await requireCurrentMapLocked(given, placement, (file) => loadConfig(file), before);
    if (config !== given) {
      const hostNamed = new Map(config.hosts.map((h) => [h.name, h]));
      snapshots = snapshots.map((snapshot) => ({ ...snapshot, host: hostNamed.get(snapshot.host.name)! }));
    }
    // Drift is looked for on every shard whatever the stage; the rest only where this run writes.
    const conflicts = findConflicts(config, snapshots, migrations, {
      ...(options.shards ? { shards: options.shards } : {}),
      checkDrift: true,
    });
    if (conflicts.length > 0) throw conflictError(conflicts);
    const { plan, stage } = stagedPlan(config, snapshots, migrations, mode, options);
    if (dryRun) {
      // A host that could not be read has no plan: the dry run cannot say what the real run would do there.
      return {
        mode,
        dryRun,
        targetVersion: plan.targetVersion,
        plan,
        hosts: fleet.lost.map(lostOutcome),
        stage,
        stoppedEarly: false,
        ok: fleet.lost.length === 0,
        durationMs: elapsed(started),
      };
    }
    const failureBudget = new FailureBudget(options.maxFailures ?? null);
    const outcomes = await Promise.all(
      plan.hosts.map((hostPlan) => {
        return executeHostPlan(fleet.session(hostPlan.host.name).client, hostPlan, {
          concurrency: config.concurrency,
          lockTimeout: config.lockTimeout,
          failureBudget,
          ...(options.lockRetries === undefined ? {} : { lockRetries: options.lockRetries }),
          ...(options.lockRetryPauseMs ? { lockRetryPauseMs: options.lockRetryPauseMs } : {}),
          ...(options.onProgress ? { onProgress: options.onProgress } : {}),
        });
      }),
    );
    if (mode !== 'migrate') await recordFleet(config, fleet, placement, outcomes);
    await finishSlowPaths(config, fleet, outcomes);
    const hosts = [...outcomes, ...fleet.lost.map(lostOutcome)];
    const stoppedEarly = hosts.some((h) => h.notStarted > 0);
    const ok = hosts.every((h) => h.hostError === null && h.failures.length === 0 && h.notStarted === 0);
    return {
      mode,
      dryRun,
      targetVersion: plan.targetVersion,
      plan,
      hosts,
      stage,
      stoppedEarly,
      ok,
      durationMs: elapsed(started),
    };
  } finally {
    await fleet.close();
  }
}

/**
 * The read-only half of a migrate: connect, read every catalog, find conflicts and plan, without
 * the runner lock and without throwing on drift (`migrate --check` reports it with what is pending).
 */
export async function inspectFleet(
  config: ShardctlConfig,
  options: { toVersion?: number } = {},
): Promise<FleetInspection> {
  const migrations = await readMigrations(config.migrationsDir);
  const fleet = await Fleet.open(config.hosts);
  try {
    const snapshots = await fleet.each((s) => readHostSnapshot(s, config), { tolerateLoss: true });
    requireCurrentMap(config, await readFleetPlacement(fleet));
    const conflicts = findConflicts(config, snapshots, migrations, { checkDrift: true });
    const plan = planFleet(config, snapshots, migrations, planOptionsFor('migrate', options, snapshots, migrations));
    // The drift status reports that the files' checksums cannot show: a column added or dropped by hand.
    const handMade = await fleet.each(
      async (s) => {
        const snapshot = snapshots.find((n) => n.host.name === s.host.name);
        if (!snapshot || snapshot.layout === null) return [];
        return handMadeDrift(
          s.client,
          s.host.name,
          (shard) => shardSchemaName(config, shard),
          (shard) => {
            const next = pendingMigrations(snapshot.applied.get(shard), migrations)[0];
            return next?.noTransaction ? next.name : undefined;
          },
        );
      },
      { tolerateLoss: true },
    );
    return { plan, conflicts, lostHosts: fleet.lost, snapshots, handMade: handMade.flat() };
  } finally {
    await fleet.close();
  }
}

/**
 * The plan of this run, and for a staged migrate what it leaves to later stages. A canary is
 * chosen from the plan of the whole selection, so it takes shards that still have work to do.
 */
function stagedPlan(
  config: ShardctlConfig,
  snapshots: readonly HostSnapshot[],
  migrations: readonly MigrationFile[],
  mode: ProvisionMode,
  options: ProvisionOptions,
): { plan: Plan; stage: ProvisionResult['stage'] } {
  const planOptions = planOptionsFor(mode, options, snapshots, migrations);
  if (mode !== 'migrate' || (options.shards === undefined && options.canary === undefined)) {
    return { plan: planFleet(config, snapshots, migrations, planOptions), stage: null };
  }
  const { shards: _selection, ...everyShard } = planOptions;
  const whole = planFleet(config, snapshots, migrations, everyShard);
  let plan = options.shards ? planFleet(config, snapshots, migrations, planOptions) : whole;
  let reached: readonly number[] = [];
  if (options.canary !== undefined) {
    // The shards that already have the file being rolled out (an earlier run of this canary,
    // stopped or not) count towards it: the same command run again finishes the canary, it does
    // not start a second one.
    reached = shardsWithRollingFile(plan, snapshots, planOptions.shards);
    const more = canaryShards(plan, Math.max(0, options.canary - reached.length));
    plan = planFleet(config, snapshots, migrations, { ...everyShard, shards: more });
  }
  const chosen = plan.hosts.flatMap((h) => h.jobs.map((j) => j.shard)).sort((a, b) => a - b);
  const pendingElsewhere = whole.hosts.reduce((n, h) => n + h.jobs.length, 0) - chosen.length;
  return {
    plan,
    stage: {
      shards: chosen,
      canary: options.canary !== undefined,
      pendingElsewhere,
      ...(options.canary !== undefined ? { reached } : {}),
    },
  };
}

/**
 * For a canary: the shards (of `selection`, all when undefined) that already have the file the
 * rollout is at, the lowest version `plan` has pending on some shard.
 */
function shardsWithRollingFile(
  plan: Plan,
  snapshots: readonly HostSnapshot[],
  selection: readonly number[] | undefined,
): number[] {
  const versions = plan.hosts.flatMap((h) => h.jobs.flatMap((j) => j.migrations.map((m) => m.version)));
  if (versions.length === 0) return [];
  const rolling = versions.reduce((a, b) => Math.min(a, b));
  const wanted = selection ? new Set(selection) : null;
  return snapshots
    .flatMap((s) => s.host.shards.filter((shard) => s.applied.get(shard)?.has(rolling) === true))
    .filter((shard) => wanted === null || wanted.has(shard))
    .sort((a, b) => a - b);
}

/**
 * After init or add-schema: every host that finished records the fleet (id, registry, placement
 * copy). A host whose control schema predates the fleet tables gets them first (control.sql is
 * idempotent).
 */
async function recordFleet(
  config: ShardctlConfig,
  fleet: Fleet,
  placement: FleetPlacement,
  outcomes: readonly HostOutcome[],
): Promise<void> {
  const record = fleetRecord(config, placement, randomUUID);
  await Promise.all(
    fleet.sessions
      .filter((session) => outcomes.find((o) => o.host === session.host.name)?.hostError === null)
      .map(async (session) => {
        const view = placement.views.find((v) => v.reachedAs === session.host.name);
        if (!view?.fleet) await session.client.query(controlSchemaSql(config));
        await session.client.query(registerFleetSql({ ...record, hostName: session.host.name }));
      }),
  );
}

/**
 * next_id's slow path changed over to its table lock on every host that finished (finishSlowPath in
 * src/fleet/control.ts). Not an error when it cannot be yet (a transaction from before the change is
 * still running) or fails: the slow path is correct meanwhile, at the earlier cost, and the next run
 * tries again.
 */
async function finishSlowPaths(config: ShardctlConfig, fleet: Fleet, outcomes: readonly HostOutcome[]): Promise<void> {
  await Promise.all(
    fleet.sessions
      .filter((session) => outcomes.find((o) => o.host === session.host.name)?.hostError === null)
      .map((session) => finishSlowPath(session.client, config)),
  );
}

function planOptionsFor(
  mode: ProvisionMode,
  options: Pick<ProvisionOptions, 'shards' | 'toVersion'>,
  snapshots: readonly HostSnapshot[],
  migrations: readonly MigrationFile[],
): PlanOptions {
  switch (mode) {
    case 'init':
      return { create: true };
    case 'migrate':
      return {
        create: false,
        ...(options.shards ? { shards: options.shards } : {}),
        ...(options.toVersion === undefined ? {} : { toVersion: options.toVersion }),
      };
    case 'add-schema': {
      // "At the current migration level": the level the fleet's shards are at, not pending files.
      const level = fleetLevel(snapshots.map((s) => s.applied));
      const toVersion = level ?? migrations.at(-1)?.version;
      return {
        create: true,
        ...(options.shards ? { shards: options.shards } : {}),
        ...(toVersion ? { toVersion } : {}),
      };
    }
  }
}

function lostOutcome(lost: LostHost): HostOutcome {
  return {
    host: lost.host.name,
    shardsCreated: 0,
    nextIdInstalled: 0,
    migrationsApplied: 0,
    shardsChanged: 0,
    upToDate: 0,
    failures: [],
    lockWaits: [],
    notStarted: 0,
    hostError: lost.reason,
    behind: lost.host.shards.length,
    durationMs: 0,
  };
}
