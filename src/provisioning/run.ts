import type pg from 'pg';
import type { HostConfig, ShardctlConfig } from '../config/types.js';
import { HostError, RuntimeFailure, ShardctlError } from '../errors.js';
import { readMigrations, type MigrationFile } from '../migrations/files.js';
import { connectHost, describePgError } from '../fleet/connect.js';
import { acquireRunnerLock, releaseRunnerLock } from '../fleet/locks.js';
import { readHostSnapshot, type HostSnapshot } from '../fleet/catalog.js';
import { executeHostPlan, type HostOutcome, type ProgressEvent } from './execute.js';
import { conflictError, findConflicts, planFleet, type Conflict, type Plan, type PlanOptions } from './plan.js';

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
  /** add-schema: the shards to provision. */
  readonly shards?: readonly number[];
  /** migrate --to. */
  readonly toVersion?: number;
  readonly onProgress?: (event: ProgressEvent) => void;
  /** Non-fatal news for a person (e.g. a host that could not be reached during migrate). */
  readonly onNotice?: (message: string) => void;
}

export interface ProvisionResult {
  readonly mode: ProvisionMode;
  readonly dryRun: boolean;
  readonly targetVersion: number;
  /** The plan that was (or, in a dry run, would be) executed; hosts left behind are not in it. */
  readonly plan: Plan;
  /** Empty in a dry run. */
  readonly hosts: readonly HostOutcome[];
  readonly ok: boolean;
  readonly durationMs: number;
}

/** What a read-only look at the fleet found: the plan, every conflict, and the hosts not read. */
export interface FleetInspection {
  readonly plan: Plan;
  readonly conflicts: readonly Conflict[];
  readonly lostHosts: readonly LostHost[];
}

export interface LostHost {
  readonly host: HostConfig;
  /** Without the `host <name>: ` prefix. */
  readonly message: string;
}

interface HostSession {
  readonly host: HostConfig;
  readonly client: pg.Client;
  locked: boolean;
}

interface Fleet {
  sessions: HostSession[];
  lost: LostHost[];
}

export async function provision(config: ShardctlConfig, mode: ProvisionMode, options: ProvisionOptions = {}): Promise<ProvisionResult> {
  const started = performance.now();
  const dryRun = options.dryRun ?? false;
  const migrations = await readMigrations(config.migrationsDir);
  const fleet = await connectAll(config.hosts);
  try {
    const tolerateLoss = mode === 'migrate';
    if (!tolerateLoss) requireAll(fleet);
    if (!dryRun) await lockAll(fleet, config, tolerateLoss);
    const snapshots = await readSnapshots(fleet, config, tolerateLoss);
    for (const lost of fleet.lost) options.onNotice?.(`host ${lost.host.name}: ${lost.message}; its shards are left behind`);
    const conflicts = findConflicts(config, snapshots, migrations, {
      ...(options.shards ? { shards: options.shards } : {}),
      checkDrift: true,
    });
    if (conflicts.length > 0) throw conflictError(conflicts);
    const plan = planFleet(config, snapshots, migrations, planOptionsFor(mode, options, snapshots, migrations));
    if (dryRun) {
      return { mode, dryRun, targetVersion: plan.targetVersion, plan, hosts: [], ok: true, durationMs: elapsed(started) };
    }
    const outcomes = await Promise.all(
      plan.hosts.map((hostPlan) => {
        const session = fleet.sessions.find((s) => s.host.name === hostPlan.host.name)!;
        return executeHostPlan(session.client, hostPlan, {
          concurrency: config.concurrency,
          lockTimeout: config.lockTimeout,
          ...(options.onProgress ? { onProgress: options.onProgress } : {}),
        });
      }),
    );
    const hosts = [...outcomes, ...fleet.lost.map(lostOutcome)];
    const ok = hosts.every((h) => h.hostError === null && h.failures.length === 0);
    return { mode, dryRun, targetVersion: plan.targetVersion, plan, hosts, ok, durationMs: elapsed(started) };
  } finally {
    await Promise.all(fleet.sessions.map((s) => closeSession(s)));
  }
}

/**
 * The read-only half of a migrate: connect, read every catalog, find conflicts and plan, without
 * the runner lock and without throwing on drift (`migrate --check` reports it with what is pending).
 */
