import type { HostConfig, ShardctlConfig } from '../config/types.js';
import { shardSchemaName, withDirectUrls } from '../config/types.js';
import { shardsPhrase } from '../config/ranges.js';
import { RuntimeFailure, UsageError } from '../errors.js';
import { readShardRows } from '../fleet/catalog.js';
import { completeControlSchema } from '../fleet/control.js';
import {
  discoverFromConfig,
  lockAfterPlacement,
  mapDisagreements,
  readFleetPlacement,
  staleMapError,
} from '../fleet/placement.js';
import { Fleet } from '../fleet/session.js';
import { readMigrations, type MigrationFile } from '../migrations/files.js';
import { awaitedLater } from '../promises.js';
import { announce, moveContext, moveResult, type MoveOptions } from './context.js';
import { watchInterrupt } from './interrupt.js';
import { runSteps } from './move.js';
import { planWaves } from './waves.js';
import { estimateCopy } from './copy-meter.js';
import { concurrency, CREATE_WORKER, Spares } from './workers.js';
import { preflight } from './preflight.js';
import { readStandbySlots, readTimelines } from './failover-state.js';
import { faultAfter, insertMove, newMoveId } from './state.js';
import { batchResult, groupBySource, runParts, type BatchMoveResult } from './batch.js';
import { closePart, connectPart, openParts, whileAgreeing, type Part } from './parts.js';
import { continueMoves } from './resume.js';

export type { BatchMoveResult } from './batch.js';
export { findRunningMoves, reconcileRecords } from './resume.js';

/**
 * The one entry of the move engine (runMoves), as provisioning/run.ts is for provisioning: groups
 * the shards by the host they are on, takes the runner lock on every host involved, runs the
 * preflight of every group, and only when all pass starts one move per source host (move.ts), the
 * groups in parallel. Resume and abort find the unfinished moves of the listed shards and carry
 * them on or undo them (resume.ts). A single shard is a batch of one. The caller (commands/move-shard.ts,
 * commands/rebalance.ts) has validated the request.
 */

/**
 * Moves `shards` (distinct, ascending, in the map) to `target`, or with options.resume/abort
 * carries on or undoes their unfinished moves (no target then).
 */
export async function runMoves(
  config: ShardctlConfig,
  shards: readonly number[],
  target: HostConfig | undefined,
  options: MoveOptions = {},
): Promise<BatchMoveResult> {
  const started = performance.now();
  const migrations = await readMigrations(config.migrationsDir);
  // Every connection of a move needs a server session of its own for its whole life (the slot's
  // snapshot, the replication connection, session settings, the fence): the hosts' directUrl,
  // which is url unless url goes through a transaction pooler.
  const direct = withDirectUrls(config);
  if (options.resume || options.abort) return continueMoves(direct, shards, migrations, options, started);
  if (!target) throw new UsageError('a target host is required to start a move', { input: 'target' });
  return startMoves(
    direct,
    shards,
    direct.hosts.find((h) => h.name === target.name)!,
    migrations,
    options,
    started,
  );
}

/**
 * The runner locks, and where this run's shards are checked again when the fleet's placement
 * changed while the run waited for them (another move finished meanwhile): the file read at the
 * start, checked before the wait, would send a shard that has left its host from that host, whose
 * fenced old copy the move would then meet. A StaleMapError then names those shards. A move of
 * other shards changes nothing for this run (the switch reads the file again when it rewrites it).
 */
async function lockAgreeing(fleet: Fleet, config: ShardctlConfig, shards: readonly number[]): Promise<void> {
  const before = await lockAfterPlacement(fleet, { lockTimeout: config.lockTimeout });
  // A role that may not read the placement (undefined): the lock has already said what it must.
  if (before === undefined) return;
  const after = await readFleetPlacement(fleet).catch(() => undefined);
  if (after === undefined || before.version === after.version) return;
  const { placement } = await discoverFromConfig(config, { applicationName: 'shardctl move' });
  const mine = new Set(shards);
  const moved = mapDisagreements(config, placement, placement.moving)
    .map((d) => ({ ...d, shards: d.shards.filter((s) => mine.has(s)) }))
    .filter((d) => d.shards.length > 0);
  if (moved.length === 0) return;
  throw staleMapError(
    config.file,
    [
      `the fleet changed while this run waited for the runner locks (placement version ${before.version} → ${placement.version}: another run moved shards of this one)`,
    ],
    moved,
    placement,
  );
}

