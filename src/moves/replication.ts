import { HostError, resumeOrAbort } from '../errors.js';
import { EARLY_SUBSCRIPTION_LOCK_WAIT_SQL } from './sql/locks.js';
import {
  createPublicationSql,
  createSubscriptionSql,
  enableSubscriptionSql,
  dropPublicationSql,
  insertMarkerSql,
  APPLY_WORKER_ABSENT_SQL,
  APPLY_WORKER_WAITS_SQL,
  DELETE_MARKERS_SQL,
  MARKER_ARRIVED_SQL,
  PUBLICATION_EXISTS_SQL,
  SUBSCRIPTION_ERRORS_SQL,
  SUBSCRIPTION_EXISTS_SQL,
  SUBSCRIPTION_TABLES_SQL,
} from './sql/replication.js';
import { dropSlot, dropSubscription } from './leftovers.js';
import { sleep } from '../clock.js';
import { subscriptionFailover } from './failover-state.js';
import { LagWatch } from './wal-guard.js';
import { runTransaction } from '../pg/quiet.js';
import { publishedTables } from './publication.js';
import { ensureMethods, moveLeafTables } from './checksum-methods.js';
import { type MoveContext, schemasOf, notice, sameMajorVersion } from './context.js';

/**
 * The logical replication of a move: publication, subscription, waiting until every table streams,
 * markers, and removing it all again.
 */

export async function publish(ctx: MoveContext): Promise<void> {
  const exists = await ctx.source.client.query(PUBLICATION_EXISTS_SQL, [ctx.name]);
  if (exists.rowCount) return;
  // The marker table rides along (only this move's rows): see waitForCatchUp.
  const tables = await publishedTables(ctx.source.client, schemasOf(ctx, ctx.shards));
  await ctx.source.client.query(createPublicationSql(ctx.name, tables, ctx.moveId));
}

/**
 * The move's subscription on the target, streaming from the slot the copy read. Online, the copy
 * usually creates it disabled while its last shards are copied (subscribeEarly); this step then
 * only enables it.
 */
export async function subscribe(ctx: MoveContext): Promise<void> {
  const exists = await ctx.target.client.query<{ enabled: boolean }>(SUBSCRIPTION_EXISTS_SQL, [ctx.name]);
  if (exists.rowCount) {
    if (!exists.rows[0]!.enabled) await ctx.target.client.query(enableSubscriptionSql(ctx.name));
    return;
  }
  await ctx.target.client.query(
    createSubscriptionSql(
      ctx.name,
      ctx.source.host.replicationUrl,
      await binaryOk(ctx),
      true,
      subscriptionFailover(ctx),
    ),
  );
}

/**
 * The subscription created disabled once every target table and the publication exist, while the
 * last shards are still being copied (createAndCopy), so that the `subscribed` step only enables it.
 * CREATE SUBSCRIPTION locks each table it lists in turn, and a copy's transaction holds stronger
 * locks (its TRUNCATE, a large table's dropped indexes) while it takes the next: each could wait
 * for the other. So no lock is waited for longer than 50 ms (nor half the deadlock timeout): it is
 * the subscription that gives up, not the copy, and on any failure the `subscribed` step creates it.
 */
export async function subscribeEarly(ctx: MoveContext): Promise<void> {
  try {
    const exists = await ctx.target.client.query(SUBSCRIPTION_EXISTS_SQL, [ctx.name]);
    if (exists.rowCount) return;
    const create = createSubscriptionSql(
      ctx.name,
      ctx.source.host.replicationUrl,
      await binaryOk(ctx),
      false,
      subscriptionFailover(ctx),
    );
    await runTransaction(ctx.target.client, `BEGIN;\n${EARLY_SUBSCRIPTION_LOCK_WAIT_SQL}\n${create};\nCOMMIT;`);
  } catch {
    // Left to the subscribed step, which creates it and reports what fails.
  }
}

/** Binary replication carries type OIDs in arrays and records, and reg* values as raw OIDs. */
async function binaryOk(ctx: MoveContext): Promise<boolean> {
  return sameMajorVersion(ctx) && (await moveLeafTables(ctx)).every((t) => t.portable);
}

/** Every table streaming; then one marker round trip, so the cut-over starts nearly caught up. */
export async function waitForSync(ctx: MoveContext): Promise<void> {
  const errors = async (): Promise<number> => {
    const r = await ctx.target.client.query<{ n: string }>(SUBSCRIPTION_ERRORS_SQL, [ctx.name]);
    return Number(r.rows[0]?.n ?? 0);
  };
  const baseline = await errors();
  const limit = ctx.settings.waitTimeoutMs;
  const started = performance.now();
  let told = started;
  for (;;) {
    // The subscription retries a failed apply for ever; three failures in a row stop the move instead.
    const failures = (await errors()) - baseline;
    if (failures >= 3) {
      throw new HostError(
        ctx.target.host.name,
        `applying the replicated changes failed ${failures} times (the reason is in that host's server log); ` +
          `fix it and resume the move, or abort it to undo the move`,
        { shard: ctx.shards[0]!, code: 'SYNC_FAILED', next: resumeOrAbort(ctx.shards) },
      );
    }
    const r = await ctx.target.client.query<{ total: string; pending: string }>(SUBSCRIPTION_TABLES_SQL, [ctx.name]);
    const { total, pending } = r.rows[0]!;
    if (Number(total) > 0 && Number(pending) === 0) break;
    if (performance.now() - started > limit) {
      throw new HostError(
        ctx.target.host.name,
        `${pending} of ${total} tables are still not streaming after ${Math.round(limit / 1000)} s; nothing is fenced. Resume the move to wait again, or abort it`,
        {
          shard: ctx.shards[0]!,
          code: 'SYNC_TIMEOUT',
          next: resumeOrAbort(ctx.shards),
        },
      );
    }
    if (performance.now() - told > 5000) {
      told = performance.now();
      notice(
        ctx,
        `host ${ctx.target.host.name}: waiting for the subscription: ${pending} of ${total} tables not streaming yet`,
      );
    }
    await sleep(50);
  }
  await ctx.source.client.query(insertMarkerSql(ctx.moveId, 'synced'));
  await waitForMarker(ctx, 'synced', limit, true);
  // Checksum methods are chosen now, while nothing is fenced.
  await ensureMethods(ctx);
}

