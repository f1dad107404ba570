import type { HostConfig, ShardctlConfig } from '../config/types.js';
import { hostForShard, shardSchemaName, withDirectUrls } from '../config/types.js';
import { formatShardList, shardsPhrase } from '../config/ranges.js';
import { failureReason, RuntimeFailure, ShardctlError, UsageError } from '../errors.js';
import { readShardRows } from '../fleet/catalog.js';
import { describePgError } from '../fleet/connect.js';
import { completeControlSchema, controlTableExists, MOVE_ABORTING } from '../fleet/control.js';
import { registerWorker } from '../fleet/locks.js';
import { requireFleetAgrees } from '../fleet/placement.js';
import { closeSession, Fleet, openSession, withSession, type HostSession } from '../fleet/session.js';
import { readMigrations, type MigrationFile } from '../migrations/files.js';
import { elapsed } from '../clock.js';
import { allOrNone, awaitedLater } from '../promises.js';
import { announce, moveContext, moveResult, type MoveOptions, type MoveResult } from './context.js';
import { abortMove, runSteps } from './move.js';
import { planWaves } from './waves.js';
import { estimateCopy } from './copy-meter.js';
import { concurrency, CREATE_WORKER, Spares } from './workers.js';
import { dropLeftovers, findLeftovers, type Leftover } from './leftovers.js';
import { preflight } from './preflight.js';
import { checkAfterFailover } from './failover.js';
import { readTimelines } from './failover-state.js';
import {
  abortBegun,
  faultAfter,
  insertMove,
  newMoveId,
  runningMoves,
  stepsFor,
  type MoveRecord,
  type MoveStep,
} from './state.js';

/**
 * The one entry of the move engine (runMoves), as provisioning/run.ts is for provisioning: groups
 * the shards by the host they are on, takes the runner lock on every host involved, runs the
 * preflight of every group, and only when all pass starts one move per source host (move.ts), the
 * groups in parallel. Resume and abort find the unfinished moves of the listed shards and carry
 * them on or undo them. A single shard is a batch of one. The caller (commands/move-shard.ts,
 * commands/rebalance.ts) has validated the request.
 */

/** The result of a batch: one move per source host. */
export interface BatchMoveResult {
  readonly outcome: 'moved' | 'aborted' | 'dry-run';
  readonly target: string;
  readonly shards: readonly number[];
  readonly moves: readonly MoveResult[];
  /** Rows verified over every move. Decimal string. */
  readonly rowsMoved: string;
  /** The longest any shard refused writes, over every move; null when nothing was fenced. */
  readonly writeBlockedMs: number | null;
  readonly durationMs: number;
  /** Abort: what killed runs had left (probe subscriptions, replication objects), dropped. */
  readonly leftoversDropped: readonly (Leftover & { host: string })[];
}

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
        if (!options.dryRun && !options.runnerLocksHeld) await fleet.lock({ lockTimeout: config.lockTimeout });
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
          const ctx = moveContext(
            config,
            { moveId, mode, shards: group.shards, detail: { waves } },
            part,
            migrations,
            options,
          );
          ctx.sourcePrivileges = sourcePrivileges;
          ctx.spares = spares[i] ?? null;
          // The timelines, so that a resumed move knows whether a host failed over since (failover.ts).
          const timelines = await readTimelines(part);
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
                detail: { waves, wave: 0, timelines },
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