export async function inspectFleet(config: ShardctlConfig, options: { toVersion?: number } = {}): Promise<FleetInspection> {
  const migrations = await readMigrations(config.migrationsDir);
  const fleet = await connectAll(config.hosts);
  try {
    const snapshots = await readSnapshots(fleet, config, true);
    const conflicts = findConflicts(config, snapshots, migrations, { checkDrift: true });
    const plan = planFleet(config, snapshots, migrations, planOptionsFor('migrate', options, snapshots, migrations));
    return { plan, conflicts, lostHosts: fleet.lost };
  } finally {
    await Promise.all(fleet.sessions.map((s) => closeSession(s)));
  }
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
      return { create: false, ...(options.toVersion === undefined ? {} : { toVersion: options.toVersion }) };
    case 'add-schema': {
      // "At the current migration level": the level the fleet's shards are at, not pending files.
      const level = fleetLevel(snapshots);
      const toVersion = level ?? migrations.at(-1)?.version;
      return { create: true, ...(options.shards ? { shards: options.shards } : {}), ...(toVersion ? { toVersion } : {}) };
    }
  }
}

/** The highest migration version applied to any shard on any host; null when no shard has any. */
export function fleetLevel(snapshots: readonly HostSnapshot[]): number | null {
  let level: number | null = null;
  for (const snapshot of snapshots) {
    for (const versions of snapshot.applied.values()) {
      for (const version of versions.keys()) if (level === null || version > level) level = version;
    }
  }
  return level;
}

async function connectAll(hosts: readonly HostConfig[]): Promise<Fleet> {
  const results = await Promise.allSettled(hosts.map((host) => connectHost(host, { applicationName: 'shardctl' })));
  const fleet: Fleet = { sessions: [], lost: [] };
  results.forEach((result, i) => {
    const host = hosts[i]!;
    if (result.status === 'fulfilled') fleet.sessions.push({ host, client: result.value, locked: false });
    else fleet.lost.push({ host, message: hostMessage(host, result.reason) });
  });
  return fleet;
}

/** Creating a schema is safe only when every host has been checked for another copy of it. */
function requireAll(fleet: Fleet): void {
  if (fleet.lost.length === 0) return;
  const [first] = fleet.lost;
  if (fleet.lost.length === 1) throw new HostError(first!.host.name, first!.message, { code: 'HOST_UNREACHABLE' });
  throw new RuntimeFailure(
    'HOST_UNREACHABLE',
    `${fleet.lost.length} hosts cannot be reached; nothing was written:\n${fleet.lost.map((l) => `  - host ${l.host.name}: ${l.message}`).join('\n')}`,
    { hosts: fleet.lost.map((l) => l.host.name) },
  );
}

/**
 * Takes the runner lock on every host, in config order. Another runner on any host stops the whole
 * run before anything is written (fail fast, whatever the mode); a host whose connection fails
 * here is left behind when the mode tolerates it.
 */
async function lockAll(fleet: Fleet, config: ShardctlConfig, tolerateLoss: boolean): Promise<void> {
  for (const session of [...fleet.sessions]) {
    try {
      await acquireRunnerLock(session.client, session.host.name, { workerWait: config.lockTimeout });
      session.locked = true;
    } catch (error) {
      if (error instanceof ShardctlError) throw error;
      loseHost(fleet, session, error, tolerateLoss, 'cannot take the runner lock');
    }
  }
}

async function readSnapshots(fleet: Fleet, config: ShardctlConfig, tolerateLoss: boolean): Promise<HostSnapshot[]> {
  const results = await Promise.allSettled(fleet.sessions.map((s) => readHostSnapshot(s.client, s.host, config)));
  const snapshots: HostSnapshot[] = [];
  for (const [i, session] of [...fleet.sessions].entries()) {
    const result = results[i]!;
    if (result.status === 'fulfilled') snapshots.push(result.value);
    else loseHost(fleet, session, result.reason, tolerateLoss);
  }
  return snapshots;
}

function loseHost(fleet: Fleet, session: HostSession, error: unknown, tolerate: boolean, doing?: string): void {
  if (!tolerate) throw error instanceof HostError ? error : new HostError(session.host.name, `${doing}: ${describePgError(error)}`, { cause: error });
  fleet.sessions.splice(fleet.sessions.indexOf(session), 1);
  fleet.lost.push({ host: session.host, message: `${doing ? `${doing}: ` : ''}${hostMessage(session.host, error)}` });
  void closeSession(session);
}

/** An error's message without the `host <name>: ` a HostError starts with. */
function hostMessage(host: HostConfig, error: unknown): string {
  const message = error instanceof ShardctlError ? error.message : describePgError(error);
  const prefix = `host ${host.name}: `;
  return message.startsWith(prefix) ? message.slice(prefix.length) : message;
}

async function closeSession(session: HostSession): Promise<void> {
  if (session.locked) await releaseRunnerLock(session.client).catch(() => undefined);
  await session.client.end().catch(() => undefined);
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
    hostError: lost.message,
    behind: lost.host.shards.length,
    durationMs: 0,
  };
}

function elapsed(started: number): number {
  return Math.round(performance.now() - started);
}
