import pg from 'pg';
import { describePgError } from '../fleet/connect.js';
import { openWorker } from '../fleet/session.js';
import { DELTA_TRIGGERS, TRACK_TRIGGERS } from './sql/names.js';
import { startDeltasSql, type LoggedTable, startTrackingSql } from './sql/tail.js';
import { endQuietly, runTransaction } from '../pg/quiet.js';
import { keyedTables, shardLeaves, shardTriggers, type ShardTable } from './catalog.js';
import { endPreVerification, preVerify, type HashMethod } from './verify.js';
import { startSourceDeltas, stopDeltas, stopTracking } from './tail.js';
import { elapsed } from '../clock.js';
import { allOrNone, awaitedLater } from '../promises.js';
import { ensureMethods, leafTablesOf } from './checksum-methods.js';
import { type MoveContext, schemasOf, notice, waveShards } from './context.js';
import { inflect, plural } from '../text.js';
import { lockWaitFor } from './fence-locks.js';
import { takeCopyFigures } from './copy-logs.js';

/**
 * The verification's first part, begun before the fence while the wave is writable (tail.ts):
 * change tracking and change logs, a snapshot on both hosts; and its removal.
 */

/**
 * The first part of the wave's verification, while the source is still writable (see tail.ts):
 * tracking of the keyed tables on the target, change logs of the others on both hosts and of the
 * keyed ones on the source, then a snapshot of all of them on both hosts, kept open until the wave
 * is verified. Tables empty on the source now are left out (the wave's untracked): while fenced they hold
 * only the rows written during the cut-over, and are checksummed whole, or not read at all when
 * still empty on both hosts; no trigger is created on them, nor dropped while fenced. Best effort:
 * if the logs cannot be had, the tables without a key are checksummed whole while fenced and the
 * keyed ones compared by key on both hosts; if nothing can, every table is checksummed whole.
 * The large keyed tables the copy summed chunk by chunk are not read at P: their figures come from
 * those sums and the logs since (copy-logs.ts).
 */