/** Resume and abort: the unfinished moves that carry any of the shards, carried on or undone. */
async function continueMoves(
  config: ShardctlConfig,
  shards: readonly number[],
  migrations: readonly MigrationFile[],
  options: MoveOptions,
  started: number,
): Promise<BatchMoveResult> {
  const records = (await whileAgreeing(config, options, findRunningMoves(config, shards))).filter(
    (r) => !options.moveIds || options.moveIds.includes(r.moveId),
  );
  if (records.length === 0) {
    // A run killed before it recorded a move (during the preflight's probe) leaves no move, only
    // leftovers: an abort removes those.
    const dropped = options.abort && !options.dryRun ? await dropAllLeftovers(config) : [];
    if (dropped.length > 0) return { ...batchResult('aborted', '', shards, [], started), leftoversDropped: dropped };
    throw new RuntimeFailure(
      'NO_MOVE',
      `no unfinished move of ${shardsPhrase(shards)} is recorded on any host; nothing to ${options.resume ? 'resume' : 'abort'}`,
    );
  }
  const hostOf = (name: string): HostConfig => {
    const host = config.hosts.find((h) => h.name === name);
    if (!host)
      throw new RuntimeFailure(
        'MOVE_HOSTS',
        `a move of ${shardsPhrase(shards)} involves host ${name}, which the map lacks; restore it in the config`,
      );
    return host;
  };
  const hosts = records.flatMap((r) => [hostOf(r.source), hostOf(r.target)]);
  const fleet = await Fleet.open(hosts, { applicationName: 'shardctl move' });
  try {
    fleet.requireAll();
    if (!options.dryRun && !options.runnerLocksHeld) await fleet.lock({ lockTimeout: config.lockTimeout });
    const moves = await runParts(
      records.map((record) => async () => {
        const part = await openPart(hostOf(record.source), hostOf(record.target), options.dryRun ?? false);
        try {
          const { step, detail } = reconcileRecords(
            record,
            await recordOf(part.source, record),
            await recordOf(part.target, record),
          );
          if (options.resume && abortBegun(detail)) throw abortToFinish(record, step);
          const ctx = moveContext(config, { ...record, detail }, part, migrations, options);
          const steps = stepsFor(record.mode);
          if (options.dryRun)
            return { ...moveResult(ctx, 'dry-run', [], started), plan: steps.slice(steps.indexOf(step) + 1) };
          if (options.abort) {
            await abortMove(ctx, step);
            return moveResult(ctx, 'aborted', [], started);
          }
          // A failover since may have taken the slot, or changes the target had applied: the copy restarts then.
          const from = await checkAfterFailover(ctx, step, detail);
          announce(ctx, from, `resuming move ${record.moveId} (${shardsPhrase(record.shards)}) after step ${from}`);
          await runSteps(ctx, from);
          return moveResult(ctx, 'moved', [], started);
        } finally {
          await closePart(part);
        }
      }),
    );
    const target = [...new Set(records.map((r) => r.target))].join(', ');
    const result = batchResult(
      options.abort ? 'aborted' : options.dryRun ? 'dry-run' : 'moved',
      target,
      [...new Set(records.flatMap((r) => r.shards))].sort((a, b) => a - b),
      moves,
      started,
    );
    if (!options.abort || options.dryRun) return result;
    return { ...result, leftoversDropped: await dropAllLeftovers(config, hosts) };
  } finally {
    await fleet.close();
  }
}

/**
 * A resume of a move whose abort began: part of it may be undone already (its replication dropped,
 * its change logs stopped, its shards writable again), so it is not carried on. It is aborted again.
 */
function abortToFinish(record: MoveRecord, step: MoveStep): RuntimeFailure {
  return new RuntimeFailure(
    'MOVE_ABORT_UNFINISHED',
    `move ${record.moveId} of ${shardsPhrase(record.shards)} (${record.source} to ${record.target}) was being aborted when it stopped, after step ${step}; it cannot be resumed. Abort it again to finish the undo`,
    { moveId: record.moveId, step, shards: [...record.shards] },
    undefined,
    [{ action: 'abort', shards: record.shards }],
  );
}

/** Drops the leftovers of killed runs on these hosts (all of the map's by default). */
async function dropAllLeftovers(
  config: ShardctlConfig,
  hosts: readonly HostConfig[] = config.hosts,
): Promise<(Leftover & { host: string })[]> {
  const unique = hosts.filter((h, i) => hosts.findIndex((o) => o.name === h.name) === i);
  const dropped = await Promise.all(
    unique.map((host) =>
      withSession(
        host,
        async ({ client }) =>
          (await dropLeftovers(client, await findLeftovers(client))).map((l) => ({ ...l, host: host.name })),
        {
          applicationName: 'shardctl move',
        },
      ),
    ),
  );
  return dropped.flat();
}

/** This host's record of the move; undefined when the host has none (or it is finished there). */
async function recordOf(side: HostSession, move: MoveRecord): Promise<MoveRecord | undefined> {
  return (await runningMoves(side.client, move.shards)).find((m) => m.moveId === move.moveId);
}

