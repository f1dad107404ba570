import type { ShardctlConfig } from '../config/types.js';
import { formatShardList } from '../config/ranges.js';
import { optionKeys, refuseUnknownOptions } from '../config/validate.js';
import { UsageError } from '../errors.js';
import { DRIFT_KINDS, fileRollout, type FileRollout } from '../migrations/rules.js';
import { conflictError } from '../provisioning/plan.js';
import {
  COMMON_PROVISION_FLAGS,
  inspectFleet,
  provision,
  type ProvisionOptions,
  type ProvisionResult,
} from '../provisioning/run.js';

export interface MigrateOptions extends Pick<
  ProvisionOptions,
  'dryRun' | 'toVersion' | 'onProgress' | 'onNotice' | 'canary' | 'maxFailures' | 'lockRetries' | 'lockRetryPauseMs'
> {
  /** Only these shards (a stage). With `hosts`, the shards in both. */
  readonly shards?: readonly number[];
  /** Only the shards the map gives these hosts. */
  readonly hosts?: readonly string[];
}

/** Every key of MigrateOptions. */
const MIGRATE_OPTION_KEYS = optionKeys<MigrateOptions>({
  ...COMMON_PROVISION_FLAGS,
  toVersion: true,
  canary: true,
  maxFailures: true,
  lockRetries: true,
  lockRetryPauseMs: true,
  shards: true,
  hosts: true,
});

/**
 * `shardctl migrate`: apply pending migration files, in version order, to every existing shard
 * schema on every host; each migration on each shard in its own transaction with its record.
 * Drift (an applied file changed or deleted, or a new file older than applied ones) refuses the
 * whole run with exit 3 before anything is written, whatever the stage.
 *
 * A staged rollout takes part of the fleet at a time: `canary` shards spread over the hosts, then
 * some `hosts` or `shards`, then the rest; a later run simply finds less pending. A lock timeout
 * is retried `lockRetries` times before the shard counts as failed; `maxFailures` stops starting
 * shards once that many have failed.
 */
export async function migrate(config: ShardctlConfig, options: MigrateOptions = {}): Promise<ProvisionResult> {
  refuseUnknownOptions('migrate options', options, MIGRATE_OPTION_KEYS);
  const { shards, hosts, ...rest } = options;
  validateCounts(options);
  const selection = selectShards(config, shards, hosts);
  return provision(config, 'migrate', { ...rest, ...(selection ? { shards: selection } : {}) });
}

function validateCounts(options: MigrateOptions): void {
  const counts: [keyof MigrateOptions, number | undefined, number][] = [
    ['canary', options.canary, 1],
    ['maxFailures', options.maxFailures, 1],
    ['lockRetries', options.lockRetries, 0],
  ];
  for (const [input, value, least] of counts) {
    if (value !== undefined && (!Number.isSafeInteger(value) || value < least)) {
      throw new UsageError(`expected an integer of at least ${least}`, { input, value });
    }
  }
}

/** The shards of a stage, or null for every shard. */
function selectShards(
  config: ShardctlConfig,
  shards: readonly number[] | undefined,
  hosts: readonly string[] | undefined,
): number[] | null {
  if (shards === undefined && hosts === undefined) return null;
  let selection: number[] | null = null;
  if (shards !== undefined) {
    const outside = shards.filter((s) => !Number.isInteger(s) || s < 0 || s >= config.shards);
    if (outside.length > 0)
      throw new UsageError(`out of range; the config has shards 0-${config.shards - 1}`, {
        input: 'shards',
        value: outside.join(', '),
      });
    selection = [...new Set(shards)];
  }
  if (hosts !== undefined) {
    const unknown = hosts.filter((name) => !config.hosts.some((h) => h.name === name));
    if (unknown.length > 0 || hosts.length === 0) {
      throw new UsageError(`no such host in the config (its hosts: ${config.hosts.map((h) => h.name).join(', ')})`, {
        input: 'hosts',
        value: unknown.join(', '),
      });
    }
    const onHosts = new Set(config.hosts.filter((h) => hosts.includes(h.name)).flatMap((h) => h.shards));
    selection = selection === null ? [...onHosts] : selection.filter((s) => onHosts.has(s));
    if (selection.length === 0) {
      const reason =
        shards === undefined ? 'the map gives these hosts no shards' : 'none of the given shards is on these hosts';
      throw new UsageError(reason, { input: 'hosts', value: hosts.join(', ') });
    }
  }
  return selection!.sort((a, b) => a - b);
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
  /** The files not yet on every shard of the hosts read, with on how many they are (a rollout's progress). */
  readonly rollout: readonly FileRollout[];
}

export type CheckMigrationsOptions = Pick<MigrateOptions, 'toVersion'>;
const CHECK_MIGRATIONS_KEYS = optionKeys<CheckMigrationsOptions>({ toVersion: true });

/** `migrate --check`: writes nothing (no lock either); tells whether every shard is at the target version. */
export async function checkMigrations(
  config: ShardctlConfig,
  options: CheckMigrationsOptions = {},
): Promise<MigrationCheck> {
  refuseUnknownOptions('migrate check options', options, CHECK_MIGRATIONS_KEYS);
  const { plan, conflicts, lostHosts, snapshots, handMade } = await inspectFleet(config, options);
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
  const drift = [...conflicts.map((c) => c.message), ...handMade];
  const pending = hosts.reduce((n, h) => n + h.migrations, 0);
  const behind = hosts.some((h) => h.shards > 0);
  const unreadHosts = lostHosts.map((l) => l.host.name);
  const current = unreadHosts.length === 0 && drift.length === 0 && !behind;
  const present = snapshots.flatMap((s) =>
    s.host.shards.filter((shard) => s.schemas.has(shard)).map((shard) => s.applied.get(shard)),
  );
  const rollout = fileRollout(
    plan.migrations.filter((m) => m.version <= plan.targetVersion),
    present,
  );
  return { current, targetVersion: plan.targetVersion, pending, hosts, drift, unreadHosts, rollout };
}
