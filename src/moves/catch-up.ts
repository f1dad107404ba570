import pg from 'pg';
import { HostError } from '../errors.js';
import { describePgError } from '../fleet/connect.js';
import { HOST_SILENT } from '../fleet/silence.js';
import { catchUpSql } from './sql/catch-up.js';
import { runTransaction } from '../pg/quiet.js';
import { type LeafTable } from './catalog.js';
import { changesOf, type ChangesRow } from './tail.js';
import { type MoveContext, type WaveState } from './context.js';
import { applyWorkerWaits } from './replication.js';
import { fenceRemainingMs, stopCutOver } from './fence-limit.js';

/**
 * The catch-up: the target has applied everything up to the fence's marker, and what the
 * verification needs of it is read in the same round trip.
 */

/**
 * Logical replication applies in commit order: once the fence marker is on the target, so is every
 * earlier change. One round trip (catchUpSql): the target looks for the marker itself, every
 * millisecond, and then reads what the verification needs of it (ctx.targetNow).
 */
export async function waitForCatchUp(ctx: MoveContext): Promise<void> {
  const catchUp = ctx.settings.catchUpTimeoutMs;
  const limit = Math.min(catchUp, Math.max(0, fenceRemainingMs(ctx)));
  try {
    // The fence records its marker with its step: a wave fenced without one cannot be caught up,
    // and stopping here unfences it, so that a resumed run fences again with a marker.
    if (ctx.current.fenceMarker === null) throw new Error(`no fence marker is recorded for wave ${ctx.wave + 1}`);
    await catchUpAndRead(ctx, ctx.current.fenceMarker, limit);
  } catch (error) {
    // What the apply worker waits for only adds to the message; a target cut off cannot say.
    const silent = error instanceof HostError && error.code === HOST_SILENT;
    const apply = silent ? describePgError(error) : await applyWorkerWaits(ctx).catch(() => '');
    await stopCutOver(
      ctx,
      `the target ${ctx.target.host.name} to apply the changes committed before the fence${apply ? ` (${apply})` : ''}`,
      error,
    );
  }
}

async function catchUpAndRead(ctx: MoveContext, marker: string, limitMs: number): Promise<void> {
  const leaves = ctx.current.leaves?.target ?? [];
  const changes = ctx.current.pre !== null;
  const sql = catchUpSql({
    moveId: ctx.moveId,
    kind: marker,
    limitMs,
    readsWithinMs: fenceRemainingMs(ctx),
    leaves: leaves.map((t) => t.oid),
    changes,
  });
  const results = await runTransaction(ctx.target.client, sql);
  // Here the marker is applied: the wait fails otherwise, and the reads after it are not run.
  const read = results.find((r) => hasField(r, 'keys_json'));
  ctx.current.targetNow = {
    marker,
    leaves: leavesReported(leaves, results),
    changes: changes && read ? changesOf(read.rows as ChangesRow[]) : null,
  };
}

export function hasField(result: pg.QueryResult, name: string): boolean {
  return result.fields?.some((f) => f.name === name) ?? false;
}

/**
 * The listed tables with their emptiness as a string's reportEmptySql rows (oid, empty) say it, in
 * every result that has them; a table they do not report, or no longer find (NULL), is left out, as
 * leavesNow does.
 */
export function leavesReported(leaves: readonly LeafTable[], results: readonly pg.QueryResult[]): LeafTable[] {
  const empty = new Map<number, boolean | null>();
  for (const r of results)
    if (hasField(r, 'empty'))
      for (const row of r.rows as { oid: number; empty: boolean | null }[]) empty.set(row.oid, row.empty);
  return leaves.flatMap((t) => {
    const e = empty.get(t.oid);
    return e === undefined || e === null ? [] : [{ ...t, empty: e }];
  });
}

/** What the target said when this fence attempt's catch-up saw its marker (the wave's targetNow), or null: an earlier attempt's, or none. */
export function currentTargetNow(ctx: MoveContext): WaveState['targetNow'] {
  const now = ctx.current.targetNow;
  return now?.marker === ctx.current.fenceMarker ? now : null;
}
