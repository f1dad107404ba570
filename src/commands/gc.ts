import type { ShardctlConfig } from '../config/types.js';
import { hostForShard, shardSchemaName } from '../config/types.js';
import { optionKeys, refuseUnknownOptions } from '../config/validate.js';
import { HostError } from '../errors.js';
import { describePgError } from '../fleet/connect.js';
import { CONTROL, controlTableExists } from '../fleet/control.js';
import { Fleet } from '../fleet/session.js';
import { lockAfterPlacement, readFleetPlacement, requireCurrentMapLocked } from '../fleet/placement.js';
import { loadConfig } from '../config/load.js';
import { dropLeftovers, findLeftovers, type Leftover } from '../moves/leftovers.js';
import { dropShardSql } from '../fleet/sql.js';
import { dropUnusedFenceGuardsSql, leftTriggersSql } from '../moves/sql/leftovers.js';
import { dropTriggerIfFreeSql } from '../moves/sql/locks.js';
import { LOCK_WAIT_CODES, retryLockWaits, runTransaction } from '../pg/quiet.js';
import type pg from 'pg';

export interface OldCopy {
  readonly host: string;
  readonly shard: number;
  readonly schema: string;
}

/** A leftover of a killed move on a host (see src/moves/leftovers.ts). */
export type HostLeftover = Leftover & { readonly host: string };

/**
 * A trigger of a move left on a table of a live shard (leftTriggersSql): it refuses nothing, but a
 * change-log trigger still costs a call per row written. Dropped only where its table is free at
 * that instant; `dropped` false when it stayed busy (gc again drops it later).
 */
export interface LeftTrigger {
  readonly host: string;
  readonly shard: number;
  readonly schema: string;
  readonly table: string;
  readonly trigger: string;
  readonly dropped: boolean;
  /** Why it was kept: its table stayed busy, or the drop failed (the server's message). */
  readonly kept?: string;
}

export interface GcResult {
  /** Fenced old copies that finished moves left behind. */
  readonly oldCopies: readonly OldCopy[];
  /** Probe subscriptions and replication objects of killed runs that no running move accounts for. */
  readonly leftovers: readonly HostLeftover[];
  /** Triggers of finished or undone moves on live shards' tables. */
  readonly triggers: readonly LeftTrigger[];
}

/** How long gc keeps trying to drop a left trigger whose table is busy. */
const TRIGGER_RETRY_MS = 300;

export interface GcOptions {
  /** List what would be dropped; drop nothing. */
  readonly dryRun?: boolean;
}
const GC_OPTION_KEYS = optionKeys<GcOptions>({ dryRun: true });

/**
 * `shardctl gc`: the fenced old copies that finished moves left behind (state fenced in the control
 * schema, shard mapped elsewhere, in no running move), and the leftovers of killed runs. With dryRun
 * they are only listed; otherwise dropped, under the runner lock of each host (so nothing a running
 * shardctl is using).
 */
export async function gc(given: ShardctlConfig, options: GcOptions = {}): Promise<GcResult> {
  refuseUnknownOptions('gc options', options, GC_OPTION_KEYS);
  const oldCopies: OldCopy[] = [];
  const leftovers: HostLeftover[] = [];
  const triggers: LeftTrigger[] = [];
  const fleet = await Fleet.open(given.hosts, { applicationName: 'shardctl gc' });
  try {
    fleet.requireAll();
    // With the placement from before the locks: what a move that finishes while this run waits changes.
    const before = options.dryRun ? undefined : await lockAfterPlacement(fleet, { lockTimeout: given.lockTimeout });
    const placement = await readFleetPlacement(fleet);
    const config = await requireCurrentMapLocked(given, placement, (file) => loadConfig(file), before);
    for (const { host, client } of fleet.sessions) {
      try {
        if (!(await controlTableExists(client, 'shards'))) continue;
        const rows = await client.query<{ shard: number; schema_name: string }>(
          `SELECT s.shard, s.schema_name FROM ${CONTROL}.shards s
            WHERE s.state = 'fenced'
              AND NOT EXISTS (SELECT 1 FROM ${CONTROL}.moves m WHERE m.status = 'running' AND s.shard = ANY(coalesce(m.shards, ARRAY[m.shard])))
            ORDER BY s.shard`,
        );
        for (const row of rows.rows) {
          // Never drop the copy the map points at, whatever the control row says.
          if (hostForShard(config, row.shard)?.name === host.name) continue;
          oldCopies.push({ host: host.name, shard: row.shard, schema: row.schema_name });
          if (options.dryRun) continue;
          // The old copy, and the views left under the shard's own name (see move-shard cleanup).
          const stub = shardSchemaName(config, row.shard);
          await client.query(dropShardSql(row.shard, [row.schema_name, stub]));
        }
        // Before the guards: a guard or log function goes once no trigger calls it.
        triggers.push(...(await leftTriggers(client, config, host.name, placement.moving, options.dryRun ?? false)));
        // The fence guards of the moves whose old copies are gone now.
        if (!options.dryRun)
          await client.query(dropUnusedFenceGuardsSql({ movesRecorded: await controlTableExists(client, 'moves') }));
        const found = await findLeftovers(client, { changeLogs: true });
        if (!options.dryRun) await dropLeftovers(client, found);
        leftovers.push(...found.map((l) => ({ ...l, host: host.name })));
      } catch (error) {
        if (error instanceof HostError) throw error;
        throw new HostError(host.name, `gc failed: ${describePgError(error)}`, { cause: error });
      }
    }
    return { oldCopies, leftovers, triggers };
  } finally {
    await fleet.close();
  }
}

/**
 * The left triggers of a host's shards that the map places there and no unfinished move on any
 * host carries (leftTriggersSql), dropped unless `dryRun`, each only if its table is free at that
 * instant (no application statement queues behind the drop), tried again for TRIGGER_RETRY_MS. A drop
 * that fails otherwise (a table gc's role does not own) keeps that trigger, says why, and gc goes on.
 */
async function leftTriggers(
  client: pg.Client,
  config: ShardctlConfig,
  host: string,
  moving: ReadonlySet<number>,
  dryRun: boolean,
): Promise<LeftTrigger[]> {
  const found = await client.query<{ shard: number; schema: string; table: string; trigger: string }>(
    leftTriggersSql(await controlTableExists(client, 'moves')),
  );
  const left: LeftTrigger[] = [];
  for (const row of found.rows) {
    if (hostForShard(config, row.shard)?.name !== host || moving.has(row.shard)) continue;
    if (dryRun) {
      left.push({ host, ...row, dropped: false });
      continue;
    }
    const kept = await retryLockWaits(
      () => runTransaction(client, dropTriggerIfFreeSql(row.schema, row.table, row.trigger)),
      performance.now() + TRIGGER_RETRY_MS,
    ).then(
      () => undefined,
      (error: unknown) =>
        LOCK_WAIT_CODES.includes((error as { code?: string }).code ?? '')
          ? 'its table stayed busy'
          : `the drop failed: ${describePgError(error)}`,
    );
    left.push({ host, ...row, dropped: kept === undefined, ...(kept === undefined ? {} : { kept }) });
  }
  return left;
}
