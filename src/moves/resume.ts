import type { HostConfig, ShardctlConfig } from '../config/types.js';
import { shardsPhrase } from '../config/ranges.js';
import { failureReason, RuntimeFailure, UsageError } from '../errors.js';
import { describePgError } from '../fleet/connect.js';
import { completeControlSchema, controlTableExists, MOVE_ABORTING } from '../fleet/control.js';
import { Fleet, withSession, type HostSession } from '../fleet/session.js';
import type { MigrationFile } from '../migrations/files.js';
import { announce, moveContext, moveResult, type MoveOptions } from './context.js';
import { watchInterrupt } from './interrupt.js';
import { abortMove, runSteps } from './move.js';
import { dropLeftovers, findLeftovers, type Leftover } from './leftovers.js';
import { checkAfterFailover } from './failover.js';
import { batchResult, runParts, type BatchMoveResult } from './batch.js';
import { closePart, openPart, whileAgreeing } from './parts.js';
import { abortBegun, runningMoves, stepsFor, type MoveRecord, type MoveStep } from './state.js';

/**
 * Resume and abort: the unfinished moves of some shards found on the hosts (findRunningMoves), the
 * step each carries on from when its two hosts' records disagree (reconcileRecords), and each
 * carried on from there or undone; an abort also drops what killed runs left behind.
 */

/**
 * A target or mode named with --resume or --abort that one of the moves did not record: the move
 * would go on to (or be undone from) its own, whatever was named, so the command is refused.
 */
function refuseOtherStated(records: readonly MoveRecord[], stated: MoveOptions['stated']): void {
  for (const [input, named, recorded] of [
    ['target', stated?.target, (r: MoveRecord) => r.target],
    ['mode', stated?.mode, (r: MoveRecord) => r.mode],
  ] as const) {
    const other = named === undefined ? undefined : records.find((r) => recorded(r) !== named);
    if (other)
      throw new UsageError(
        `the unfinished move ${other.moveId} of ${shardsPhrase(other.shards)} is ${other.mode}, from ${other.source} to ${other.target}, and keeps its ${input}; give ${input === 'target' ? `--to ${other.target}` : `--mode ${other.mode}`} or none`,
        { input, value: named },
      );
  }
}

/** Resume and abort: the unfinished moves that carry any of the shards, carried on or undone. */
export async function continueMoves(
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
  refuseOtherStated(records, options.stated);
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
    let current = records;
    if (!options.dryRun && !options.runnerLocksHeld) {
      await fleet.lock({ lockTimeout: config.lockTimeout });
      current = await stillUnfinished(config, shards, records, options);
    }
    const moves = await runParts(
      current.map((record) => async () => {
        const part = await openPart(hostOf(record.source), hostOf(record.target), options.dryRun ?? false);
        try {
          const { step, detail } = reconcileRecords(
            record,
            await recordOf(part.source, record),
            await recordOf(part.target, record),
          );
          if (options.resume && abortBegun(detail)) throw abortToFinish(record, step);
          // A move an older shardctl began: the control schema brought up to date first on both
          // hosts (the change logs this run sets up write its newer columns), as a new move does.
          if (!options.dryRun)
            await Promise.all([part.source, part.target].map((side) => completeControlSchema(side.client, config)));
          const ctx = moveContext(config, { ...record, detail }, part, migrations, options);
          watchInterrupt(ctx);
          const steps = stepsFor(record.mode);
          if (options.dryRun)
            return { ...moveResult(ctx, 'dry-run', [], started), plan: steps.slice(steps.indexOf(step) + 1) };
          if (options.abort) {
            await abortMove(ctx, step);
            return moveResult(ctx, 'aborted', [], started);
          }
          // A failover since may have taken the slot, or changes the target had applied: the copy restarts then.
          const from = await checkAfterFailover(ctx, step, detail);
          // `cleaned` where the record was not: the move was split and both parts carried to the end
          // (continueUnswitched, which said so); nothing is left to resume.
          if (from !== 'cleaned' || step === 'cleaned') {
            announce(ctx, from, `resuming move ${record.moveId} (${shardsPhrase(record.shards)}) after step ${from}`);
            await runSteps(ctx, from);
          }
          return moveResult(ctx, 'moved', [], started);
        } finally {
          await closePart(part);
        }
      }),
    );
    const target = [...new Set(current.map((r) => r.target))].join(', ');
    const result = batchResult(
      options.abort ? 'aborted' : options.dryRun ? 'dry-run' : 'moved',
      target,
      [...new Set(current.flatMap((r) => r.shards))].sort((a, b) => a - b),
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
 * The moves found before the runner locks were taken, as the hosts record them now that this run
 * holds the locks: another run (a second operator's --resume or --abort, a rebalance) may have
 * finished or undone some of them while this one waited for the locks, and carrying one on from
 * the step read before would redo its steps on a finished move (a new subscription to a dropped
 * publication, waited for until the subscription's limit, and left behind). Refused with NO_MOVE
 * when none is left; the others go on from their current records (an abort begun meanwhile too).
 */
async function stillUnfinished(
  config: ShardctlConfig,
  shards: readonly number[],
  found: readonly MoveRecord[],
  options: MoveOptions,
): Promise<MoveRecord[]> {
  const now = await findRunningMoves(config, shards);
  const current = found.flatMap((r) => now.filter((n) => n.moveId === r.moveId));
  if (current.length > 0) return current;
  const ids = found.map((r) => r.moveId).join(', ');
  throw new RuntimeFailure(
    'NO_MOVE',
    `no unfinished move of ${shardsPhrase(shards)} is left to ${options.resume ? 'resume' : 'abort'}: ${found.length === 1 ? 'move' : 'moves'} ${ids} ${found.length === 1 ? 'was' : 'were'} finished or undone by another run while this one waited for the runner lock; nothing was changed`,
    { moveIds: found.map((r) => r.moveId) },
  );
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