async function startMoves(
  config: ShardctlConfig,
  list: readonly number[],
  target: HostConfig,
  migrations: readonly MigrationFile[],
  options: MoveOptions,
  started: number,
): Promise<BatchMoveResult> {
  const mode = options.mode ?? 'online';
  const groups = groupBySource(config, list);
  // The moves' own connections are opened at once with the fleet's, and recorded as workers once
  // the runner locks are held (openParts).
  const connecting = groups.map((g) => awaitedLater(connectPart(g.source, target)));
  const fleet = await whileAgreeing(
    config,
    options,
    Fleet.open([...groups.map((g) => g.source), target], { applicationName: 'shardctl move' }),
    (opened) => opened.close(),
  ).catch(async (error: unknown) => {
    await Promise.all(connecting.map((c) => c.then(closePart, () => undefined)));
    throw error;
  });
  try {
    const parts = await openParts(
      connecting,
      (async () => {
        fleet.requireAll();
        if (options.dryRun || options.runnerLocksHeld) return;
        await lockAgreeing(fleet, config, list);
      })(),
      options.dryRun ?? false,
    );
    // Each move's creation workers connect while its preflight runs (workers.ts, Spares).
    const spares = options.dryRun
      ? []
      : parts.map((part, i) => openSpares(part, groups[i]!.shards.length, config, options));
    try {
      const planned = await Promise.all(
        parts.map(async (part, i) => {
          const group = groups[i]!;
          const { checks, sourcePrivileges } = await preflight({
            config,
            shards: group.shards,
            mode,
            source: part.source,
            target: part.target,
            sourceReader: fleet.session(group.source.name).client,
            migrations,
            probeReachability: !options.dryRun && mode === 'online',
            configFile: options.configFile ?? config.file,
          });
          const estimated = await readShardRows(part.source.client, config.schemaPrefix, group.shards);
          const rows = new Map([...estimated].map(([shard, n]) => [shard, Number(n)]));
          const waves = mode === 'online' ? planWaves(group.shards, rows, options.wave) : [[...group.shards]];
          const estimate = options.dryRun
            ? await estimateCopy(
                part.source.client,
                part.target.client,
                (s) => shardSchemaName(config, s),
                group.shards,
              )
            : null;
          return { part, group, checks, waves, sourcePrivileges, estimate };
        }),
      );
      if (options.dryRun) {
        const moves = planned.map(({ part, group, checks, waves, estimate }) =>
          moveResult(
            moveContext(
              config,
              { moveId: '(dry run)', mode, shards: group.shards, detail: { waves } },
              part,
              migrations,
              options,
            ),
            'dry-run',
            checks,
            started,
            estimate,
          ),
        );
        return batchResult('dry-run', target.name, list, moves, started);
      }
      const one = planned.length === 1;
      const failed = planned.flatMap(({ group, checks }) =>
        checks
          .filter((c) => !c.ok)
          .map((c) => `${one ? '' : `${group.source.name} → ${target.name}: `}${c.name}: ${c.message}`),
      );
      if (failed.length > 0) {
        const from = one ? ` from ${groups[0]!.source.name}` : '';
        throw new RuntimeFailure(
          'PREFLIGHT_FAILED',
          `move of ${shardsPhrase(list)}${from} to ${target.name} not started; nothing was changed:\n${failed.map((f) => `  - ${f}`).join('\n')}`,
          { checks: planned.map(({ group, checks }) => ({ source: group.source.name, checks })) },
          failed,
        );
      }
      const moves = await runParts(
        planned.map(({ part, group, checks, waves, sourcePrivileges }, i) => async () => {
          const moveId = newMoveId();
          // The timelines, so that a resumed move knows whether a host failed over since (failover.ts).
          // And the standbys the source's walsenders wait for: whether a synced slot can be trusted then.
          const [timelines, standbySlots] = await Promise.all([readTimelines(part), readStandbySlots(part.source)]);
          const ctx = moveContext(
            config,
            { moveId, mode, shards: group.shards, detail: { waves, standbySlots } },
            part,
            migrations,
            options,
          );
          watchInterrupt(ctx);
          ctx.sourcePrivileges = sourcePrivileges;
          ctx.spares = spares[i] ?? null;
          // Both hosts at once: the control schema completed (where a host's is older), then the move recorded.
          await Promise.all(
            [part.source, part.target].map(async (side) => {
              await completeControlSchema(side.client, config);
              await insertMove(side.client, {
                moveId,
                shards: group.shards,
                source: group.source.name,
                target: target.name,
                mode,
                step: 'prepared',
                detail: { waves, wave: 0, timelines, standbySlots },
              });
            }),
          );
          announce(
            ctx,
            'prepared',
            `move ${moveId}: ${shardsPhrase(group.shards)} from ${group.source.name} to ${target.name} (${mode}` +
              `${waves.length > 1 ? `, cut over in ${waves.length} waves` : ''})`,
          );
          faultAfter('prepared');
          await runSteps(ctx, 'prepared');
          return moveResult(ctx, 'moved', checks, started);
        }),
      );
      return batchResult('moved', target.name, list, moves, started);
    } finally {
      await Promise.all([...parts.map(closePart), ...spares.map((s) => s.close())]);
    }
  } finally {
    await fleet.close();
  }
}

/**
 * A move's creation workers opened ahead, as many as it will use: the creation is what starts right
 * after the preflight. The copy's connect when the copy starts (it waits for the first shards built),
 * so that fewer connections are opened while the preflight's reads run.
 */
function openSpares(part: Part, shards: number, config: ShardctlConfig, options: MoveOptions): Spares {
  const spares = new Spares();
  spares.open(part.target.host, CREATE_WORKER, concurrency({ config, options }, shards));
  return spares;
}
