import { randomBytes } from 'node:crypto';
import type pg from 'pg';
import { INSERT_MOVE_SQL, RECORD_DETAIL_SQL, RECORD_STEP_SQL, RUNNING_MOVES_SQL } from './sql/control.js';
import { MOVE_ABORTING } from '../fleet/control.js';

/**
 * The steps of a move, in order. A step is recorded on both hosts once it has completed. Online,
 * the cut-over (fenced … switched) runs once per wave of shards: after a wave is switched and more
 * remain, the move is recorded back at `synced` with the next wave's number, so a resumed move
 * starts that wave's fence.
 */
export const ONLINE_STEPS = [
  'prepared',
  'target-created',
  'published',
  'copied',
  'subscribed',
  'synced',
  'fenced',
  'caught-up',
  'sequences-carried',
  'verified',
  'switched',
  'cleaned',
] as const;

export const OFFLINE_STEPS = [
  'prepared',
  'target-created',
  'fenced',
  'copied',
  'sequences-carried',
  'verified',
  'switched',
  'cleaned',
] as const;

export type MoveMode = 'online' | 'offline';
export type MoveStep = (typeof ONLINE_STEPS)[number] | (typeof OFFLINE_STEPS)[number];

export function stepsFor(mode: MoveMode): readonly MoveStep[] {
  return mode === 'online' ? ONLINE_STEPS : OFFLINE_STEPS;
}

export interface MoveRecord {
  readonly moveId: string;
  /** The shards of the move, ascending. */
  readonly shards: readonly number[];
  readonly source: string;
  readonly target: string;
  readonly mode: MoveMode;
  readonly step: MoveStep;
  readonly status: 'running' | 'done' | 'aborted';
  readonly detail: Record<string, unknown>;
}

/** Whether an abort of this move began (and was cut off, since the move is still running). */
export function abortBegun(detail: Readonly<Record<string, unknown>>): boolean {
  return detail[MOVE_ABORTING] === true;
}

/** A new move's id: sortable by start time, unique across hosts and processes. */
export function newMoveId(): string {
  return `${Date.now().toString(36)}${randomBytes(3).toString('hex')}`;
}

/**
 * Records a new move and claims its shards (one running move per shard: the claim's primary key
 * refuses a second), in one transaction. Idempotent for the same move id. The row's `shard` is the
 * batch's first: the control schema's column is NOT NULL (sql/control.sql).
 */
export async function insertMove(client: pg.Client, move: Omit<MoveRecord, 'status'>): Promise<void> {
  await client.query(INSERT_MOVE_SQL, [
    move.moveId,
    move.shards,
    move.source,
    move.target,
    move.mode,
    move.step,
    JSON.stringify(move.detail),
  ]);
}

/** Records a completed step (and merges `detail`); a finished or aborted move releases its shards. */
export async function recordStep(
  client: pg.Client,
  moveId: string,
  step: MoveStep,
  status: MoveRecord['status'] = 'running',
  detail: Record<string, unknown> = {},
): Promise<void> {
  await client.query(RECORD_STEP_SQL, [moveId, step, status, JSON.stringify(detail)]);
}

/**
 * Merges `detail` into a running move's record, its step unchanged (a move finished or aborted on
 * this host already is left as it is).
 */
export async function recordDetail(client: pg.Client, moveId: string, detail: Record<string, unknown>): Promise<void> {
  await client.query(RECORD_DETAIL_SQL, [moveId, JSON.stringify(detail)]);
}

/** recordDetail on both hosts of a move at once. */
export async function recordDetailOnBoth(
  move: { readonly moveId: string; readonly source: { client: pg.Client }; readonly target: { client: pg.Client } },
  detail: Record<string, unknown>,
): Promise<void> {
  await Promise.all(
    [move.source.client, move.target.client].map((client) => recordDetail(client, move.moveId, detail)),
  );
}

/** The unfinished moves on this host that carry any of `shards` (all unfinished moves without it). */
export async function runningMoves(client: pg.Client, shards?: readonly number[]): Promise<MoveRecord[]> {
  const result = await client.query<{
    move_id: string;
    shards: number[];
    source: string;
    target: string;
    mode: MoveMode;
    step: MoveStep;
    status: MoveRecord['status'];
    detail: Record<string, unknown>;
  }>(RUNNING_MOVES_SQL, [shards ?? null]);
  return result.rows.map((row) => ({
    moveId: row.move_id,
    shards: row.shards,
    source: row.source,
    target: row.target,
    mode: row.mode,
    step: row.step,
    status: row.status,
    detail: row.detail,
  }));
}

/**
 * Fault injection for the crash tests: die right after `point` (a step once it is recorded,
 * 'probe' once the reachability probe exists, 'target-migrations' once the target's copies are
 * built and before their owners and grants are carried, 'first-undo' once an abort has undone its
 * first step), as SIGKILL would.
 */
export function faultAfter(point: MoveStep | 'probe' | 'target-migrations' | 'first-undo'): void {
  if (process.env['SHARDCTL_FAULT_AFTER_STEP'] === point) process.kill(process.pid, 'SIGKILL');
}

/**
 * Fault injection for the resume tests: die (as SIGKILL would) once this process has committed
 * SHARDCTL_FAULT_AFTER_CHUNKS chunks of a copy (chunks.ts).
 */
let chunksCommitted = 0;
export function faultAfterChunk(): void {
  chunksCommitted += 1;
  if (process.env['SHARDCTL_FAULT_AFTER_CHUNKS'] === String(chunksCommitted)) process.kill(process.pid, 'SIGKILL');
}
