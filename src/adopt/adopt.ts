import { randomUUID } from 'node:crypto';
import { elapsed } from '../clock.js';
import type { ShardctlConfig } from '../config/types.js';
import { shardSchemaName } from '../config/types.js';
import { optionKeys, refuseUnknownOptions } from '../config/validate.js';
import { HostError, ShardctlError, UsageError } from '../errors.js';
import { readHostSnapshot, type HostSnapshot } from '../fleet/catalog.js';
import { describePgError } from '../fleet/connect.js';
import { CONTROL_VERSION, controlSchemaSql, finishSlowPath } from '../fleet/control.js';
import { fleetRecord, readFleetPlacement, registerFleetSql, requireCurrentMap } from '../fleet/placement.js';
import { Fleet, type HostSession } from '../fleet/session.js';
import { readMigrations, type MigrationFile } from '../migrations/files.js';
import { conflictError, findConflicts } from '../provisioning/plan.js';
import { checkBaseline, inspectShards, type ShardAction, type ShardInspection } from './inspect.js';
import { recordAdoptedSql, switchShardSql } from './sql.js';
import { rollbackQuietly } from '../pg/quiet.js';

/**
 * `shardctl adopt`, top to bottom: lock every host, read what each mapped schema holds, refuse
 * (exit 3, nothing written anywhere) if any shard cannot be adopted safely, then on every host in
 * parallel: the control schema, one transaction per shard that replaces the published next_id()
 * in place (src/adopt/sql.ts says why no id repeats), and the fleet's records as init writes them.
 */

export interface AdoptOptions {
  /** Record the migrations up to this version as applied, after checking what they create exists. */
  readonly baseline?: number;
  /** Adopt only these shards. */
  readonly shards?: readonly number[];
  readonly dryRun?: boolean;
  /** A shard was switched or recorded (or failed). */
  readonly onShard?: (event: { host: string; shard: number; ok: boolean }) => void;
}

export interface AdoptedShard {
  readonly shard: number;
  readonly schema: string;
  readonly action: ShardAction;
  /** The sequence the published next_id() drew from. */
  readonly sequence: string | null;
  /** Tables whose default calls the published next_id(). */
  readonly tables: readonly string[];
  /** The transaction that adopts it (null for 'none'); what --dry-run prints. */
  readonly sql: string | null;
}

export interface AdoptRefusal {
  readonly host: string;
  readonly shard: number;
  readonly schema: string;
  readonly reason: string;
}

export interface AdoptHostResult {
  readonly host: string;
  readonly shards: readonly AdoptedShard[];
  /** Mapped shards with no schema on the host (init creates them once the fleet is adopted). */
  readonly missing: readonly number[];
  /** Creates or completes the control schema and records the layout. */
  readonly controlSql: string;
  readonly switched: number;
  readonly recorded: number;
  readonly failures: readonly { readonly shard: number; readonly reason: string }[];
  readonly hostError: string | null;
}

export interface AdoptResult {
  readonly dryRun: boolean;
  readonly baseline: { readonly version: number; readonly files: readonly string[] } | null;
  readonly hosts: readonly AdoptHostResult[];
  readonly ok: boolean;
  readonly durationMs: number;
}

/** Shards that cannot be adopted: exit 3, nothing written on any host. */
export class AdoptRefusedError extends ShardctlError {
  readonly refusals: readonly AdoptRefusal[];

  constructor(refusals: readonly AdoptRefusal[]) {
    const lines = refusals.map((r) => `host ${r.host}, shard ${r.shard} (${r.schema}): ${r.reason}`);
    super(
      'ADOPT_REFUSED',
      `cannot adopt ${refusals.length === 1 ? 'a shard' : `${new Set(refusals.map((r) => `${r.host}/${r.shard}`)).size} shards`}; nothing was changed on any host:\n${lines.map((l) => `  - ${l}`).join('\n')}`,
      {
        exitCode: 3,
        details: lines,
        data: { refusals: refusals.map((r) => ({ ...r })) },
      },
    );
    this.refusals = refusals;
  }
}

/** Lock waits a shard's switch retries before it gives up on that shard (each one lockTimeout long). */
const SWITCH_ATTEMPTS = 5;