/**
 * Where to carry a move on from, when the two hosts' records of it may disagree. Every step is
 * recorded on both hosts at once (progress.ts, record), so a crash between the two updates leaves
 * them one step (or one wave) apart, either one ahead. The earlier step wins: the later one is
 * recorded on one host only, and redoing a step is safe (each step is written to be redone after
 * a crash), while skipping one that may be incomplete is not. The detail is the source's, merged
 * over the target's key by key (what only the source records, such as the fence marker, is kept);
 * only the wave comes from the earlier record, with its step.
 */
export function reconcileRecords(
  found: MoveRecord,
  onSource: MoveRecord | undefined,
  onTarget: MoveRecord | undefined,
): { step: MoveStep; detail: Record<string, unknown> } {
  const steps = stepsFor(found.mode);
  const both = [onSource, onTarget].filter((r): r is MoveRecord => r !== undefined);
  const earliest =
    both.sort((a, b) => steps.indexOf(a.step) - steps.indexOf(b.step) || waveOf(a) - waveOf(b))[0] ?? found;
  return {
    step: earliest.step,
    detail: { ...(onTarget ?? found).detail, ...(onSource ?? {}).detail, wave: waveOf(earliest) },
  };
}

function waveOf(record: MoveRecord): number {
  return typeof record.detail['wave'] === 'number' ? record.detail['wave'] : 0;
}

/** The unfinished moves, on any host, that carry any of `shards`; the map's hosts are all asked. */
export async function findRunningMoves(config: ShardctlConfig, shards?: readonly number[]): Promise<MoveRecord[]> {
  const errors: string[] = [];
  const found = new Map<string, MoveRecord>();
  await Promise.all(
    config.hosts.map(async (host) => {
      try {
        const records = await withSession(
          host,
          async ({ client }) => ((await controlTableExists(client, 'moves')) ? runningMoves(client, shards) : []),
          { applicationName: 'shardctl move' },
        );
        for (const r of records) {
          const seen = found.get(r.moveId);
          // The first host's record, told by the other that an abort of the move began.
          if (!seen) found.set(r.moveId, r);
          else if (abortBegun(r.detail) && !abortBegun(seen.detail))
            found.set(r.moveId, { ...seen, detail: { ...seen.detail, [MOVE_ABORTING]: true } });
        }
      } catch (error) {
        errors.push(`host ${host.name}: ${failureReason(error, describePgError)}`);
      }
    }),
  );
  if (errors.length > 0 && found.size === 0) {
    throw new RuntimeFailure('HOST_UNREACHABLE', `cannot look for unfinished moves: ${errors.join('; ')}`);
  }
  return [...found.values()].sort((a, b) => a.shards[0]! - b.shards[0]!);
}

interface Part {
  readonly source: HostSession;
  readonly target: HostSession;
}

/**
 * Runs `work` while the config file is checked against the fleet (requireFleetAgrees), both at once;
 * the file's refusal comes first, and then what `work` made is given to `discard`. A caller that
 * holds the runner locks (rebalance) has checked the file itself.
 */
async function whileAgreeing<T>(
  config: ShardctlConfig,
  options: MoveOptions,
  work: Promise<T>,
  discard?: (value: T) => Promise<void>,
): Promise<T> {
  const [agreed, done] = await Promise.allSettled([
    options.runnerLocksHeld ? undefined : requireFleetAgrees(config, 'shardctl move'),
    work,
  ]);
  if (agreed.status === 'rejected') {
    if (done.status === 'fulfilled') await discard?.(done.value);
    throw agreed.reason;
  }
  if (done.status === 'rejected') throw done.reason;
  return done.value;
}

/**
 * The connections one move works on. The command's own sessions hold the runner locks; a move's
 * sessions are recorded as workers (like any worker), so several moves of one batch can share a host.
 */
async function openPart(source: HostConfig, target: HostConfig, dryRun: boolean): Promise<Part> {
  const [part] = await openParts([connectPart(source, target)], undefined, dryRun);
  return part!;
}