export async function startPreVerification(ctx: MoveContext, schemas: readonly string[]): Promise<void> {
  await dropPreVerification(ctx);
  if (ctx.mode !== 'online') return;
  let held: pg.Client[] = [];
  let opening: Promise<PromiseSettledResult<pg.Client>[]> | null = null;
  try {
    const [leaves, leftOnTarget, leftOnSource] = await Promise.all([
      ctx.current.leaves?.source ?? shardLeaves(ctx.source.client, schemas),
      shardTriggers(ctx.target.client, schemas, [...TRACK_TRIGGERS, ...DELTA_TRIGGERS]),
      shardTriggers(ctx.source.client, schemas, DELTA_TRIGGERS),
    ]);
    const empty = new Set(leaves.filter((t) => t.empty).map((t) => `${t.schema}.${t.table}`));
    // Until it is known that the wave has none, its verification removes triggers (a killed run's too).
    ctx.current.untracked = { tables: empty, triggers: true };
    const keyed = (await keyedTables(ctx.source.client, schemas)).filter(
      (k) => !empty.has(`${k.table.schema}.${k.table.table}`),
    );
    const methods = await ensureMethods(ctx);
    const isKeyed = new Set(keyed.map((k) => `${k.table.schema}.${k.table.table}`));
    const unkeyed = (await leafTablesOf(ctx, schemas)).filter(
      (t) => !isKeyed.has(`${t.schema}.${t.table}`) && !empty.has(`${t.schema}.${t.table}`),
    );
    if (keyed.length === 0 && unkeyed.length === 0) {
      ctx.current.untracked = { tables: empty, triggers: leftOnTarget.length + leftOnSource.length > 0 };
      return;
    }
    // The verification's two sessions connect while the tracking and the change logs are set up
    // (their snapshots are taken after).
    opening = Promise.allSettled([
      openWorker(ctx.source.host, 'shardctl move verify'),
      openWorker(ctx.target.host, 'shardctl move verify'),
    ]);
    // The copy's figures of the large tables (copy-logs.ts): their logs' entries since the copy's
    // snapshot are kept by the set-up below.
    const fromCopy = takeCopyFigures(
      ctx,
      keyed.map((k) => `${k.table.schema}.${k.table.table}`),
    );
    // The target's tracking and the source's change logs are set up at once (each host's own work).
    // The tracking's table is made even with no keyed table to track: the catch-up reads it.
    const tracking = awaitedLater(runTransaction(ctx.target.client, startTrackingSql(ctx.moveId, keyed)));
    const [tracked, logging] = await Promise.allSettled([
      tracking,
      startDeltas(
        ctx,
        schemas,
        { both: unkeyed, sourceOnly: keyed.map((k) => k.table) },
        methods,
        tracking,
        fromCopy.size > 0,
      ),
    ]);
    if (tracked.status === 'rejected') throw tracked.reason;
    if (logging.status === 'rejected') throw logging.reason;
    const logs = logging.value;
    const logged = logs ? unkeyed : [];
    // Without the source's logs the copy's figures cannot be carried to P: those tables are read whole.
    if (!logs) fromCopy.clear();
    held = await allOrNone(opening, endQuietly);
    opening = null;
    if (keyed.length === 0 && logged.length === 0) {
      await Promise.all(held.map(endQuietly));
      return;
    }
    const started = performance.now();
    const verification = await preVerify(
      { source: held[0]!, target: held[1]! },
      { source: ctx.source.client, target: ctx.target.client },
      keyed,
      methods,
      { moveId: ctx.moveId, tables: logged, keyedOnSource: logs, fromCopy },
    );
    ctx.current.pre = verification;
    const copied =
      fromCopy.size > 0
        ? ` (${plural(fromCopy.size, 'table')} from the copy's chunk checksums and the changes logged since)`
        : '';
    notice(
      ctx,
      `host ${ctx.target.host.name}: ${plural(keyed.length + logged.length, 'table')} of wave ${ctx.wave + 1} checksummed before the fence in ${elapsed(started)} ms${copied}; while fenced only their changed rows are compared`,
    );
  } catch (error) {
    // Verification before the fence is only a head start: on any failure the wave is checksummed while
    // fenced, and tracking left here is removed again before the switch (stopTracking).
    if (opening) held = await allOrNone(opening, endQuietly).catch(() => []);
    await Promise.all(held.map(endQuietly));
    await stopTracking(ctx.target.client, ctx.moveId, schemas).catch(() => undefined);
    await stopLogs(ctx, schemas).catch(() => undefined);
    notice(
      ctx,
      `host ${ctx.target.host.name}: no verification before the fence (${describePgError(error)}); every table of the wave is checksummed while fenced`,
    );
  }
}

/** How long the change-log triggers may take to be created on the source's busy tables, in all. */
const DELTAS_SETUP_LIMIT_MS = 5_000;

/**
 * The change logs of the wave (tail.ts): of `tables.both` (no usable key) on both hosts (the
 * target's once `targetFree`, its tracking, is set up on the target's session; the source's
 * meanwhile), and of `tables.sourceOnly` (the keyed ones, whose target records their changed
 * keys) on the source too, so that each host's figure comes from what it saw itself. The source's
 * CREATE TRIGGERs wait for its writers, table by table (tail.ts startSourceDeltas), each wait no
 * longer than the fence's lock wait, retried up to DELTAS_SETUP_LIMIT_MS; false when that is not
 * enough, the set-up fails otherwise, or either host is older than PostgreSQL 14 (what it created
 * is switched off, best effort, and dropped where free): then the tables without a key are
 * checksummed whole while fenced, and the keyed ones compared by their changed keys on both hosts
 * (which cannot see a change that replication loses after the snapshot: said in the notice).
 */