export async function adopt(config: ShardctlConfig, options: AdoptOptions = {}): Promise<AdoptResult> {
  refuseUnknownOptions(
    'adopt options',
    options,
    optionKeys<AdoptOptions>({ baseline: true, shards: true, dryRun: true, onShard: true }),
  );
  const started = performance.now();
  const dryRun = options.dryRun ?? false;
  const migrations = await readMigrations(config.migrationsDir);
  const baseline = baselineFiles(migrations, options.baseline);
  if (options.shards) {
    const outside = options.shards.filter((s) => !Number.isInteger(s) || s < 0 || s >= config.shards);
    if (outside.length > 0)
      throw new UsageError(`shards ${outside.join(', ')} are not shards of the config (0-${config.shards - 1})`, {
        input: 'shards',
        value: outside.join(','),
      });
  }
  const wanted = options.shards ? new Set(options.shards) : null;
  const fleet = await Fleet.open(config.hosts, { applicationName: 'shardctl adopt' });
  try {
    fleet.requireAll();
    if (!dryRun) await fleet.lock({ lockTimeout: config.lockTimeout });
    const snapshots = await fleet.each((s) => readHostSnapshot(s, config));
    const placement = await readFleetPlacement(fleet);
    requireCurrentMap(config, placement);
    // Schemas shardctl did not create are what adopt is for; a schema on the wrong host is a refusal of its own below.
    const conflicts = findConflicts(config, snapshots, migrations, {
      ...(options.shards ? { shards: options.shards } : {}),
      checkDrift: false,
    }).filter((c) => c.kind === 'layout' || c.kind === 'moving');
    if (conflicts.length > 0) throw conflictError(conflicts);

    const refusals: AdoptRefusal[] = [...doubledSchemas(config, snapshots, wanted)];
    const plans = await Promise.all(
      snapshots.map(async (snapshot) => {
        const session = fleet.session(snapshot.host.name);
        const mapped = snapshot.host.shards.filter((s) => !wanted || wanted.has(s));
        const present = mapped.filter((s) => snapshot.schemas.has(s));
        let inspected: ShardInspection[];
        let checked: { host: string | null; shards: Map<number, string[]> } = { host: null, shards: new Map() };
        try {
          inspected = await inspectShards(session.client, config, snapshot, present);
          if (baseline) {
            // Every shard that gets baseline records is checked: also one adopted earlier without --baseline.
            const schemas = inspected
              .filter((s) => s.owned && (s.action !== 'none' || !hasBaseline(snapshot, s.shard, baseline.files)))
              .map((s) => ({ shard: s.shard, schema: s.schema }));
            checked = await checkBaseline(session.client, config, baseline.files, schemas);
          }
        } catch (error) {
          throw new HostError(snapshot.host.name, `cannot read the shard schemas: ${describePgError(error)}`, {
            cause: error,
          });
        }
        for (const s of inspected) {
          const reasons = [
            ...s.refusals,
            ...(checked.host ? [checked.host] : []),
            ...(checked.shards.get(s.shard) ?? []),
          ];
          for (const reason of reasons)
            refusals.push({ host: snapshot.host.name, shard: s.shard, schema: s.schema, reason });
        }
        const shards: AdoptedShard[] = inspected.map((s) => ({
          shard: s.shard,
          schema: s.schema,
          action: s.action,
          sequence: s.sequence,
          tables: s.tables.map((t) => t.table),
          sql:
            s.action === 'switch' && s.sequence !== null
              ? switchShardSql(config, {
                  shard: s.shard,
                  schema: s.schema,
                  sequence: s.sequence,
                  tables: s.tables,
                  baseline: baseline?.files ?? [],
                  lockTimeout: config.lockTimeout,
                })
              : s.action === 'record' ||
                  (s.action === 'none' && baseline && !hasBaseline(snapshot, s.shard, baseline.files))
                ? recordAdoptedSql(s.shard, s.schema, baseline?.files ?? [])
                : null,
        }));
        return { snapshot, session, shards, missing: mapped.filter((s) => !snapshot.schemas.has(s)) };
      }),
    );
    if (refusals.length > 0)
      throw new AdoptRefusedError(refusals.sort((a, b) => a.host.localeCompare(b.host) || a.shard - b.shard));

    const controlSql = controlSchemaSql(config);
    const baselineOut = baseline ? { version: baseline.version, files: baseline.files.map((f) => f.name) } : null;
    if (dryRun) {
      const hosts = plans.map((p) =>
        hostResult(p.snapshot.host.name, p.shards, p.missing, controlSql, {
          switched: 0,
          recorded: 0,
          failures: [],
          hostError: null,
        }),
      );
      return { dryRun, baseline: baselineOut, hosts, ok: true, durationMs: elapsed(started) };
    }

    // A control schema already at this version is left as it is, as init and moves leave it: running its
    // steps again would put next_id's slow path back to changing over (src/fleet/control.ts), which a
    // transaction that holds a sequence's lock then keeps from finishing.
    const outcomes = await Promise.all(
      plans.map((p) =>
        executeHost(
          p.session,
          p.shards,
          (p.snapshot.layout?.controlVersion ?? 0) < CONTROL_VERSION ? controlSql : null,
          options.onShard,
        ),
      ),
    );
    // The fleet's id, registry and placement copy, as init records them, on every host that finished.
    const record = fleetRecord(config, placement, randomUUID);
    await Promise.all(
      plans.map(async (p, i) => {
        if (outcomes[i]!.hostError !== null) return;
        try {
          await p.session.client.query(registerFleetSql({ ...record, hostName: p.session.host.name }));
        } catch (error) {
          outcomes[i] = { ...outcomes[i]!, hostError: `cannot record the fleet: ${describePgError(error)}` };
          return;
        }
        // next_id's slow path changed over to its table lock (src/fleet/control.ts); when it cannot be
        // yet, the next run tries again (correct meanwhile, at the earlier cost).
        await finishSlowPath(p.session.client, config);
      }),
    );
    const hosts = plans.map((p, i) => hostResult(p.snapshot.host.name, p.shards, p.missing, controlSql, outcomes[i]!));
    const ok = hosts.every((h) => h.hostError === null && h.failures.length === 0);
    return { dryRun, baseline: baselineOut, hosts, ok, durationMs: elapsed(started) };
  } finally {
    await fleet.close();
  }
}

