import type { ShardctlConfig } from '../config/types.js';
import { ShardctlError } from '../errors.js';
import { provision, type ProvisionOptions, type ProvisionResult } from '../provisioning/run.js';

/**
 * `shardctl migrate`: apply pending migration files, in version order, to every existing shard
 * schema on every host; each migration on each shard in its own transaction with its record.
 * Drift (an applied file changed or deleted) refuses the whole run with exit 3.
 */
export function migrate(
  config: ShardctlConfig,
  options: Pick<ProvisionOptions, 'dryRun' | 'toVersion' | 'onProgress' | 'onNotice'> = {},
): Promise<ProvisionResult> {
  return provision(config, 'migrate', options);
}

export interface HostPending {
  readonly host: string;
  /** Shards with at least one pending migration. */
  readonly shards: number;
  /** Migration applications pending (shards × files). */
  readonly migrations: number;
  /** Mapped shards whose schema does not exist (init creates them). */
  readonly missingShards: number;
  readonly error: string | null;
}

export interface MigrationCheck {
  readonly current: boolean;
  readonly targetVersion: number;
  readonly hosts: readonly HostPending[];
  readonly drift: readonly string[];
  /** 0 current, 3 pending or drift, 1 a host could not be read. */
  readonly exitCode: 0 | 1 | 3;
}

/** `migrate --check`: writes nothing; tells whether every shard is at the latest version. */
export async function checkMigrations(config: ShardctlConfig, options: { toVersion?: number } = {}): Promise<MigrationCheck> {
  const notices: string[] = [];
  let result: ProvisionResult;
  try {
    result = await provision(config, 'migrate', { ...options, dryRun: true, onNotice: (m) => notices.push(m) });
  } catch (error) {
    if (error instanceof ShardctlError && error.code === 'MIGRATION_DRIFT') {
      return { current: false, targetVersion: options.toVersion ?? 0, hosts: [], drift: [...error.details], exitCode: 3 };
    }
    throw error;
  }
  const hosts: HostPending[] = result.plan.hosts.map((h) => ({
    host: h.host.name,
    shards: h.jobs.length,
    migrations: h.jobs.reduce((n, j) => n + j.migrations.length, 0),
    missingShards: h.host.shards.filter((s) => !h.snapshot.schemas.has(s)).length,
    error: null,
  }));
  const reached = new Set(hosts.map((h) => h.host));
  for (const host of config.hosts) {
    if (reached.has(host.name)) continue;
    hosts.push({
      host: host.name,
      shards: host.shards.length,
      migrations: 0,
      missingShards: 0,
      error: notices.find((n) => n.includes(`host ${host.name}`)) ?? `host ${host.name} could not be reached`,
    });
  }
  const unreachable = hosts.some((h) => h.error !== null);
  const current = !unreachable && hosts.every((h) => h.shards === 0);
  return { current, targetVersion: result.targetVersion, hosts, drift: [], exitCode: unreachable ? 1 : current ? 0 : 3 };
}