async function startDeltas(
  ctx: MoveContext,
  schemas: readonly string[],
  tables: { readonly both: readonly ShardTable[]; readonly sourceOnly: readonly ShardTable[] },
  methods: ReadonlyMap<string, HashMethod>,
  targetFree: Promise<unknown>,
  keepEntries: boolean,
): Promise<boolean> {
  const all = [...tables.both, ...tables.sourceOnly];
  if (all.length === 0) return false;
  if (Math.min(ctx.source.serverVersionNum, ctx.target.serverVersionNum) < 140000) return false;
  const lockWaitMs = await lockWaitFor(ctx);
  const logged = (some: readonly ShardTable[]): LoggedTable[] =>
    some.map((table) => ({ table, method: methods.get(`${table.schema}.${table.table}`) ?? 'text' }));
  // The target's logs on its session once the tracking there is set up, the source's meanwhile.
  const [onTarget, onSource] = await Promise.allSettled([
    targetFree.then(async () => {
      if (tables.both.length > 0)
        await runTransaction(
          ctx.target.client,
          startDeltasSql(ctx.moveId, logged(tables.both), lockWaitMs, ctx.wave, keepEntries),
        );
    }),
    startSourceDeltas(
      ctx.source.client,
      ctx.moveId,
      logged(all),
      lockWaitMs,
      DELTAS_SETUP_LIMIT_MS,
      ctx.wave,
      keepEntries,
    ),
  ]);
  if (onTarget.status === 'rejected') throw onTarget.reason;
  if (onSource.status === 'fulfilled') return true;
  await stopLogs(ctx, schemas).catch(() => undefined);
  const [unkeyed, keyed] = [tables.both.length, tables.sourceOnly.length];
  notice(
    ctx,
    `host ${ctx.source.host.name}: no change logs for the wave's tables (${describePgError(onSource.reason)}); ` +
      [
        ...(unkeyed > 0
          ? [
              `${plural(unkeyed, 'table')} without a usable key ${inflect(unkeyed, 'is', 'are')} checksummed whole while fenced`,
            ]
          : []),
        ...(keyed > 0
          ? [
              `${plural(keyed, 'keyed table')} ${inflect(keyed, 'is', 'are')} compared by ${inflect(keyed, 'its', 'their')} changed keys alone, which cannot see a change replication loses after the snapshot`,
            ]
          : []),
      ].join('; '),
  );
  return false;
}

/** The change-log triggers of `schemas` off on both hosts, and this move's entries gone (tail.ts stopDeltas). */
export async function stopLogs(
  ctx: MoveContext,
  schemas: readonly string[],
  { sourceBestEffort = false, drop = true } = {},
): Promise<void> {
  // Best effort on the source when asked: the unfence switches off what is left there.
  const onSource = stopDeltas(ctx.source.client, ctx.moveId, schemas, { drop });
  await Promise.all([
    sourceBestEffort ? onSource.catch(() => undefined) : onSource,
    stopDeltas(ctx.target.client, ctx.moveId, schemas, { drop }),
  ]);
}

/**
 * Ends the wave's pre-verification, if any: its snapshots, and the change-log triggers it set up
 * (on the source they run in application transactions; best effort here, an error path: the
 * verification, the unfence and --abort remove them too).
 */
export async function dropPreVerification(
  ctx: MoveContext,
  { logs = true }: { readonly logs?: boolean } = {},
): Promise<void> {
  const pre = ctx.current.pre;
  ctx.current.pre = null;
  if (!pre) return;
  await endPreVerification(pre);
  // Switched off only: this may run while the wave is fenced (a fence limit reached, a failed
  // step), where a drop per trigger would add round trips; the unfence drops them after.
  if (logs && (pre.logged.size > 0 || pre.keyedOnSource))
    await stopLogs(ctx, schemasOf(ctx, waveShards(ctx)), { drop: false }).catch(() => undefined);
}
