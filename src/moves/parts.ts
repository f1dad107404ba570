import type { HostConfig, ShardctlConfig } from '../config/types.js';
import { registerWorker } from '../fleet/locks.js';
import { requireFleetAgrees } from '../fleet/placement.js';
import { closeSession, openSession, type HostSession } from '../fleet/session.js';
import { allOrNone } from '../promises.js';
import type { MoveOptions } from './context.js';

/**
 * The connections a batch's moves work on (a source and a target session per move, recorded as
 * workers once the runner locks are held), and the check of the config file against the fleet
 * that runs while they open.
 */

export interface Part {
  readonly source: HostSession;
  readonly target: HostSession;
}

/**
 * Runs `work` while the config file is checked against the fleet (requireFleetAgrees), both at once;
 * the file's refusal comes first, and then what `work` made is given to `discard`. A caller that
 * holds the runner locks (rebalance) has checked the file itself.
 */
export async function whileAgreeing<T>(
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
export async function openPart(source: HostConfig, target: HostConfig, dryRun: boolean): Promise<Part> {
  const [part] = await openParts([connectPart(source, target)], undefined, dryRun);
  return part!;
}

/**
 * The parts of a batch, connecting while `locking` (the runner locks being taken) runs, and recorded
 * as workers only once it has succeeded: a worker recorded before the lock is held would be one
 * that another run, holding it, waits for. On any failure every part opened is closed and the
 * first failure thrown (the lock's first).
 */
export async function openParts(
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

export async function connectPart(source: HostConfig, target: HostConfig): Promise<Part> {
  const [s, t] = await allOrNone(
    Promise.allSettled([
      openSession(source, { applicationName: 'shardctl move' }),
      openSession(target, { applicationName: 'shardctl move' }),
    ]),
    closeSession,
  );
  return { source: s!, target: t! };
}

export async function closePart(part: Part): Promise<void> {
  await Promise.all([closeSession(part.source), closeSession(part.target)]);
}
