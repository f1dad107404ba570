import type { ShardctlConfig } from '../config/types.js';
import { formatShardList } from '../config/ranges.js';
import { DRIFT_KINDS } from '../migrations/rules.js';
import { conflictError } from '../provisioning/plan.js';
import { inspectFleet, provision, type ProvisionOptions, type ProvisionResult } from '../provisioning/run.js';

/**
 * `shardctl migrate`: apply pending migration files, in version order, to every existing shard
 * schema on every host; each migration on each shard in its own transaction with its record.
 * Drift (an applied file changed or deleted, or a new file older than applied ones) refuses the
 * whole run with exit 3 before anything is written.
 */
export function migrate(
  config: ShardctlConfig,
  options: Pick<ProvisionOptions, 'dryRun' | 'toVersion' | 'onProgress' | 'onNotice'> = {},
): Promise<ProvisionResult> {
  return provision(config, 'migrate', options);
}

export interface PendingFile {
  /** File name without `.sql`, e.g. `0004_views`. */
  readonly name: string;
  readonly version: number;
  /** The shards it is pending on, as a compact list ("0-49,60"). */
  readonly shards: string;
  readonly count: number;
}

export interface HostPending {
  readonly host: string;
  /** Shards with anything pending (a migration, or an outdated next_id). */
  readonly shards: number;
  /** Migration applications pending (shards × files). */
  readonly migrations: number;
  /** Per pending file, where. */
  readonly pending: readonly PendingFile[];
  /** Mapped shards whose schema does not exist (init creates them; migrate does not). */
  readonly missingShards: number;
  /** The host could not be read; then nothing else about it is known. */
  readonly error: string | null;
}

export interface MigrationCheck {
  readonly current: boolean;
  readonly targetVersion: number;
  /** Migration applications pending over the fleet. */
  readonly pending: number;
  readonly hosts: readonly HostPending[];
  /** One message per drifted file and host, naming the file and the shards. */
  readonly drift: readonly string[];
  /** Hosts that could not be read; nothing about their shards is known. */
  readonly unreadHosts: readonly string[];
}

/** `migrate --check`: writes nothing (no lock either); tells whether every shard is at the target version. */
export async function checkMigrations(config: ShardctlConfig, options: { toVersion?: number } = {}): Promise<MigrationCheck> {
  const { plan, conflicts, lostHosts } = await inspectFleet(config, options);
  // A misplaced or foreign schema is not something migrate could ever fix: the same error as a run.
  if (conflicts.some((c) => !DRIFT_KINDS.has(c.kind))) throw conflictError(conflicts);
  const hosts: HostPending[] = plan.hosts.map((h) => {
    const byFile = new Map<number, number[]>();
    for (const job of h.jobs) {
      for (const m of job.migrations) {
        let shards = byFile.get(m.version);
        if (!shards) byFile.set(m.version, (shards = []));
        shards.push(job.shard);
      }
    }
    const pending = plan.migrations
      .filter((m) => byFile.has(m.version))
      .map((m) => {
        const shards = byFile.get(m.version)!;
        return { name: m.name, version: m.version, shards: formatShardList(shards), count: shards.length };
      });
    return {
      host: h.host.name,
      shards: h.jobs.length,
      migrations: pending.reduce((n, p) => n + p.count, 0),
      pending,
      missingShards: h.missingShards.length,
      error: null,
    };
  });
  for (const lost of lostHosts) {
    hosts.push({ host: lost.host.name, shards: 0, migrations: 0, pending: [], missingShards: 0, error: lost.reason });
  }
  const order = new Map(config.hosts.map((h, i) => [h.name, i]));
  hosts.sort((a, b) => order.get(a.host)! - order.get(b.host)!);
  const drift = conflicts.map((c) => c.message);
  const pending = hosts.reduce((n, h) => n + h.migrations, 0);
  const behind = hosts.some((h) => h.shards > 0);
  const unreadHosts = lostHosts.map((l) => l.host.name);
  const current = unreadHosts.length === 0 && drift.length === 0 && !behind;
  return { current, targetVersion: plan.targetVersion, pending, hosts, drift, unreadHosts };
}
