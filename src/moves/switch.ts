import pg from 'pg';
import { rewriteShardOwner } from '../config/rewrite.js';
import { switchPlacementSql } from '../fleet/placement.js';
import { formatShardList, shardsPhrase } from '../config/ranges.js';
import { HostError } from '../errors.js';
import { describePgError } from '../fleet/connect.js';
import { ACTIVE_SHARDS_SQL } from './sql/control.js';
import { stepsFor, type MoveStep } from './state.js';
import { throwIfInterrupted } from './interrupt.js';
import { leavesNow, shardPrivileges, type LeafTable } from './catalog.js';
import { privilegeVersions, syncPrivilegesSql } from './privileges.js';
import { heldBefore } from './targets.js';
import { inTransaction } from '../pg/quiet.js';
import type { Sql } from '../pg/sql-template.js';
import { verifyShards, type VerifyResult } from './verify.js';
import { readChanges, stopDeltas, stopTracking } from './tail.js';
import { ensureMethods } from './checksum-methods.js';
import { type MoveContext, schemasOf, waveShards } from './context.js';
import { inflect } from '../text.js';
import {
  fenceRemainingMs,
  underFence,
  endFenceTimeouts,
  currentFenceReads,
  noteBlocked,
  releaseWave,
  stopCutOver,
} from './fence-limit.js';
import { dropPreVerification } from './pre-verification.js';
import { currentTargetNow } from './catch-up.js';

/**
 * The end of a wave's cut-over: the verification of both copies while fenced, and the switch of the
 * map to the target. The steps before it: pre-verification.ts, fence.ts (with fence-limit.ts,
 * fence-locks.ts), catch-up.ts, sequences.ts; the undo: unfence.ts.
 */

export async function verify(ctx: MoveContext): Promise<UndoThenReport | undefined> {
  const shards = waveShards(ctx);
  const schemas = schemasOf(ctx, shards);
  const methods = await ensureMethods(ctx);
  const pre = ctx.current.pre;
  const online = ctx.mode === 'online';
  const within = <T>(what: string, fn: () => Promise<T>, also: readonly pg.Client[] = []): Promise<T> =>
    online ? underFence(ctx, what, fn, also) : fn();
  let result: VerifyResult;
  try {
    result = await within(
      `the verification of ${formatShardList(shards)} (row counts and checksums on both hosts)`,
      async () => {
        const known = currentTargetNow(ctx)?.changes;
        const tail = pre ? { pre, changes: known ?? (await readChanges(ctx.target.client, ctx.moveId)) } : undefined;
        const emptyBefore = ctx.current.untracked?.tables;
        return verifyShards(ctx.source.client, ctx.target.client, schemas, methods, tail, {
          emptyBefore,
          leaves: await leavesAfterFence(ctx),
        });
      },
      pre ? [pre.source, pre.target] : [],
    );
  } finally {
    // The logs go below, within the fence limit; the wave is fenced, so nothing writes to them meanwhile.
    await dropPreVerification(ctx, { logs: false });
  }
  // Still fenced: the target's tracking triggers and change logs go before its copies take
  // application writes (whatever run created them: a killed run's too), unless this run found
  // none on the wave's tables before its fence and created none. The source's logs stay on the
  // wave's old copies, which refuse every write from now on (a failed verification's unfence
  // switches them off, and the next wave's set-up or the clean-up deletes their entries).
  if (ctx.current.untracked?.triggers !== false) {
    await within(`the removal of the tracking triggers on ${ctx.target.host.name}`, () =>
      stopTracking(ctx.target.client, ctx.moveId, schemas),
    );
    await within(`the removal of the change logs on ${ctx.target.host.name}`, () =>
      stopDeltas(ctx.target.client, ctx.moveId, schemas),
    );
  }
  const before = ctx.verification;
  ctx.verification = before
    ? {
        ok: before.ok && result.ok,
        rows: before.rows + result.rows,
        tables: [...before.tables, ...result.tables],
        mismatches: [...before.mismatches, ...result.mismatches],
        byKey: { tables: before.byKey.tables + result.byKey.tables, keys: before.byKey.keys + result.byKey.keys },
        byLog: {
          tables: before.byLog.tables + result.byLog.tables,
          changes: before.byLog.changes + result.byLog.changes,
        },
        whole: [...before.whole, ...result.whole],
        truncated: [...before.truncated, ...result.truncated],
        filled: [...before.filled, ...result.filled],
        empty: before.empty + result.empty,
      }
    : result;
  if (result.ok) {
    ctx.rowsVerified += result.rows;
    return undefined;
  }
  const mismatches = result.mismatches.map((m) => `  - ${m}`).join('\n');
  const data = { moveId: ctx.moveId, verification: { ...result, rows: result.rows.toString() } };
  if (ctx.wave === 0) {
    // Nothing switched yet: the move is undone, the sources writable again, nothing is lost.
    return {
      undoFrom: 'sequences-carried',
      failure: new HostError(
        ctx.target.host.name,
        `verification failed, the move was aborted and the source on ${ctx.source.host.name} is writable again:\n${mismatches}`,
        {
          shard: shards[0]!,
          code: 'VERIFY_FAILED',
          data,
          details: result.mismatches,
        },
      ),
    };
  }
  // Earlier waves are live on the target: this wave is unfenced and the move stops, resumable.
  try {
    await releaseWave(ctx);
  } catch (error) {
    throw new HostError(
      ctx.source.host.name,
      `verification failed, and shards ${formatShardList(shards)} could not be unfenced on ${ctx.source.host.name}: ${describePgError(error)}. ` +
        `Resume the move to retry this wave (earlier waves are already on ${ctx.target.host.name}):\n${mismatches}`,
      {
        shard: shards[0]!,
        code: 'VERIFY_FAILED',
        cause: error,
        data,
        details: result.mismatches,
        next: [{ action: 'resume', shards: ctx.shards }],
      },
    );
  }
  throw new HostError(
    ctx.target.host.name,
    `verification failed; shards ${formatShardList(shards)} were unfenced and are writable on ${ctx.source.host.name} (earlier waves are already on ${ctx.target.host.name}); resume the move to retry this wave:\n${mismatches}`,
    {
      shard: shards[0]!,
      code: 'VERIFY_FAILED',
      data,
      details: result.mismatches,
      next: [{ action: 'resume', shards: ctx.shards }],
    },
  );
}