export async function waitForMarker(ctx: MoveContext, kind: string, timeoutMs: number, tell = false): Promise<void> {
  const started = performance.now();
  let told = started;
  let looked = started;
  const lags = tell ? new LagWatch(ctx) : null;
  let lag = 'unknown';
  for (;;) {
    const r = await ctx.target.client.query(MARKER_ARRIVED_SQL, [ctx.moveId, kind]);
    if (r.rowCount) return;
    if (performance.now() - started > timeoutMs)
      throw new Error(`marker ${kind} not replicated within ${timeoutMs} ms`);
    // The lag (and its trend) every second once the marker is late: progress events, and the notice below.
    if (lags && performance.now() - looked > 1000) {
      looked = performance.now();
      lag = await lags.look();
    }
    if (tell && performance.now() - told > 5000) {
      told = performance.now();
      // The lag and what the apply worker waits for only add to a progress notice.
      const apply = await applyWorkerWaits(ctx).catch(() => '');
      notice(
        ctx,
        `host ${ctx.target.host.name}: catching up with ${ctx.source.host.name} (${lag} of WAL behind, ${Math.round((performance.now() - started) / 1000)} s${apply ? `; ${apply}` : ''})`,
      );
    }
    // A marker usually arrives within milliseconds: looked for closely at first, then less often.
    await sleep(performance.now() - started < 200 ? 2 : 10);
  }
}

/** What the move's apply worker on the target waits for: the lock and who holds it, if any. */
export async function applyWorkerWaits(ctx: MoveContext): Promise<string> {
  const r = await ctx.target.client.query<{ wait: string | null; blockers: string | null }>(APPLY_WORKER_WAITS_SQL, [
    ctx.name,
  ]);
  const row = r.rows[0];
  if (!row) return `its apply worker is not running${await whyNoApplyWorker(ctx)}`;
  if (!row.wait) return 'its apply worker is busy';
  return `its apply worker waits for ${row.wait}${row.blockers ? `, held by ${row.blockers}` : ''}`;
}

/** Why the move's subscription has no apply worker: ': …' when the target tells, else ''. */
async function whyNoApplyWorker(ctx: MoveContext): Promise<string> {
  const r = await ctx.target.client.query<{
    enabled: boolean | null;
    failures: string;
    workers: number;
    slots: number;
  }>(APPLY_WORKER_ABSENT_SQL, [ctx.name]);
  const row = r.rows[0];
  if (!row || row.enabled === null) return ': its subscription is gone';
  if (!row.enabled) return ': its subscription is disabled';
  const why: string[] = [];
  if (row.workers >= row.slots)
    why.push(
      `all ${row.slots} logical replication worker slots of the host are taken (max_logical_replication_workers), so it waits for one`,
    );
  const failures = Number(row.failures);
  if (failures > 0)
    why.push(
      `applying the replicated changes failed ${failures} time${failures === 1 ? '' : 's'} (the reasons are in the host's server log)`,
    );
  return why.length > 0 ? `: ${why.join('; ')}` : '';
}

/** The move's markers on both hosts: at clean-up, and last when a move is undone. */
export async function deleteMarkers(ctx: MoveContext): Promise<void> {
  await Promise.all([ctx.source, ctx.target].map((side) => side.client.query(DELETE_MARKERS_SQL, [ctx.moveId])));
}

/** The publication, subscription and slot: at clean-up, and first when a move is undone (see move.ts). */
export async function dropReplication(ctx: MoveContext): Promise<void> {
  await dropSubscription(ctx.target.client, ctx.name);
  await dropPublicationAndSlot(ctx);
}

/** The source's half of dropReplication, once the subscription is gone (the clean-up drops that meanwhile). */
export async function dropPublicationAndSlot(ctx: MoveContext): Promise<void> {
  await ctx.source.client.query(dropPublicationSql(ctx.name));
  await dropMoveSlot(ctx);
}

/** Drops the move's slot on the source if it exists; a slot still held by a dying walsender is waited for. */
export async function dropMoveSlot(ctx: MoveContext): Promise<void> {
  const { source, name } = ctx;
  if (await dropSlot(source.client, name)) return;
  throw new HostError(
    source.host.name,
    `replication slot ${name} could not be dropped; drop it with pg_drop_replication_slot`,
    {
      shard: ctx.shards[0]!,
      code: 'SLOT_LEFT',
    },
  );
}
