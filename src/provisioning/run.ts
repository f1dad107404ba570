import type pg from 'pg';
import type { HostConfig, ShardctlConfig } from '../config/types.js';
import { HostError, RuntimeFailure } from '../errors.js';
import { readMigrations, type MigrationFile } from '../migrations/files.js';
import { connectHost, describePgError } from '../pg/connect.js';
import { acquireRunnerLock, releaseRunnerLock } from '../pg/locks.js';
import { readHostSnapshot, type HostSnapshot } from './catalog.js';
import { executeHostPlan, type HostOutcome, type ProgressEvent } from './execute.js';
import { conflictError, findConflicts, planFleet, type Plan, type PlanOptions } from './plan.js';

/**
 * The one code path behind init, add-schema and migrate: lock every host, read its catalog, plan,
 * refuse on any conflict before writing, then execute all hosts in parallel.
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
  /** The plan that was (or, in a dry run, would be) executed. */
  readonly plan: Plan;
  /** Empty in a dry run. */
  readonly hosts: readonly HostOutcome[];
  readonly ok: boolean;
  readonly durationMs: number;
}

interface HostSession {
  readonly host: HostConfig;
  readonly client: pg.Client;
  locked: boolean;
}

export async function provision(config: ShardctlConfig, mode: ProvisionMode, options: ProvisionOptions = {}): Promise<ProvisionResult> {
  const started = performance.now();
  const dryRun = options.dryRun ?? false;
  const migrations = await readMigrations(config.migrationsDir);
  const { sessions, unreachable } = await connectAll(config.hosts);
  try {
    if (unreachable.length > 0 && mode !== 'migrate') {
      // Creating a schema is safe only when every host has been checked for another copy of it.
      throw unreachable.length === 1
        ? unreachable[0]!.error
        : new RuntimeFailure(
            'HOST_UNREACHABLE',
            `${unreachable.length} hosts cannot be reached; nothing was written:\n${unreachable.map((u) => `  - ${u.error.message}`).join('\n')}`,
            { hosts: unreachable.map((u) => u.host.name) },
          );
    }
    for (const u of unreachable) options.onNotice?.(`${u.error.message}; its shards are left behind`);
    if (!dryRun) await lockAll(sessions);
    const snapshots = await Promise.all(sessions.map((s) => readHostSnapshot(s.client, s.host, config)));
    const planOptions = planOptionsFor(mode, options, snapshots, migrations);
    const conflicts = findConflicts(config, snapshots, migrations, {
      ...(options.shards ? { shards: options.shards } : {}),
      checkDrift: true,
    });
    if (conflicts.length > 0) throw conflictError(conflicts);
    const plan = planFleet(config, snapshots, migrations, planOptions);
    if (dryRun) {
      return { mode, dryRun, targetVersion: plan.targetVersion, plan, hosts: [], ok: true, durationMs: elapsed(started) };
    }
    const outcomes = await Promise.all(
      plan.hosts.map((hostPlan) => {
        const session = sessions.find((s) => s.host.name === hostPlan.host.name)!;
        return executeHostPlan(session.client, hostPlan, {
          concurrency: config.concurrency,
          ...(options.onProgress ? { onProgress: options.onProgress } : {}),
        });
      }),
    );
    const unreachableOutcomes = unreachable.map((u) => unreachableOutcome(u.host, u.error.message));
    const hosts = [...outcomes, ...unreachableOutcomes];
    const ok = hosts.every((h) => h.hostError === null && h.failures.length === 0);
    return { mode, dryRun, targetVersion: plan.targetVersion, plan, hosts, ok, durationMs: elapsed(started) };
  } finally {
    await Promise.all(sessions.map((s) => closeSession(s)));
  }
}

function planOptionsFor(
  mode: ProvisionMode,
  options: ProvisionOptions,
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

async function connectAll(hosts: readonly HostConfig[]): Promise<{
  sessions: HostSession[];
  unreachable: { host: HostConfig; error: HostError }[];
}> {
  const results = await Promise.allSettled(hosts.map((host) => connectHost(host, { applicationName: 'shardctl' })));
  const sessions: HostSession[] = [];
  const unreachable: { host: HostConfig; error: HostError }[] = [];
  results.forEach((result, i) => {
    const host = hosts[i]!;
    if (result.status === 'fulfilled') sessions.push({ host, client: result.value, locked: false });
    else {
      const error = result.reason instanceof HostError ? result.reason : new HostError(host.name, describePgError(result.reason));
      unreachable.push({ host, error });
    }
  });
  return { sessions, unreachable };
}

async function lockAll(sessions: HostSession[]): Promise<void> {
  for (const session of sessions) {
    await acquireRunnerLock(session.client, session.host.name);
    session.locked = true;
  }
}

async function closeSession(session: HostSession): Promise<void> {
  if (session.locked) await releaseRunnerLock(session.client).catch(() => undefined);
  await session.client.end().catch(() => undefined);
}

function unreachableOutcome(host: HostConfig, message: string): HostOutcome {
  return {
    host: host.name,
    shardsCreated: 0,
    nextIdInstalled: 0,
    migrationsApplied: 0,
    upToDate: 0,
    failures: [],
    hostError: message,
    behind: host.shards.length,
    durationMs: 0,
  };
}

function elapsed(started: number): number {
  return Math.round(performance.now() - started);
}