/**
 * Each host's tables of the wave as they are while it is fenced, from the lists read before the
 * fence (the wave's leaves): the source's as its fence transactions reported them (sourceNow), the
 * target's as its catch-up reported them (targetNow), or else looked up by OID; undefined
 * (verifyShards reads them) when this run has no list. A table
 * added by hand after the list is not seen here: its writes reach no table on the target, so the
 * replication stops and the catch-up ends at the fence limit.
 */
async function leavesAfterFence(
  ctx: MoveContext,
): Promise<{ source: readonly LeafTable[]; target: readonly LeafTable[] } | undefined> {
  const listed = ctx.current.leaves;
  if (!listed) return undefined;
  const fromFence = ctx.current.sourceNow ?? undefined;
  const fromCatchUp = currentTargetNow(ctx)?.leaves;
  const [source, target] = await Promise.all([
    fromFence && fromFence.length === listed.source.length ? fromFence : leavesNow(ctx.source.client, listed.source),
    fromCatchUp && fromCatchUp.length === listed.target.length
      ? fromCatchUp
      : leavesNow(ctx.target.client, listed.target),
  ]);
  return { source, target };
}

/** The map now says target for the wave: its copies become active, and the config file is rewritten in place. */
export async function switchMap(ctx: MoveContext): Promise<void> {
  const shards = waveShards(ctx);
  // The last point at which the wave can still go back: once the target's copies are active, the
  // switch is finished whatever it takes.
  if (ctx.mode === 'online' && fenceRemainingMs(ctx) <= 0) await stopCutOver(ctx, 'the steps before the switch');
  // The target's statement is the switch itself: its copies active, its placement copy and
  // version, one transaction. The source's placement copy says the target too, at a version below
  // the target's. With the version the fence string read, both at once: whichever commits first,
  // a reader routes to the source while the target is not active (the source refuses writes,
  // naming the target), and to the active target after. Without it (a resumed run), the source's
  // first, which returns its version.
  const target = ctx.target.host.name;
  const reads = currentFenceReads(ctx);
  const grants = await withheldGrants(ctx, shards);
  // Asked to stop (interrupt.ts): the last moment the wave can still be released.
  throwIfInterrupted(ctx);
  // From here the target may take the shards: watchFence no longer cuts it off.
  ctx.current.switchSent = true;
  if (reads) {
    const v = reads.placementVersion;
    const settled = await Promise.allSettled([
      ctx.source.client.query(switchPlacementSql(false), [shards, target, (v + 1n).toString()]),
      activateOnTarget(ctx, shards, (v + 2n).toString(), grants),
    ]);
    for (const r of settled) if (r.status === 'rejected') throw r.reason;
  } else {
    const onSource = await ctx.source.client.query<{ version: string }>(switchPlacementSql(false), [
      shards,
      target,
      '0',
    ]);
    await activateOnTarget(ctx, shards, onSource.rows[0]!.version, grants);
  }
  // Writable again from here: the fleet's placement names the target, whose copies are active (the
  // routers follow the fleet, not the file).
  noteBlocked(ctx);
  await endFenceTimeouts(ctx);
  const file = ctx.settings.configFile;
  try {
    await rewriteShardOwner(file, shards, ctx.source.host.name, ctx.target.host.name);
  } catch (error) {
    throw new HostError(
      ctx.target.host.name,
      `the target ${inflect(shards.length, 'copy of shard', 'copies of shards')} ${formatShardList(shards)} ${inflect(shards.length, 'is', 'are')} active, but the map ${file} could not be rewritten: ${(error as Error).message}. ` +
        `Fix that and resume the move (it can no longer be aborted)`,
      { shard: shards[0]!, code: 'MAP_REWRITE_FAILED', cause: error, next: [{ action: 'resume', shards: ctx.shards }] },
    );
  }
}

