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
  SUBSCRIPTION_EXISTS_SQL,
  SUBSCRIPTION_HEALTH_SQL,
  SLOT_CONFIRMED_SQL,
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

/**
 * A subscription retries a failed apply (or table sync) for ever, each time the launcher starts its
 * worker again. Some failures pass by themselves (a deadlock with the application, a lock timeout:
 * the next try gets further); others never do (a row the target holds already, a column it lacks:
 * each try fails on the same transaction). So a wait stops only when the changes failed to apply
 * this many times and the target applied nothing for APPLY_STUCK_MS meanwhile.
 */
const APPLY_FAILURES_TOLERATED = 3;
/** How long nothing applied counts as stuck: at most this, and a quarter of the wait's own limit. */
const APPLY_STUCK_MS = 30_000;

/**
 * Watches the move's subscription while a wait before the fence runs: fails the wait, naming the
 * target and the shard, once nothing can arrive (the subscription is gone), or once its changes
 * failed to apply APPLY_FAILURES_TOLERATED times with nothing applied for the stuck time (the
 * target's position, as the source's slot confirms it, unchanged since before those failures).
 */
class SubscriptionWatch {
  /** Failures counted from here: the count when the target last got further. */
  private baseline: number;
  private confirmed: string | null;
  private progressAt = performance.now();
  private readonly stuckMs: number;

  private constructor(
    private readonly ctx: MoveContext,
    start: { failures: number; confirmed: string | null },
  ) {
    this.baseline = start.failures;
    this.confirmed = start.confirmed;
    this.stuckMs = Math.min(APPLY_STUCK_MS, ctx.settings.waitTimeoutMs / 4);
  }

  static async start(ctx: MoveContext): Promise<SubscriptionWatch> {
    return new SubscriptionWatch(ctx, await SubscriptionWatch.read(ctx));
  }

  private static async read(
    ctx: MoveContext,
  ): Promise<{ exists: boolean; failures: number; confirmed: string | null }> {
    const [health, slot] = await Promise.all([
      ctx.target.client.query<{ enabled: boolean | null; failures: string }>(SUBSCRIPTION_HEALTH_SQL, [ctx.name]),
      ctx.source.client.query<{ lsn: string | null }>(SLOT_CONFIRMED_SQL, [ctx.name]),
    ]);
    const row = health.rows[0];
    return {
      exists: row?.enabled !== null && row?.enabled !== undefined,
      failures: Number(row?.failures ?? 0),
      confirmed: slot.rows[0]?.lsn ?? null,
    };
  }

  /** Throws when the wait cannot end well; `waiting` says for what, in the message. */
  async check(waiting: string): Promise<void> {
    const { ctx } = this;
    const { exists, failures, confirmed } = await SubscriptionWatch.read(ctx);
    if (!exists)
      throw new HostError(
        ctx.target.host.name,
        `the move's subscription ${ctx.name} is gone (dropped by someone else?) while waiting for ${waiting}; nothing is fenced. Abort the move to undo it, then move the shard again`,
        { shard: ctx.shards[0]!, code: 'SUBSCRIPTION_GONE', next: [{ action: 'abort', shards: ctx.shards }] },
      );
    const now = performance.now();
    if (confirmed !== this.confirmed) {
      // The target got further: the failures before were not for good.
      this.confirmed = confirmed;
      this.progressAt = now;
      this.baseline = failures;
      return;
    }
    const failed = failures - this.baseline;
    const stuck = now - this.progressAt;
    if (failed >= APPLY_FAILURES_TOLERATED && stuck >= this.stuckMs)
      throw new HostError(
        ctx.target.host.name,
        `applying the replicated changes failed ${failed} times while waiting for ${waiting}, and nothing was applied for ${Math.round(stuck / 1000)} s (the reason is in that host's server log, in the errors of subscription "${ctx.name}": a row the target holds already, a column or table the source has and the target lacks, a right the subscription's owner lacks; an error the source met while sending is in ${ctx.source.host.name}'s log too); nothing is fenced. Fix it and resume the move, or abort it to undo the move`,
        { shard: ctx.shards[0]!, code: 'SYNC_FAILED', next: resumeOrAbort(ctx.shards) },
      );
  }
}

/** Every table streaming; then one marker round trip, so the cut-over starts nearly caught up. */
export async function waitForSync(ctx: MoveContext): Promise<void> {
  const watch = await SubscriptionWatch.start(ctx);
  const limit = ctx.settings.waitTimeoutMs;
  const started = performance.now();
  let told = started;
  let looked = started;
  for (;;) {
    // Every second, as the marker's wait does (the watch reads both hosts): not on the first pass,
    // which usually finds every table streaming already.
    if (performance.now() - looked > 1000) {
      looked = performance.now();
      await watch.check('its tables to stream');
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
  await waitForMarker(ctx, 'synced', limit);
  // Checksum methods are chosen now, while nothing is fenced.
  await ensureMethods(ctx);
}

/**
 * Waits, before the fence, until marker `kind` (inserted on the source) has arrived on the target:
 * the catch-up of everything committed before it. Tells its progress every 5 s, and stops (nothing
 * fenced, the move resumable) when the subscription cannot deliver it (SubscriptionWatch) or after
 * timeoutMs.
 */
export async function waitForMarker(ctx: MoveContext, kind: string, timeoutMs: number): Promise<void> {
  const started = performance.now();
  let told = started;
  let looked = started;
  const lags = new LagWatch(ctx);
  const watch = await SubscriptionWatch.start(ctx);
  let lag = 'unknown';
  for (;;) {
    const r = await ctx.target.client.query(MARKER_ARRIVED_SQL, [ctx.moveId, kind]);
    if (r.rowCount) return;
    const waited = Math.round((performance.now() - started) / 1000);
    if (performance.now() - started > timeoutMs) {
      const apply = await applyWorkerWaits(ctx).catch(() => '');
      throw new HostError(
        ctx.target.host.name,
        `the changes committed on ${ctx.source.host.name} are still not applied after ${waited} s (${lag} of WAL behind${apply ? `; ${apply}` : ''}); nothing is fenced. Resume the move to wait again, or abort it`,
        { shard: ctx.shards[0]!, code: 'CATCH_UP_TIMEOUT', next: resumeOrAbort(ctx.shards) },
      );
    }
    // Every second once the marker is late: the lag (and its trend: progress events, the notice
    // below) and whether the subscription can still deliver it.
    if (performance.now() - looked > 1000) {
      looked = performance.now();
      lag = await lags.look();
      await watch.check(`the changes committed on ${ctx.source.host.name} to be applied`);
    }
    if (performance.now() - told > 5000) {
      told = performance.now();
      // The lag and what the apply worker waits for only add to a progress notice.
      const apply = await applyWorkerWaits(ctx).catch(() => '');
      notice(
        ctx,
        `host ${ctx.target.host.name}: catching up with ${ctx.source.host.name} (${lag} of WAL behind, ${waited} s${apply ? `; ${apply}` : ''})`,
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