/**
 * The parts of a batch, connecting while `locking` (the runner locks being taken) runs, and recorded
 * as workers only once it has succeeded: a worker recorded before the lock is held would be one
 * that another run, holding it, waits for. On any failure every part opened is closed and the
 * first failure thrown (the lock's first).
 */
async function openParts(
  connecting: readonly Promise<Part>[],
  locking: Promise<void> | undefined,
  dryRun: boolean,
): Promise<Part[]> {
  const [locked, ...connected] = await Promise.allSettled([locking, ...connecting]);
  const parts = connected.flatMap((c) => (c.status === 'fulfilled' ? [c.value] : []));
  try {
    if (locked!.status === 'rejected') throw locked!.reason;
    for (const c of connected) if (c.status === 'rejected') throw c.reason;
    if (!dryRun)
      await Promise.all(
        parts.flatMap((part) => [
          registerWorker(part.source.client, part.source.host.name),
          registerWorker(part.target.client, part.target.host.name),
        ]),
      );
    return parts;
  } catch (error) {
    await Promise.all(parts.map(closePart));
    throw error;
  }
}

async function connectPart(source: HostConfig, target: HostConfig): Promise<Part> {
  const [s, t] = await allOrNone(
    Promise.allSettled([
      openSession(source, { applicationName: 'shardctl move' }),
      openSession(target, { applicationName: 'shardctl move' }),
    ]),
    closeSession,
  );
  return { source: s!, target: t! };
}

async function closePart(part: Part): Promise<void> {
  await Promise.all([closeSession(part.source), closeSession(part.target)]);
}

/**
 * Runs the moves of a batch in parallel. One failing does not stop the others; when any failed, the
 * error names each failure (and what the others did), after all have finished.
 */
async function runParts(parts: readonly (() => Promise<MoveResult>)[]): Promise<MoveResult[]> {
  const settled = await Promise.allSettled(parts.map((run) => run()));
  const failures = settled
    .filter((s): s is PromiseRejectedResult => s.status === 'rejected')
    .map((s) => s.reason as unknown);
  if (failures.length === 0) return settled.map((s) => (s as PromiseFulfilledResult<MoveResult>).value);
  if (settled.length === 1) throw failures[0];
  const done = settled
    .filter((s): s is PromiseFulfilledResult<MoveResult> => s.status === 'fulfilled')
    .map((s) => s.value);
  const lines = [
    ...failures.map((f) => (f instanceof ShardctlError ? f.message : describePgError(f))),
    ...done.map((m) => `${shardsPhrase(m.shards)} ${m.outcome} from ${m.source} to ${m.target}`),
  ];
  throw new RuntimeFailure(
    'MOVE_FAILED',
    `${failures.length} of ${settled.length} moves failed:\n${lines.map((l) => `  - ${l}`).join('\n')}`,
    { done: done.map((m) => ({ moveId: m.moveId, shards: m.shards, outcome: m.outcome })) },
    lines,
    failures.flatMap((f) => (f instanceof ShardctlError ? f.next : [])),
  );
}

function groupBySource(config: ShardctlConfig, shards: readonly number[]): { source: HostConfig; shards: number[] }[] {
  const groups = new Map<string, { source: HostConfig; shards: number[] }>();
  for (const shard of shards) {
    const source = hostForShard(config, shard);
    if (!source)
      throw new UsageError(`shard ${shard} is not in the map`, { input: 'shards', value: formatShardList(shards) });
    let group = groups.get(source.name);
    if (!group) groups.set(source.name, (group = { source, shards: [] }));
    group.shards.push(shard);
  }
  return [...groups.values()];
}

function batchResult(
  outcome: BatchMoveResult['outcome'],
  target: string,
  shards: readonly number[],
  moves: readonly MoveResult[],
  started: number,
): BatchMoveResult {
  const blocked = moves.map((m) => m.writeBlockedMs).filter((ms): ms is number => ms !== null);
  return {
    outcome,
    target,
    shards,
    moves,
    rowsMoved: moves.reduce((n, m) => n + BigInt(m.rowsMoved), 0n).toString(),
    writeBlockedMs: blocked.length > 0 ? Math.max(...blocked) : null,
    durationMs: elapsed(started),
    leftoversDropped: [],
  };
}