/**
 * The grants a guarded copy's schema was kept without while incoming (privileges.ts
 * withheldSchemaAcl): the statements that give the wave's guarded schemas on the target the
 * source's owners and ACLs, as they are now (fenced, the source's do not move). Read from both
 * hosts only for a wave with a guarded shard; none otherwise, or when they are already equal (a
 * resumed run whose switch committed them).
 */
async function withheldGrants(ctx: MoveContext, shards: readonly number[]): Promise<Sql[]> {
  const guarded = await heldBefore(ctx);
  const schemas = schemasOf(
    ctx,
    shards.filter((shard) => guarded.has(shard)),
  );
  if (schemas.length === 0) return [];
  const [wanted, current] = await Promise.all([
    shardPrivileges(ctx.source.client, schemas, true),
    shardPrivileges(ctx.target.client, schemas, true),
  ]);
  return syncPrivilegesSql(
    wanted,
    current,
    privilegeVersions(ctx.source.serverVersionNum, ctx.target.serverVersionNum),
  );
}

/**
 * The switch on the target: its copies active and its placement copy moved (switchPlacementSql),
 * with the grants their schemas were kept without, in one transaction: an application role can use
 * a guarded copy from the moment it is active, never before.
 */
async function activateOnTarget(
  ctx: MoveContext,
  shards: readonly number[],
  version: string,
  grants: readonly Sql[],
): Promise<void> {
  const { client } = ctx.target;
  const params = [shards, ctx.target.host.name, version];
  if (grants.length === 0) {
    await client.query(switchPlacementSql(true), params);
    return;
  }
  await inTransaction(client, ['BEGIN;', ...grants].join('\n'), () => client.query(switchPlacementSql(true), params));
}

/**
 * Whether the move may still be undone: the switch activates the target's copies before it
 * rewrites the map and records the step, so a run killed in between left active copies that the
 * map may already name, and undoing the move then would leave two writable copies. Throws if not.
 */
export async function requireNotSwitched(ctx: MoveContext, step: MoveStep): Promise<void> {
  const steps = stepsFor(ctx.mode);
  const active = await ctx.target.client.query<{ shard: number }>(ACTIVE_SHARDS_SQL, [ctx.shards]);
  if (steps.indexOf(step) >= steps.indexOf('switched') || ctx.wave > 0 || (active.rowCount ?? 0) > 0) {
    const switched = active.rows.map((r) => r.shard);
    throw new HostError(
      ctx.target.host.name,
      `move ${ctx.moveId} already switched ${shardsPhrase(switched.length > 0 ? switched : ctx.shards)} to ${ctx.target.host.name}; it cannot be aborted. ` +
        `Resume it to finish it, then move the shards back if needed.`,
      { shard: ctx.shards[0]!, code: 'MOVE_SWITCHED', next: [{ action: 'resume', shards: ctx.shards }] },
    );
  }
}

/**
 * What a step may return instead of going on: undo the move back from `undoFrom`, then report
 * `failure` (the verification of the first wave: nothing switched yet). The step cannot undo the
 * move itself: the undo of every step is move.ts's, which runs the steps.
 */
export interface UndoThenReport {
  readonly undoFrom: MoveStep;
  readonly failure: HostError;
}
