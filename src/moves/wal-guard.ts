import { HostError, resumeOrAbort } from '../errors.js';
import { bytesPhrase } from '../text.js';
import type { MoveContext } from './context.js';

/**
 * The WAL a move's slot holds on the source: the copy pauses while it passes the move's bound
 * (MoveOptions.maxSlotWal), and a slot the server invalidated (max_slot_wal_keep_size) stops the
 * move at once with the way on, instead of a subscription that fails later for ever.
 */

/** The slot's WAL status, and the WAL it holds (from its restart_lsn to the server's current position). */
export const SLOT_WAL_SQL = `SELECT wal_status, pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint::text AS retained
       FROM pg_replication_slots WHERE slot_name = $1`;

/**
 * The guard the copy calls every second (CopyMeter's check). Throws SLOT_LOST when the server
 * invalidated the slot, and SLOT_WAL_BOUND once the slot holds more WAL than the move's bound
 * (MoveOptions.maxSlotWal). While the copy runs nothing consumes the slot (the subscription starts
 * after it), so its WAL only grows with the source's writes, and pausing the copy would not shrink
 * it (the copy writes no WAL on the source): the copy stops instead, and copyFromSnapshot drops the
 * slot so that the source's next checkpoint can remove that WAL. --resume copies again from a new slot.
 */
export async function slotWalCheck(ctx: MoveContext): Promise<void> {
  const r = await ctx.source.client.query<{ wal_status: string | null; retained: string | null }>(SLOT_WAL_SQL, [
    ctx.name,
  ]);
  const row = r.rows[0];
  if (!row) return;
  requireSlotKept(ctx, row.wal_status);
  const bound = ctx.options.maxSlotWal;
  const retained = Number(row.retained ?? 0);
  if (bound === undefined || retained <= bound) return;
  throw new HostError(
    ctx.source.host.name,
    `replication slot ${ctx.name} holds ${bytesPhrase(retained)} of WAL, more than the bound of ${bytesPhrase(bound)}: ` +
      `the copy stopped and the slot was dropped, so the source can remove that WAL at its next checkpoint; ` +
      `nothing is fenced. Resume the move when the source writes less (or with a larger bound, or a faster copy), or abort it`,
    { shard: ctx.shards[0]!, code: SLOT_WAL_BOUND, next: resumeOrAbort(ctx.shards) },
  );
}

/** The code of the guard's stop. */
export const SLOT_WAL_BOUND = 'SLOT_WAL_BOUND';

/** SLOT_LOST at once for a slot whose WAL the server removed. */
export function requireSlotKept(ctx: MoveContext, walStatus: string | null): void {
  if (walStatus !== 'lost') return;
  throw new HostError(
    ctx.source.host.name,
    `replication slot ${ctx.name} was invalidated: the server removed WAL it still needed (max_slot_wal_keep_size). ` +
      `The changes since the copy's snapshot are gone: abort the move and start it again, with a larger ` +
      `max_slot_wal_keep_size or a bound on the slot's WAL that pauses the copy below it`,
    { shard: ctx.shards[0]!, code: 'SLOT_LOST', next: [{ action: 'abort', shards: ctx.shards }] },
  );
}

/** The lag of the move's slot: WAL bytes from what the target confirmed to the source's position. */
export const SLOT_LAG_BYTES_SQL = `SELECT wal_status, pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint::text AS lag
       FROM pg_replication_slots WHERE slot_name = $1`;

/**
 * The catch-up's lag, looked at now and then while the target catches up: reported as an event
 * (MoveOptions.onProgress) with its trend since the previous look, and in words for the notices.
 * A slot the server invalidated stops the move at once (requireSlotKept).
 */
export class LagWatch {
  readonly #ctx: MoveContext;
  readonly #started = performance.now();
  #previous: { at: number; lag: number } | null = null;

  constructor(ctx: MoveContext) {
    this.#ctx = ctx;
  }

  /** The lag in words ('unknown' when it cannot be read), after reporting it. */
  async look(): Promise<string> {
    const ctx = this.#ctx;
    const r = await ctx.source.client
      .query<{ wal_status: string | null; lag: string | null }>(SLOT_LAG_BYTES_SQL, [ctx.name])
      .catch(() => null);
    const row = r?.rows[0];
    if (!row) return 'unknown';
    requireSlotKept(ctx, row.wal_status);
    if (row.lag === null) return 'unknown';
    const lag = Number(row.lag);
    const now = performance.now();
    const trend = this.#previous ? ((lag - this.#previous.lag) / (now - this.#previous.at)) * 1000 : null;
    this.#previous = { at: now, lag };
    ctx.options.onProgress?.({
      kind: 'catch-up',
      moveId: ctx.moveId,
      source: ctx.source.host.name,
      target: ctx.target.host.name,
      lagBytes: lag,
      lagBytesPerSecond: trend === null ? null : Math.round(trend),
      elapsedMs: Math.round(now - this.#started),
    });
    const direction =
      trend === null
        ? ''
        : trend < 0
          ? `, shrinking ${bytesPhrase(-trend)}/s`
          : trend > 0
            ? `, growing ${bytesPhrase(trend)}/s`
            : ', steady';
    return `${bytesPhrase(lag)}${direction}`;
  }
}
