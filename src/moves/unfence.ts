import { shardSchemaName } from '../config/types.js';
import { HostError } from '../errors.js';
import { CONTROL_SCHEMA } from '../fleet/control.js';
import { dropFenceTriggerSql, unfenceSql, fenceGuardSql } from './sql/fence.js';
import { FENCE_TRIGGER, replicationName } from './sql/names.js';
import { retryLockWaits, runTransaction } from '../pg/quiet.js';
import { shardTriggers } from './catalog.js';
import { dropLogTriggers, stopDeltas } from './tail.js';
import { type MoveContext, schemasOf } from './context.js';
import { lockWaitFor, FENCE_WAIT_CODES, lockHolders } from './fence-locks.js';
import { stopLogs } from './pre-verification.js';

/**
 * The wave's shards writable again (the fence's undo), each in a short transaction with bounded
 * lock waits.
 */

/** How long the unfence keeps retrying while application transactions hold the fenced tables. */
export const UNFENCE_LIMIT_MS = 5_000;

/**
 * The wave's shards writable again, each in its own short transaction whose lock waits are
 * bounded (unfenceSql) and retried: a TRUNCATE queued on a fenced table behind a long application
 * transaction must not hold the unfence without limit. Past `limitMs` it gives up, naming the holders.
 */
export async function unfence(ctx: MoveContext, shards: readonly number[], limitMs = UNFENCE_LIMIT_MS): Promise<void> {
  const schemas = schemasOf(ctx, shards);
  // A change log still on (a killed run's, or one whose removal failed): off before the shards take
  // writes again, by replacing its function, with no table lock (stopDeltas); its triggers go below.
  const [triggers, logged] = await Promise.all([
    shardTriggers(ctx.source.client, schemas, [FENCE_TRIGGER]),
    stopDeltas(ctx.source.client, ctx.moveId, schemas, { drop: false }),
  ]);
  // Triggers that call the move's guard refuse writes while it is closed for their wave: the guard
  // opened again for this wave (the waves before it switched, their old copies stay fenced) lets
  // them through, with no table lock to wait for. Only the others are disabled below.
  const guard = replicationName(ctx.moveId);
  const guarded = (t: { readonly calls: readonly [string, string] }): boolean =>
    t.calls[0] === CONTROL_SCHEMA && t.calls[1] === guard;
  if (triggers.some((t) => t.enabled && guarded(t)))
    await runTransaction(ctx.source.client, fenceGuardSql(ctx.moveId, ctx.wave - 1));
  const lockWaitMs = await lockWaitFor(ctx);
  const started = performance.now();
  // Every shard is tried, a busy one does not keep the others fenced; the first failure is thrown after.
  let failure: unknown = null;
  for (const shard of shards) {
    const schema = shardSchemaName(ctx.config, shard);
    const own = triggers
      .filter((t) => t.schema === schema && t.enabled && !guarded(t))
      .map((t) => [t.schema, t.table] as const);
    try {
      await retryLockWaits(
        () => runTransaction(ctx.source.client, unfenceSql(shard, own, ctx.moveId, lockWaitMs)),
        started + limitMs,
        FENCE_WAIT_CODES,
      );
    } catch (error) {
      const code = (error as { code?: string }).code;
      if (code === undefined || !FENCE_WAIT_CODES.includes(code)) {
        failure ??= error;
        continue;
      }
      // Who holds the locks only adds to the message, which stands without it.
      const holders = await lockHolders(ctx.source.client, schema).catch(() => '');
      failure ??= new HostError(
        ctx.source.host.name,
        `shard ${shard} is still fenced: its tables stayed busy for ${Math.round(limitMs / 1000)} s${holders ? ` (${holders})` : ''}`,
        {
          shard,
          code: 'UNFENCE_TIMEOUT',
          cause: error,
        },
      );
    }
  }
  // eslint-disable-next-line @typescript-eslint/only-throw-error -- the first shard's error, as caught or described
  if (failure !== null) throw failure;
  // Writable already; the triggers go where no application statement has to wait for it. A
  // disabled trigger, or one calling the open guard, refuses nothing: one a busy table keeps is
  // harmless, and the shard's next fence takes it over (prepareFenceSql, fenceSql).
  for (const t of triggers)
    await runTransaction(ctx.source.client, dropFenceTriggerSql(t.schema, t.table)).catch(() => undefined);
  await dropLogTriggers(ctx.source.client, logged);
}

/**
 * The fence's undo (abortMove): the change logs off, then every shard of the batch writable again.
 * The logs are switched off while the sources are still fenced, if they are (and the unfence
 * switches off what is left on the source).
 */
export async function undoFence(ctx: MoveContext): Promise<void> {
  // Switched off only (the unfence drops the source's triggers after, the target's go with its copies).
  await stopLogs(ctx, schemasOf(ctx, ctx.shards), { sourceBestEffort: true, drop: false });
  await unfence(ctx, ctx.shards, 30_000);
}