function baselineFiles(
  migrations: readonly MigrationFile[],
  version: number | undefined,
): { version: number; files: MigrationFile[] } | null {
  if (version === undefined) return null;
  if (!migrations.some((m) => m.version === version)) {
    throw new UsageError(`no migration file has version ${version}`, { input: 'baseline', value: version });
  }
  return { version, files: migrations.filter((m) => m.version <= version) };
}

function hasBaseline(snapshot: HostSnapshot, shard: number, files: readonly MigrationFile[]): boolean {
  const applied = snapshot.applied.get(shard);
  return files.every((f) => applied?.has(f.version));
}

/** A mapped schema that also exists on another host (not a fenced old copy): which copy is the shard is not for adopt to guess. */
function doubledSchemas(
  config: ShardctlConfig,
  snapshots: readonly HostSnapshot[],
  wanted: ReadonlySet<number> | null,
): AdoptRefusal[] {
  const refusals: AdoptRefusal[] = [];
  const live = (snapshot: HostSnapshot, shard: number): boolean =>
    snapshot.schemas.has(shard) && snapshot.recorded.get(shard)?.state !== 'fenced';
  for (let shard = 0; shard < config.shards; shard++) {
    if (wanted && !wanted.has(shard)) continue;
    const holders = snapshots.filter((s) => live(s, shard));
    const names = holders.map((s) => s.host.name);
    const mapped = config.hosts.find((h) => h.shards.includes(shard))?.name ?? 'no host';
    if (holders.length === 1 && names[0] !== mapped) {
      refusals.push({
        host: names[0]!,
        shard,
        schema: shardSchemaName(config, shard),
        reason: `the schema exists on host ${names[0]} but the map gives the shard to ${mapped}; fix the map (hosts[].shards)`,
      });
    }
    if (holders.length < 2) continue;
    for (const holder of holders) {
      refusals.push({
        host: holder.host.name,
        shard,
        schema: shardSchemaName(config, shard),
        reason: `the same schema exists on hosts ${names.join(' and ')} (the map gives it to ${mapped}); drop the copy that is not the shard, or finish the move that made it`,
      });
    }
  }
  return refusals;
}

interface HostOutcome {
  switched: number;
  recorded: number;
  failures: { shard: number; reason: string }[];
  hostError: string | null;
}

async function executeHost(
  session: HostSession,
  shards: readonly AdoptedShard[],
  controlSql: string | null,
  onShard: AdoptOptions['onShard'],
): Promise<HostOutcome> {
  const outcome: HostOutcome = { switched: 0, recorded: 0, failures: [], hostError: null };
  const host = session.host.name;
  try {
    if (controlSql !== null) await session.client.query(controlSql);
  } catch (error) {
    await rollbackQuietly(session.client);
    return { ...outcome, hostError: `cannot create the control schema: ${describePgError(error)}` };
  }
  for (const shard of shards) {
    if (shard.sql === null) continue;
    try {
      await runSwitch(session, shard.sql);
      if (shard.action === 'switch') outcome.switched += 1;
      else outcome.recorded += 1;
      onShard?.({ host, shard: shard.shard, ok: true });
    } catch (error) {
      outcome.failures.push({ shard: shard.shard, reason: describePgError(error) });
      onShard?.({ host, shard: shard.shard, ok: false });
    }
  }
  return outcome;
}

/** One shard's transaction; a lock wait that times out (busy writers) is rolled back and tried again. */
async function runSwitch(session: HostSession, sql: string): Promise<void> {
  for (let attempt = 1; ; attempt++) {
    try {
      await session.client.query(sql);
      return;
    } catch (error) {
      await rollbackQuietly(session.client);
      const lockTimeout = (error as { code?: string }).code === '55P03';
      if (!lockTimeout || attempt >= SWITCH_ATTEMPTS) throw error;
      await new Promise((resolve) => setTimeout(resolve, 50 * attempt));
    }
  }
}

function hostResult(
  host: string,
  shards: readonly AdoptedShard[],
  missing: readonly number[],
  controlSql: string,
  outcome: HostOutcome,
): AdoptHostResult {
  return { host, shards, missing, controlSql, ...outcome };
}
