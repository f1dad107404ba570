import pg from 'pg';
import { LOCK_LIMITS_SQL, LOCK_HOLDERS_SQL } from './sql/locks.js';
import { LOCK_WAIT_CODES } from '../pg/quiet.js';
import { type MoveContext } from './context.js';

/**
 * What bounds the fence's and the unfence's locks (the source's deadlock timeout and lock table
 * size, read once per wave), and who holds a busy table's locks, for the messages.
 */

/** How long a lock of the fence or the unfence may wait: half the deadlock timeout, 20 to 500 ms (see fenceSql). */
export async function lockWaitFor(ctx: MoveContext): Promise<number> {
  return (await lockLimits(ctx)).lockWaitMs;
}

/**
 * The source's settings that bound the fence's locks, read once per wave (the fence, the change
 * logs' set-up and the unfence use them): the lock wait (lockWaitFor) and the tables one fence
 * transaction may lock (fenceGroupTables).
 */
export async function lockLimits(
  ctx: MoveContext,
): Promise<{ readonly lockWaitMs: number; readonly groupTables: number }> {
  if (ctx.current.lockLimits) return ctx.current.lockLimits;
  const row = (await ctx.source.client.query<{ half_deadlock_ms: number; max_locks: number }>(LOCK_LIMITS_SQL)).rows[0];
  ctx.current.lockLimits = {
    lockWaitMs: Math.max(20, Math.min(500, row?.half_deadlock_ms ?? 500)),
    groupTables: Math.max(1, Math.floor((row?.max_locks ?? 64) / 2)),
  };
  return ctx.current.lockLimits;
}

/** A fence's or unfence's bounded lock wait that ran out: lock_timeout, its statement bound, a deadlock it lost. */
export const FENCE_WAIT_CODES: readonly string[] = [...LOCK_WAIT_CODES, '57014'];

/** Who holds locks on the tables or sequences of these schemas: pid, application, transaction age and query. */
export async function lockHolders(client: pg.Client, schema: string | readonly string[]): Promise<string> {
  const result = await client.query<{
    pid: number;
    application_name: string;
    age: number | null;
    relname: string;
    query: string;
  }>(LOCK_HOLDERS_SQL, [typeof schema === 'string' ? [schema] : schema]);
  return result.rows
    .map(
      (r) =>
        `${r.relname} held by pid ${r.pid} (${r.application_name || 'no application name'}, transaction open ${r.age ?? 0} s: ${JSON.stringify(r.query)})`,
    )
    .join('; ');
}
