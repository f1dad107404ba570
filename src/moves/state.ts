import type pg from 'pg';
import { CONTROL } from '../fleet/control.js';

/** The steps of a move, in order. A step is recorded on both hosts once it has completed. */
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
  readonly shard: number;
  readonly source: string;
  readonly target: string;
  readonly mode: MoveMode;
  readonly step: MoveStep;
  readonly status: 'running' | 'done' | 'aborted';
  readonly detail: Record<string, unknown>;
}


export async function insertMove(client: pg.Client, move: Omit<MoveRecord, 'status' | 'detail'>): Promise<void> {
  await client.query(
    `INSERT INTO ${CONTROL}.moves (move_id, shard, source, target, mode, step, status) VALUES ($1, $2, $3, $4, $5, $6, 'running')
     ON CONFLICT (move_id) DO NOTHING`,
    [move.moveId, move.shard, move.source, move.target, move.mode, move.step],
  );
}

export async function recordStep(
  client: pg.Client,
  moveId: string,
  step: MoveStep,
  status: MoveRecord['status'] = 'running',
  detail: Record<string, unknown> = {},
): Promise<void> {
  await client.query(
    `UPDATE ${CONTROL}.moves SET step = $2, status = $3, updated_at = now(), detail = detail || $4::jsonb WHERE move_id = $1`,
    [moveId, step, status, JSON.stringify(detail)],
  );
}

/** The unfinished move of a shard on this host, if any. */
export async function runningMove(client: pg.Client, shard: number): Promise<MoveRecord | null> {
  const result = await client.query<{
    move_id: string;
    shard: number;
    source: string;
    target: string;
    mode: MoveMode;
    step: MoveStep;
    status: MoveRecord['status'];
    detail: Record<string, unknown>;
  }>(
    `SELECT move_id, shard, source, target, mode, step, status, detail FROM ${CONTROL}.moves WHERE shard = $1 AND status = 'running'`,
    [shard],
  );
  const row = result.rows[0];
  return row
    ? { moveId: row.move_id, shard: row.shard, source: row.source, target: row.target, mode: row.mode, step: row.step, status: row.status, detail: row.detail }
    : null;
}
