import type pg from 'pg';
import { formatShardList } from '../config/ranges.js';
import { controlTableExists } from '../fleet/control.js';
import { inflect } from '../text.js';
import { RUNNING_MOVES_OF_SQL } from './sql/control.js';

/**
 * The preflight's view of the moves already running on the batch's hosts: which, and the words that
 * name one so that a second operator can tell it from theirs and knows how to finish or undo it.
 */

/** Shards on the source that are not active: in a running move (named), or not recorded (init). */
export function inactiveMessage(
  which: string,
  host: string,
  inactive: readonly { shard: number; state: string | null }[],
  running: readonly RunningMove[],
): string {
  const moves = running.filter((m) => inactive.some((r) => m.shards.includes(r.shard)));
  const be = inflect(inactive.length, 'is', 'are');
  if (moves.length > 0)
    return `${which} on ${host} ${be} ${inactive[0]!.state ?? 'not active'}: ${moves.map(describeRunningMove).join('; ')}`;
  if (inactive.every((r) => r.state === null))
    return `${which} on ${host} ${be} not recorded by shardctl; run shardctl init first`;
  return `${which} on ${host} ${be} ${inactive[0]!.state} and no unfinished move of ${inflect(inactive.length, 'it', 'them')} is recorded; run shardctl status to see why`;
}

export interface RunningMove {
  readonly moveId: string;
  readonly shards: readonly number[];
  readonly source: string;
  readonly target: string;
  readonly step: string;
  /** An abort of it began and was cut off: it can only be aborted again. */
  readonly aborting: boolean;
}

export async function runningMovesOf(client: pg.Client, shards: readonly number[]): Promise<RunningMove[]> {
  if (!(await controlTableExists(client, 'moves'))) return [];
  const r = await client.query<{
    move_id: string;
    shards: number[];
    source: string;
    target: string;
    step: string;
    aborting: boolean;
  }>(RUNNING_MOVES_OF_SQL, [shards]);
  return r.rows.map((row) => ({
    moveId: row.move_id,
    shards: row.shards,
    source: row.source,
    target: row.target,
    step: row.step,
    aborting: row.aborting,
  }));
}

/**
 * The unfinished move, named so that a second operator can tell it from theirs, and the commands
 * that finish or undo it.
 */
export function describeRunningMove(move: RunningMove): string {
  const shards = formatShardList([...move.shards]);
  return (
    `move ${move.moveId} (${inflect(move.shards.length, 'shard')} ${shards}, ${move.source} → ${move.target}, last step done: ${move.step}) is unfinished; ` +
    (move.aborting
      ? `its abort was cut off: finish the undo with shardctl move-shard ${shards} --abort`
      : `finish it with shardctl move-shard ${shards} --resume, or undo it with shardctl move-shard ${shards} --abort`)
  );
}
