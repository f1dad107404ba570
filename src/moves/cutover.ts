import pg from 'pg';
import { rewriteShardOwner } from '../config/rewrite.js';
import { switchPlacementSql } from '../fleet/placement.js';
import { shardSchemaName } from '../config/types.js';
import { formatShardList, shardsPhrase } from '../config/ranges.js';
import { HostError, resumeOrAbort } from '../errors.js';
import { describePgError } from '../fleet/connect.js';
import { openWorker } from '../fleet/session.js';
import { CLEANUP_CHUNK, CLEANUP_WORKER } from './workers.js';
import { answersWithin, cutOff, HOST_SILENT, waitState } from '../fleet/silence.js';
import { CONTROL_SCHEMA } from '../fleet/control.js';
import {
  DELTA_TRIGGERS,
  FENCE_TRIGGER,
  TRACK_TRIGGERS,
  startDeltasSql,
  type LoggedTable,
  startTrackingSql,
  dropFenceTriggerSql,
  fenceGroups,
  fenceMarkerSql,
  fenceSql,
  fenceWaveSql,
  recordFencedSql,
  prepareFenceSql,
  insertMarkerSql,
  type FenceInput,
  readSequencesSql,
  READ_SEQUENCE_DATA_SQL,
  setSequencesSql,
  unfenceSql,
  type SequenceValue,
  ACTIVE_SHARDS_SQL,
  LOCK_LIMITS_SQL,
  FENCED_SHARDS_SQL,
  LOCK_HOLDERS_SQL,
  statementTimeoutSql,
  RESET_STATEMENT_TIMEOUT_SQL,
  fenceGuardSql,
  replicationName,
  PLACEMENT_VERSION_FIELD,
  lockTimeoutSql,
  catchUpSql,
} from './sql.js';
import { recordStep, stepsFor, type MoveStep } from './state.js';
import { endQuietly, LOCK_WAIT_CODES, retryLockWaits, rollbackQuietly, runTransaction } from '../pg/quiet.js';
import {
  keyedTables,
  leavesNow,
  shardLeaves,
  shardTables,
  shardTriggers,
  type LeafTable,
  type ShardTable,
  SHARD_SEQUENCES_SQL,
} from './catalog.js';
import { endPreVerification, preVerify, verifyShards, type HashMethod, type VerifyResult } from './verify.js';
import {
  changesOf,
  dropLogTriggers,
  readChanges,
  startSourceDeltas,
  stopDeltas,
  stopTracking,
  type ChangesRow,
} from './tail.js';
import { elapsed, sleep } from '../clock.js';
import { allOrNone, awaitedLater } from '../promises.js';
import { ensureMethods, leafTablesOf } from './checksum-methods.js';
import {
  DEFAULT_MAX_FENCED_MS,
  type MoveContext,
  type SequenceState,
  type ShardSequence,
  schemasOf,
  waveShards,
  notice,
} from './context.js';
import { quoteIdent } from '../pg/quote.js';
import { progress } from './progress.js';
import { applyWorkerWaits, waitForMarker } from './replication.js';
import { inflect, plural } from '../text.js';

/**
 * The cut-over of a wave: verification begun before the fence (tail.ts), the fence, catch-up,
 * sequences, verification, the switch of the map; and the fence's undo.
 */

/**
 * The fence of the current wave, after what can be done while it is writable (whileWritable): its
 * shards fenced in a few short transactions of a bounded number of tables each (fenceGroups,
 * fenceSql), sent with the wave's marker as one string (fenceWaveOnce); a group that meets a busy
 * table is fenced again shard by shard, each retried while application transactions hold its
 * tables, and reported; then the wave's marker. Until the first shard is fenced nothing refuses
 * writes, and the fence retries for fenceTimeoutMs; from then on the wave's fence limit
 * (maxFencedMs) runs, and past it the wave is unfenced and the move stops, resumable (stopCutOver).
 */
export async function fence(ctx: MoveContext): Promise<void> {
  const { source } = ctx;
  // The clean-up's second session connects while the last wave is cut over (move.ts, cleanUp).
  if (ctx.wave === ctx.waves.length - 1 && ctx.shards.length > CLEANUP_CHUNK)
    ctx.spares?.open(source.host, CLEANUP_WORKER, 1);
  const shards = waveShards(ctx);
  const schemas = schemasOf(ctx, shards);
  const tables = await shardTables(source.client, schemas, 'all');
  const lockWaitMs = await lockWaitFor(ctx);
  const limit = ctx.options.fenceTimeoutMs ?? 30_000;
  const fenced = new Set(
    (await source.client.query<{ shard: number }>(FENCED_SHARDS_SQL, [shards])).rows.map((r) => r.shard),
  );
  const shardOf = new Map(shards.map((shard) => [shardSchemaName(ctx.config, shard), shard]));
  const tablesOf = new Map<number, (readonly [string, string])[]>(shards.map((shard) => [shard, []]));
  for (const t of tables) tablesOf.get(shardOf.get(t.schema)!)?.push([t.schema, t.table]);
  const pending = shards.filter((s) => !fenced.has(s));
  const groups = fenceGroups(pending, (s) => tablesOf.get(s)!.length, await fenceGroupTables(ctx));
  const ofGroup = (group: readonly number[]) => group.map((shard) => ({ shard, tables: tablesOf.get(shard)! }));
  // A killed run's fence already runs: the rest is fenced as before, within a limit of this run's
  // own from now (its start is in the record; a wave found fenced without one refuses writes from
  // now on at the latest). Set before anything else can fail: a start the record kept of a wave
  // that was released since (on one host's record only) is not this wave's.
  if (fenced.size === 0) ctx.fenceStartedAtMs = null;
  else {
    ctx.fenceStartedAtMs ??= Date.now();
    fenceRemainingMs(ctx);
  }
  const prepared =
    fenced.size === 0 ? await whileWritable(ctx, schemas, groups.map(ofGroup), lockWaitMs) : new Set<number>();
  const started = performance.now();
  let attempts = 0;
  let told = started;
  const withTables = (group: readonly number[]) =>
    ofGroup(group).map((s) => ({ ...s, prepared: prepared.has(s.shard) }));
  /** One shard's fence, retried while application transactions hold its tables, within the limits. */
  const fenceAlone = async (shard: number): Promise<void> => {
    const schema = shardSchemaName(ctx.config, shard);
    for (;;) {
      attempts += 1;
      if (await fenceOnce(ctx, withTables([shard]), lockWaitMs)) return;
      if (ctx.fenceStartedAtMs !== null && fenceRemainingMs(ctx) <= 0) {
        // Who holds the locks only adds to the message, which stands without it.
        const holders = await lockHolders(source.client, schema).catch(() => '');
        await stopCutOver(
          ctx,
          `the fence of shard ${shard} (${attempts} attempts): application transactions kept the tables of ${schema} busy${holders ? ` (${holders})` : ''}`,
        );
      }
      const waited = performance.now() - started;
      if (ctx.fenceStartedAtMs === null && waited > limit) {
        // Who holds the locks only adds to the message, which stands without it.
        const holders = await lockHolders(source.client, schema).catch(() => '');
        throw new HostError(
          source.host.name,
          `could not fence within ${Math.round(limit / 1000)} s (${attempts} attempts): application transactions kept the tables of ${schema} busy` +
            `${holders ? ` (${holders})` : ''}. Nothing was fenced; resume the move to retry, or abort it`,
          { shard, code: 'FENCE_TIMEOUT', next: resumeOrAbort(ctx.shards) },
        );
      }
      if (performance.now() - told > 2000) {
        told = performance.now();
        // Who holds the locks only adds to the message, which stands without it.
        notice(
          ctx,
          `host ${source.host.name}, shard ${shard}: fence attempt ${attempts} waits for ${(await lockHolders(source.client, schema).catch(() => '')) || 'busy tables'}`,
        );
      }
      await sleep(10 + Math.random() * 40);
    }
  };
  // The whole wave in one round trip; the group-by-group fence below is for a wave that met a busy
  // table (or that a killed run fenced in part).
  // The group that met the busy table there: the first not fenced, which is not tried whole again.
  let busyGroup: readonly number[] | undefined;
  if (fenced.size === 0 && groups.length > 0) {
    attempts += 1;
    if (await fenceWaveOnce(ctx, groups.map(withTables), lockWaitMs)) return;
    for (const r of (await source.client.query<{ shard: number }>(FENCED_SHARDS_SQL, [shards])).rows)
      fenced.add(r.shard);
    busyGroup = groups.find((group) => !group.every((s) => fenced.has(s)));
  }
  for (const group of groups) {
    if (group.every((s) => fenced.has(s))) continue;
    if (group.length > 1 && group !== busyGroup) {
      attempts += 1;
      if (await fenceOnce(ctx, withTables(group), lockWaitMs)) {
        continue;
      }
    }
    // A group that met a busy table is fenced again one shard at a time, so that one busy shard
    // costs one lock wait more, not one per shard of its group.
    for (const shard of group) await fenceAlone(shard);
  }
  // Here only after a wave that met busy tables (or that a killed run fenced in part).
  if (attempts > groups.length)
    notice(
      ctx,
      `host ${source.host.name}: fenced ${plural(pending.length, 'shard')} in ${attempts} attempts (tables were busy)`,
    );
  if (ctx.fenceStartedAtMs === null) ctx.fenceStartedAtMs = Date.now();
  ctx.fenceMarker = fenceMarkerKind(ctx, Date.now());
  // The step is recorded with the marker on the source, and on the target meanwhile (progress.ts).
  const detail = progress(ctx);
  await underFence(ctx, 'the fence marker on the source', () =>
    Promise.all([
      source.client.query(fenceMarkerSql(ctx.moveId, ctx.fenceMarker!, detail)),
      recordStep(ctx.target.client, ctx.moveId, 'fenced', 'running', detail),
    ]),
  );
}

/**
 * What a wave's cut-over does before its fence, while its shards still take writes, so that the
 * fence has less to do: its tables listed on both hosts (ctx.leaves), its fence triggers created
 * disabled (the shards returned), the target caught up, the verification begun, its sequences
 * listed and read once on both hosts: the target's states are kept (nothing moves the target's
 * copies of them; carrySequences sets them from these), and the source's read has them open for
 * the read that the fence string makes (fenceWaveOnce); its tables opened by both hosts' sessions.
 */
async function whileWritable(
  ctx: MoveContext,
  schemas: readonly string[],
  groups: readonly FenceInput['shards'][],
  lockWaitMs: number,
): Promise<Set<number>> {
  const [onSource, onTarget] = await Promise.all([
    shardLeaves(ctx.source.client, schemas),
    shardLeaves(ctx.target.client, schemas),
  ]);
  ctx.leaves = { wave: ctx.wave, source: onSource, target: onTarget };
  const prepared = await prepareFence(ctx, groups, lockWaitMs);
  await catchUpBeforeFence(ctx);
  if (ctx.pre?.wave !== ctx.wave) await startPreVerification(ctx, schemas);
  const sequences = await listSequences(ctx);
  // Last, after everything that changes the tables' triggers: each host's session also opens the
  // wave's tables once (their sizes), so that the fence's and the verification's reads of their
  // sizes find them open, not opened table by table while writes wait (a fifth of a fence's time).
  // A lock held or queued on one of them (a DDL statement, behind a long transaction) would hold
  // those reads while fenced until the fence limit: the fence waits for it here instead, while
  // the shards take writes, retrying for as long as it would retry its own locks (fenceTimeoutMs),
  // then stops with nothing fenced.
  const read = (side: MoveContext['source'], leaves: readonly LeafTable[]) =>
    readIfFree(side.client, lockWaitMs, async () => {
      const states = sequences.length > 0 ? await readSequences(side, sequences) : null;
      await leavesNow(side.client, leaves);
      return states;
    });
  const limit = ctx.options.fenceTimeoutMs ?? 30_000;
  const started = performance.now();
  let told = false;
  for (;;) {
    const settled = await Promise.allSettled([read(ctx.source, onSource), read(ctx.target, onTarget)]);
    for (const r of settled) if (r.status === 'rejected') throw r.reason;
    const [source, target] = settled.map(
      (r) => (r as PromiseFulfilledResult<{ value: SequenceState[] | null } | null>).value,
    );
    if (source && target) {
      if (target.value) ctx.sequences = { wave: ctx.wave, list: sequences, target: target.value };
      return prepared;
    }
    const busy = source ? ctx.target : ctx.source;
    const waited = performance.now() - started;
    if (waited > limit || !told) {
      // Who holds the locks only adds to the message, which stands without it.
      const holders = (await lockHolders(busy.client, schemas).catch(() => '')) || 'a lock held or queued';
      const shards = formatShardList(waveShards(ctx));
      if (waited > limit)
        throw new HostError(
          busy.host.name,
          `could not read the tables and sequences of ${shards} within ${Math.round(limit / 1000)} s before their fence (${holders}). Nothing was fenced; resume the move to retry, or abort it`,
          { shard: waveShards(ctx)[0]!, code: 'FENCE_TIMEOUT', next: resumeOrAbort(ctx.shards) },
        );
      told = true;
      notice(ctx, `host ${busy.host.name}: the fence of ${shards} waits for ${holders} on their tables or sequences`);
    }
    await sleep(10 + Math.random() * 40);
  }
}

/**
 * A read made while the wave still takes writes, in a transaction whose lock waits give up after
 * `lockWaitMs` (a DDL statement holding or queued on a table or sequence, behind a long
 * transaction): null then, else `{ value }`.
 */
async function readIfFree<T>(
  client: pg.Client,
  lockWaitMs: number,
  read: () => Promise<T>,
): Promise<{ value: T } | null> {
  try {
    await client.query(`BEGIN;\n${lockTimeoutSql(lockWaitMs)}`);
    const value = await read();
    await client.query('COMMIT');
    return { value };
  } catch (error) {
    await rollbackQuietly(client);
    const code = (error as { code?: string }).code;
    if (code !== undefined && LOCK_WAIT_CODES.includes(code)) return null;
    throw error;
  }
}

/**
 * The fence triggers of the wave created while its shards are still writable, calling the move's
 * guard, open for this wave (prepareFenceSql), one transaction per fence group: for the shards
 * returned, the fence closes the guard instead of changing a trigger per table while writes wait.
 * Each attempt's lock wait is bounded like the fence's. A group that meets a busy table (a writer
 * whose transaction spans the shard's tables and takes them in another order, a TRUNCATE) is
 * prepared again shard by shard, a few tables per transaction, retried for PREPARE_RETRY_MS in
 * all: nothing is fenced yet, so this costs no write its refusal, where each shard left to the
 * fence keeps the wave's other shards refusing writes while its triggers wait for their tables.
 * The shards still busy then are fenced as before (their triggers created by the fence itself,
 * which retries). Before PostgreSQL 14 (no CREATE OR REPLACE TRIGGER), none.
 */
async function prepareFence(
  ctx: MoveContext,
  groups: readonly FenceInput['shards'][],
  lockWaitMs: number,
): Promise<Set<number>> {
  const prepared = new Set<number>();
  if (ctx.source.serverVersionNum < 140000) return prepared;
  let attempts = 0;
  const attempt = async (shards: FenceInput['shards'], waitMs: number): Promise<boolean> => {
    attempts += 1;
    const sql = prepareFenceSql({
      shards,
      targetHost: ctx.target.host.name,
      lockWaitMs: waitMs,
      moveId: ctx.moveId,
      wave: ctx.wave,
    });
    try {
      await runTransaction(ctx.source.client, sql);
    } catch (error) {
      const code = (error as { code?: string }).code;
      if (code === undefined || !FENCE_WAIT_CODES.includes(code)) throw error;
      return false;
    }
    for (const { shard } of shards) prepared.add(shard);
    return true;
  };
  let busy: FenceInput['shards'][number][] = [];
  for (const group of groups) if (!(await attempt(group, lockWaitMs))) busy.push(...group);
  const retried = busy.length;
  const deadline = performance.now() + PREPARE_RETRY_MS;
  while (busy.length > 0) {
    const still: FenceInput['shards'][number][] = [];
    for (const shard of busy) {
      const left = deadline - performance.now();
      if (left < PREPARE_LEAST_WAIT_MS || !(await attempt([shard], Math.min(lockWaitMs, PREPARE_RETRY_WAIT_MS, left))))
        still.push(shard);
    }
    busy = still;
    if (busy.length === 0 || deadline - performance.now() < PREPARE_LEAST_WAIT_MS) break;
    await sleep(10 + Math.random() * 40);
  }
  if (busy.length > 0)
    notice(
      ctx,
      `host ${ctx.source.host.name}: the fence of ${plural(busy.length, 'shard')} of wave ${ctx.wave + 1} was not prepared (tables were busy); their triggers are created by the fence itself`,
    );
  else if (retried > 0)
    notice(
      ctx,
      `host ${ctx.source.host.name}: the fence of ${plural(retried, 'shard')} of wave ${ctx.wave + 1} was prepared in ${attempts} attempts (tables were busy)`,
    );
  return prepared;
}

/** How long the preparation of a wave's fence retries its busy shards, in all (prepareFence). */
const PREPARE_RETRY_MS = 1_000;
/**
 * The lock waits of those retries: short, because a writer whose transaction takes the shard's
 * tables in another order than the preparation deadlocks with it, and waits for it until this runs out.
 */
const PREPARE_RETRY_WAIT_MS = 50;
/** The shortest lock wait a retry of the preparation is given. */
const PREPARE_LEAST_WAIT_MS = 20;

/**
 * A marker round trip while the source is still writable, so that the catch-up after the fence has
 * only the last moment's changes to apply: a resumed run, a later wave, or a target that fell behind
 * (an apply worker that waited for a lock) may be far behind, and that wait belongs before the fence.
 */
async function catchUpBeforeFence(ctx: MoveContext): Promise<void> {
  if (ctx.mode !== 'online') return;
  const kind = `before-fence-${Date.now().toString(36)}-${ctx.wave}`;
  await ctx.source.client.query(insertMarkerSql(ctx.moveId, kind));
  await waitForMarker(ctx, kind, ctx.options.waitTimeoutMs ?? 300_000, true);
}

/** How long a lock of the fence or the unfence may wait: half the deadlock timeout, 20 to 500 ms (see fenceSql). */
async function lockWaitFor(ctx: MoveContext): Promise<number> {
  return (await lockLimits(ctx)).lockWaitMs;
}

/**
 * The source's settings that bound the fence's locks, read once per wave (the fence, the change
 * logs' set-up and the unfence use them): the lock wait (lockWaitFor) and the tables one fence
 * transaction may lock (fenceGroupTables).
 */
async function lockLimits(ctx: MoveContext): Promise<{ readonly lockWaitMs: number; readonly groupTables: number }> {
  if (ctx.lockLimits?.wave === ctx.wave) return ctx.lockLimits;
  const row = (await ctx.source.client.query<{ half_deadlock_ms: number; max_locks: number }>(LOCK_LIMITS_SQL)).rows[0];
  ctx.lockLimits = {
    wave: ctx.wave,
    lockWaitMs: Math.max(20, Math.min(500, row?.half_deadlock_ms ?? 500)),
    groupTables: Math.max(1, Math.floor((row?.max_locks ?? 64) / 2)),
  };
  return ctx.lockLimits;
}

/** A fence's or unfence's bounded lock wait that ran out: lock_timeout, its statement bound, a deadlock it lost. */
const FENCE_WAIT_CODES: readonly string[] = [...LOCK_WAIT_CODES, '57014'];

/**
 * One fence transaction for these shards (fenceSql). False when a lock wait ran out (the
 * application went on; the caller tries again); the wave's fence limit starts with the first that
 * commits.
 */
async function fenceOnce(ctx: MoveContext, shards: FenceInput['shards'], lockWaitMs: number): Promise<boolean> {
  const first = ctx.fenceStartedAtMs === null;
  const atMs = Date.now();
  const sql = fenceSql({
    shards,
    targetHost: ctx.target.host.name,
    lockWaitMs,
    createOrReplaceTrigger: ctx.source.serverVersionNum >= 140000,
    ...(first ? { fenceStart: { moveId: ctx.moveId, atMs } } : {}),
    // Closing it again is harmless: a fence of a group after the first finds it closed.
    ...(shards.some((s) => s.prepared) ? { closeGuard: { moveId: ctx.moveId, wave: ctx.wave } } : {}),
  });
  try {
    await ctx.source.client.query(sql);
  } catch (error) {
    await rollbackQuietly(ctx.source.client);
    const code = (error as { code?: string }).code;
    // Lock wait over, statement timeout, or (should the server's settings differ) a deadlock this
    // transaction lost: the application went on; try again.
    if (code === undefined || !FENCE_WAIT_CODES.includes(code)) throw error;
    return false;
  }
  if (first) {
    ctx.fenceStartedAtMs = atMs;
    ctx.fenceDeadline = performance.now() + maxFencedMs(ctx);
  }
  return true;
}

/** The marker of one fence attempt of the current wave: its own, so an older one still on its way is not taken for it. */
function fenceMarkerKind(ctx: MoveContext, atMs: number): string {
  return `fenced-${atMs.toString(36)}-${ctx.wave}`;
}

/**
 * The whole wave fenced in one round trip (fenceWaveSql): its groups, the marker with the step,
 * the source session's statement timeout, then what the cut-over reads once the wave is fenced (its
 * sequences' states, the placement version the switch starts from: ctx.fenceReads). The target's
 * statement timeout and step go at the same time, over its own session: a target that says
 * `fenced` while the source does not (its fence failed, or a kill came first) is carried on from
 * the source's step (run.ts, reconcileRecords), and a fence that fenced nothing records the
 * target back. False when a group's lock wait ran out: the groups before it are fenced (the wave's
 * fence limit runs from this attempt), and the caller fences the rest group by group.
 */
async function fenceWaveOnce(
  ctx: MoveContext,
  groups: readonly FenceInput['shards'][],
  lockWaitMs: number,
): Promise<boolean> {
  const { source, target } = ctx;
  const atMs = Date.now();
  const sentAt = performance.now();
  const marker = fenceMarkerKind(ctx, atMs);
  const limit = maxFencedMs(ctx);
  const detail = { ...progress(ctx), fenceMarker: marker, fenceStartedAtMs: atMs };
  // Each group's transaction also reports which of its tables are empty, once fenced (verify).
  const leaves = ctx.leaves?.wave === ctx.wave ? ctx.leaves.source : [];
  const oidOf = new Map(leaves.map((t) => [`${t.schema}.${t.table}`, t.oid]));
  const sequences = ctx.sequences?.wave === ctx.wave ? ctx.sequences.list : [];
  const sql = fenceWaveSql({
    groups: groups.map((shards, i) => ({
      shards,
      targetHost: target.host.name,
      lockWaitMs,
      createOrReplaceTrigger: source.serverVersionNum >= 140000,
      // The first group closes the guard of every prepared shard of the wave; each group's LOCK
      // then waits for the writers that passed it before.
      ...(i === 0 ? { fenceStart: { moveId: ctx.moveId, atMs } } : {}),
      ...(i === 0 && groups.some((g) => g.some((s) => s.prepared))
        ? { closeGuard: { moveId: ctx.moveId, wave: ctx.wave } }
        : {}),
      reportEmpty: shards.flatMap((s) => s.tables.flatMap(([schema, table]) => oidOf.get(`${schema}.${table}`) ?? [])),
    })),
    marker: { moveId: ctx.moveId, kind: marker, detail },
    statementTimeoutMs: limit,
    reads: {
      sequences: sequences.map((q) => [q.schema, q.name] as const),
      sequenceData: source.serverVersionNum >= 180000,
      shards: groups.flatMap((group) => group.map((s) => s.shard)),
    },
  });
  // The target's statement timeout goes with the step's record, sent now: handled below, whatever the source says.
  const recorded = target.client.query(`${statementTimeoutSql(limit)};\n${recordFencedSql(ctx.moveId, detail)}`);
  recorded.catch(() => undefined);
  ctx.timeoutsSetAt.set(target.client, sentAt);
  let results: pg.QueryResult[];
  try {
    results = await queryString(source.client, sql);
  } catch (error) {
    // Whatever stopped it, the groups before the failing one committed: their shards refuse writes
    // from now on, and the fence limit, like a release after a failure (move.ts), must know it.
    const wave = groups.flatMap((group) => group.map((s) => s.shard));
    const fenced = await source.client.query(FENCED_SHARDS_SQL, [wave]).catch(() => null);
    if (fenced?.rowCount) {
      ctx.fenceStartedAtMs = atMs;
      ctx.fenceDeadline = sentAt + limit;
    }
    // The target's record of a fence that fenced nothing goes back to `synced` (best effort: the
    // source's step is the one a resumed run carries on from); a fence carried on group by group
    // records the target again (fence).
    if (
      (await recorded.then(
        () => true,
        () => false,
      )) &&
      fenced?.rowCount === 0
    )
      await recordStep(target.client, ctx.moveId, 'synced', 'running', progress(ctx)).catch(() => undefined);
    const code = (error as { code?: string }).code;
    if (code === undefined || !FENCE_WAIT_CODES.includes(code)) throw error;
    return false;
  }
  ctx.fenceStartedAtMs = atMs;
  ctx.fenceDeadline = sentAt + limit;
  ctx.fenceMarker = marker;
  ctx.timeoutsSetAt.set(source.client, sentAt);
  let states: SequenceState[] | null = null;
  let placementVersion = 0n;
  for (const r of results) {
    if (hasField(r, 'is_called')) states = r.rows as SequenceState[];
    else if (hasField(r, PLACEMENT_VERSION_FIELD))
      placementVersion = BigInt((r.rows[0] as Record<string, string>)[PLACEMENT_VERSION_FIELD]!);
  }
  ctx.sourceNow = { wave: ctx.wave, leaves: leavesReported(leaves, results) };
  ctx.fenceReads = {
    wave: ctx.wave,
    marker,
    // pg_get_sequence_data says nothing (NULL) of a sequence the role may not read: read while fenced, as before.
    sequences:
      states !== null && states.length === sequences.length && states.every((r) => r.last_value !== null)
        ? states
        : sequences.length === 0
          ? []
          : null,
    placementVersion,
  };
  await underFence(ctx, `the record of the fence on ${target.host.name}`, () => recorded);
  return true;
}

/**
 * How many tables one fence transaction may lock: half of max_locks_per_transaction, the lock slots
 * the server reserves per connection, so a fence never runs the shared lock table short. One
 * round trip and one commit per group instead of per shard is what keeps a 64-shard wave's fence
 * short.
 */
async function fenceGroupTables(ctx: MoveContext): Promise<number> {
  return (await lockLimits(ctx)).groupTables;
}

export function maxFencedMs(ctx: MoveContext): number {
  return ctx.options.maxFencedMs ?? DEFAULT_MAX_FENCED_MS;
}

/**
 * What is left of this run's fence limit. A run that finds its wave already fenced (resumed after
 * a kill) starts its own limit when it first asks.
 */
export function fenceRemainingMs(ctx: MoveContext): number {
  ctx.fenceDeadline ??= performance.now() + maxFencedMs(ctx);
  return ctx.fenceDeadline - performance.now();
}

/**
 * How far past the fence limit a statement of the cut-over may run: the source's and target's
 * statement timeout is set again only once it was set this long ago (each SET is a round trip while
 * writes wait).
 */
const TIMEOUT_SLACK_MS = 250;

/**
 * Runs one wait of the cut-over within what is left of the fence limit: every statement the move's
 * sessions (and `also`) run meanwhile has that as its statement timeout (set again when it was set
 * over TIMEOUT_SLACK_MS ago), so no lock queue on either host can hold the wave fenced past the
 * limit. Past it, the wave is unfenced and the move stops, naming `what` it waited for. The
 * timeouts stay until the wave switches or stops (endFenceTimeouts).
 */
export async function underFence<T>(
  ctx: MoveContext,
  what: string,
  fn: () => Promise<T>,
  also: readonly pg.Client[] = [],
): Promise<T> {
  const remaining = fenceRemainingMs(ctx);
  if (remaining <= 0) return stopCutOver(ctx, what);
  const now = performance.now();
  const stale = [ctx.source.client, ctx.target.client].filter(
    (c) => now - (ctx.timeoutsSetAt.get(c) ?? -Infinity) > TIMEOUT_SLACK_MS,
  );
  try {
    // Noted as they are sent: a SET that fails part way (a target cut off) still leaves the other
    // host's timeout set, which endFenceTimeouts must reset.
    for (const c of stale) ctx.timeoutsSetAt.set(c, now);
    await Promise.all([...stale, ...also].map((c) => c.query(statementTimeoutSql(remaining))));
    return await fn();
  } catch (error) {
    if ((error as { code?: string }).code !== '57014' || fenceRemainingMs(ctx) > 50) {
      // The other host's part of `fn` may still be running (Promise.all rejects at the first
      // failure): a string of statements it fails part way leaves its transaction aborted, in which
      // the unfence would run. Queued behind it, this rollback clears that.
      await rollbackQuietly(ctx.source.client);
      throw error;
    }
    // A statement of a BEGIN … COMMIT string left its transaction aborted.
    // Only leaves the transaction the timeout aborted; stopCutOver reports the stop whatever this does.
    await Promise.all([ctx.source.client, ctx.target.client].map(rollbackQuietly));
    return stopCutOver(ctx, what, error);
  }
}

/** How long past the fence limit a fenced wait may go unanswered before the move cuts off its sessions on the target. */
const FENCE_CUTOFF_SLACK_MS = 1_000;

/**
 * Watches a fenced wave from its fence until its switch is sent: a target that stops answering
 * (frozen, black-holed) cannot deliver the statement timeouts that bound the cut-over's waits, and
 * would keep the wave fenced until its silence is noticed (up to twice hostTimeout). Once
 * FENCE_CUTOFF_SLACK_MS past the fence limit, if one of the move's sessions on the target (its own,
 * the verification's) has been waiting that long with nothing read, and a new connection cannot run
 * SELECT 1 there within the slack either, all of them are cut off (cutOff): the wait fails, and the
 * source, which holds the fence, releases the wave, its statements on the target failing at once. A
 * target that answers is never cut off. Not once the switch is sent (ctx.switchSent): the target
 * may have taken the shards, and the move can only go forward. Returns the function that stops the
 * watch.
 */
export function watchFence(ctx: MoveContext): () => void {
  const quiet = new Map<pg.Client, { bytes: number; since: number }>();
  let probing = false;
  let stopped = false;
  const timer = setInterval(() => {
    const now = performance.now();
    const deadline = ctx.fenceDeadline;
    const pre = ctx.pre?.wave === ctx.wave ? ctx.pre.verification.target : null;
    // Every target session seen during the watch stays watched: the release ends the verification's
    // (a COMMIT) after it was dropped from ctx.pre.
    if (pre && !quiet.has(pre)) quiet.set(pre, { bytes: -1, since: now });
    if (!quiet.has(ctx.target.client)) quiet.set(ctx.target.client, { bytes: -1, since: now });
    const silent = [...quiet].some(([client, seen]) => {
      const state = waitState(client);
      if (!state) return false;
      if (!state.waiting || seen.bytes !== state.bytesRead) {
        quiet.set(client, { bytes: state.bytesRead, since: now });
        return false;
      }
      return now - seen.since >= FENCE_CUTOFF_SLACK_MS;
    });
    if (!silent || probing || deadline === null || ctx.switchSent || now < deadline + FENCE_CUTOFF_SLACK_MS) return;
    // Silence alone proves nothing (a long statement of an undo, a lock queue): a new connection
    // must not be able to run SELECT 1 within the slack either.
    probing = true;
    void answersWithin(ctx.target.host, FENCE_CUTOFF_SLACK_MS).then((failure) => {
      probing = false;
      if (failure === null) {
        // It answers: busy, not gone. Looked at again after another slack of silence.
        for (const client of quiet.keys()) quiet.set(client, { bytes: -1, since: performance.now() });
        return;
      }
      if (stopped || ctx.switchSent || ctx.fenceDeadline === null) return;
      // Every session of the move there is cut off, so that the release's statements on the target
      // fail at once instead of waiting in turn.
      const reason = `did not answer within the fence limit (${(maxFencedMs(ctx) / 1000).toFixed(1)} s) while ${shardsPhrase(waveShards(ctx))} refused writes, nor a new connection within ${FENCE_CUTOFF_SLACK_MS / 1000} s (${failure}); the move cut off its sessions there`;
      for (const client of quiet.keys()) cutOff(client, ctx.target.host, reason);
    });
  }, FENCE_WATCH_INTERVAL_MS);
  timer.unref();
  return () => {
    stopped = true;
    clearInterval(timer);
  };
}

/** How often watchFence looks. */
const FENCE_WATCH_INTERVAL_MS = 100;

/**
 * The source's and target's statement timeouts of the cut-over (underFence) back to the server's
 * default (the move sets no other): once the wave switched, and before anything else runs after a
 * stop. The RESET runs under the timeout it replaces: one that timeout cancels is sent again (a
 * few times). A connection that cannot reset is broken: the move's next statement on it fails and
 * says so.
 */
export async function endFenceTimeouts(ctx: MoveContext): Promise<void> {
  const clients = [...ctx.timeoutsSetAt.keys()];
  ctx.timeoutsSetAt.clear();
  const reset = async (c: pg.Client): Promise<void> => {
    for (let attempt = 0; attempt < 3; attempt++) {
      try {
        await c.query(RESET_STATEMENT_TIMEOUT_SQL);
        return;
      } catch (error) {
        // Only a RESET its own timeout cancelled is worth sending again.
        if ((error as { code?: string }).code !== '57014') return;
      }
    }
  };
  await Promise.all(clients.map(reset));
}

/** What the current fence attempt's string read (ctx.fenceReads), or null: another wave's, an earlier attempt's, or none. */
function currentFenceReads(ctx: MoveContext): MoveContext['fenceReads'] {
  const reads = ctx.fenceReads;
  return reads?.wave === ctx.wave && reads.marker === ctx.fenceMarker ? reads : null;
}

/** Keeps the longest time the shards of this move refused writes, across waves and runs. */
function noteBlocked(ctx: MoveContext): void {
  if (ctx.fenceStartedAtMs !== null)
    ctx.writeBlockedMs = Math.max(ctx.writeBlockedMs ?? 0, Date.now() - ctx.fenceStartedAtMs);
}

/**
 * The wave made writable again after its cut-over stopped short of the switch (the fence limit, a
 * later wave's failed verification, any failure while it was fenced): the move's own sessions first
 * let go of everything they hold, the move is recorded back at `synced`, so that --resume fences
 * the wave again, and the shards are unfenced. In that order: a record still at `fenced` would let
 * --resume verify and switch shards that take writes. One host's record is enough (--resume
 * carries on from the earlier of the two, reconcileRecords): a target that stopped answering does
 * not keep the source fenced. Keeps how long the shards refused writes (ctx.writeBlockedMs). Only
 * for a wave this run fenced (ctx.fenceStartedAtMs) or found fenced.
 */
export async function releaseWave(ctx: MoveContext): Promise<void> {
  await endFenceTimeouts(ctx);
  await dropPreVerification(ctx);
  noteBlocked(ctx);
  ctx.fenceMarker = null;
  ctx.fenceStartedAtMs = null;
  ctx.fenceDeadline = null;
  const detail = progress(ctx);
  const recorded = await Promise.allSettled(
    [ctx.source, ctx.target].map((side) => recordStep(side.client, ctx.moveId, 'synced', 'running', detail)),
  );
  const refused = recorded.filter((r): r is PromiseRejectedResult => r.status === 'rejected');
  if (refused.length === recorded.length) throw refused[0]!.reason;
  await unfence(ctx, waveShards(ctx));
}

/**
 * The fence limit is reached: the wave is released (releaseWave), and the move stops, resumable,
 * naming what it waited for and how long the shards refused writes.
 */
export async function stopCutOver(ctx: MoveContext, what: string, cause?: unknown): Promise<never> {
  const shards = waveShards(ctx);
  const which = shardsPhrase(shards);
  const limit = `${(maxFencedMs(ctx) / 1000).toFixed(1)} s`;
  // Read after the release, which notes how long the shards refused writes.
  const data = () => ({
    moveId: ctx.moveId,
    shards: ctx.shards,
    waitedFor: what,
    writeBlockedMs: ctx.writeBlockedMs ?? 0,
  });
  try {
    await releaseWave(ctx);
  } catch (error) {
    throw new HostError(
      ctx.source.host.name,
      `move ${ctx.moveId}: the fence limit (${limit}) was reached while waiting for ${what}, and ${which} could not be unfenced: ${describePgError(error)}. ` +
        `Resume the move, or abort it`,
      {
        shard: shards[0]!,
        code: 'FENCE_LIMIT',
        cause: cause ?? error,
        data: data(),
        next: resumeOrAbort(ctx.shards),
      },
    );
  }
  throw new HostError(
    ctx.source.host.name,
    `move ${ctx.moveId}: ${which} refused writes for ${((ctx.writeBlockedMs ?? 0) / 1000).toFixed(1)} s, the fence limit is ${limit}; the move waited for ${what}. ` +
      `${inflect(shards.length, 'It was', 'They were')} unfenced and ${inflect(shards.length, 'is', 'are')} writable again on ${ctx.source.host.name}. ` +
      `Resume the move to retry the cut-over, or abort it`,
    { shard: shards[0]!, code: 'FENCE_LIMIT', cause, data: data(), next: resumeOrAbort(ctx.shards) },
  );
}

/**
 * The first part of the wave's verification, while the source is still writable (see tail.ts):
 * tracking of the keyed tables on the target, change logs of the others on both hosts and of the
 * keyed ones on the source, then a snapshot of all of them on both hosts, kept open until the wave
 * is verified. Tables empty on the source now are left out (ctx.untracked): while fenced they hold
 * only the rows written during the cut-over, and are checksummed whole, or not read at all when
 * still empty on both hosts; no trigger is created on them, nor dropped while fenced. Best effort:
 * if the logs cannot be had, the tables without a key are checksummed whole while fenced and the
 * keyed ones compared by key on both hosts; if nothing can, every table is checksummed whole.
 */
async function startPreVerification(ctx: MoveContext, schemas: readonly string[]): Promise<void> {
  await dropPreVerification(ctx);
  if (ctx.mode !== 'online') return;
  let held: pg.Client[] = [];
  let opening: Promise<PromiseSettledResult<pg.Client>[]> | null = null;
  try {
    const [leaves, leftOnTarget, leftOnSource] = await Promise.all([
      ctx.leaves?.wave === ctx.wave ? ctx.leaves.source : shardLeaves(ctx.source.client, schemas),
      shardTriggers(ctx.target.client, schemas, [...TRACK_TRIGGERS, ...DELTA_TRIGGERS]),
      shardTriggers(ctx.source.client, schemas, DELTA_TRIGGERS),
    ]);
    const empty = new Set(leaves.filter((t) => t.empty).map((t) => `${t.schema}.${t.table}`));
    // Until it is known that the wave has none, its verification removes triggers (a killed run's too).
    ctx.untracked = { wave: ctx.wave, tables: empty, triggers: true };
    const keyed = (await keyedTables(ctx.source.client, schemas)).filter(
      (k) => !empty.has(`${k.table.schema}.${k.table.table}`),
    );
    const methods = await ensureMethods(ctx);
    const isKeyed = new Set(keyed.map((k) => `${k.table.schema}.${k.table.table}`));
    const unkeyed = (await leafTablesOf(ctx, schemas)).filter(
      (t) => !isKeyed.has(`${t.schema}.${t.table}`) && !empty.has(`${t.schema}.${t.table}`),
    );
    if (keyed.length === 0 && unkeyed.length === 0) {
      ctx.untracked = { ...ctx.untracked, triggers: leftOnTarget.length + leftOnSource.length > 0 };
      return;
    }
    // The verification's two sessions connect while the tracking and the change logs are set up
    // (their snapshots are taken after).
    opening = Promise.allSettled([
      openWorker(ctx.source.host, 'shardctl move verify'),
      openWorker(ctx.target.host, 'shardctl move verify'),
    ]);
    // The target's tracking and the source's change logs are set up at once (each host's own work).
    const tracking = awaitedLater(
      keyed.length > 0 ? runTransaction(ctx.target.client, startTrackingSql(ctx.moveId, keyed)) : Promise.resolve(),
    );
    const [tracked, logging] = await Promise.allSettled([
      tracking,
      startDeltas(ctx, schemas, { both: unkeyed, sourceOnly: keyed.map((k) => k.table) }, methods, tracking),
    ]);
    if (tracked.status === 'rejected') throw tracked.reason;
    if (logging.status === 'rejected') throw logging.reason;
    const logs = logging.value;
    const logged = logs ? unkeyed : [];
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
      { moveId: ctx.moveId, tables: logged, keyedOnSource: logs },
    );
    ctx.pre = { wave: ctx.wave, verification };
    notice(
      ctx,
      `host ${ctx.target.host.name}: ${plural(keyed.length + logged.length, 'table')} of wave ${ctx.wave + 1} checksummed before the fence in ${elapsed(started)} ms; while fenced only their changed rows are compared`,
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
  targetFree: Promise<void>,
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
        await runTransaction(ctx.target.client, startDeltasSql(ctx.moveId, logged(tables.both), lockWaitMs, ctx.wave));
    }),
    startSourceDeltas(ctx.source.client, ctx.moveId, logged(all), lockWaitMs, DELTAS_SETUP_LIMIT_MS, ctx.wave),
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
async function stopLogs(
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
  const pre = ctx.pre;
  ctx.pre = null;
  if (!pre) return;
  await endPreVerification(pre.verification);
  // Switched off only: this may run while the wave is fenced (a fence limit reached, a failed
  // step), where a drop per trigger would add round trips; the unfence drops them after.
  if (logs && (pre.verification.logged.size > 0 || pre.verification.keyedOnSource))
    await stopLogs(ctx, schemasOf(ctx, ctx.waves[pre.wave]!), { drop: false }).catch(() => undefined);
}

/** Who holds locks on the tables or sequences of these schemas: pid, application, transaction age and query. */
async function lockHolders(client: pg.Client, schema: string | readonly string[]): Promise<string> {
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

/**
 * Logical replication applies in commit order: once the fence marker is on the target, so is every
 * earlier change. One round trip (catchUpSql): the target looks for the marker itself, every
 * millisecond, and then reads what the verification needs of it (ctx.targetNow).
 */
export async function waitForCatchUp(ctx: MoveContext): Promise<void> {
  const catchUp = ctx.options.catchUpTimeoutMs ?? 30_000;
  const limit = Math.min(catchUp, Math.max(0, fenceRemainingMs(ctx)));
  try {
    // The fence records its marker with its step: a wave fenced without one cannot be caught up,
    // and stopping here unfences it, so that a resumed run fences again with a marker.
    if (ctx.fenceMarker === null) throw new Error(`no fence marker is recorded for wave ${ctx.wave + 1}`);
    await catchUpAndRead(ctx, ctx.fenceMarker, limit);
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
  const leaves = ctx.leaves?.wave === ctx.wave ? ctx.leaves.target : [];
  const changes = ctx.pre?.wave === ctx.wave;
  const sql = catchUpSql({
    moveId: ctx.moveId,
    kind: marker,
    limitMs,
    readsWithinMs: fenceRemainingMs(ctx),
    leaves: leaves.map((t) => t.oid),
    changes,
  });
  const results = await queryString(ctx.target.client, sql);
  // Here the marker is applied: the wait fails otherwise, and the reads after it are not run.
  const read = results.find((r) => hasField(r, 'keys_json'));
  ctx.targetNow = {
    wave: ctx.wave,
    marker,
    leaves: leavesReported(leaves, results),
    changes: changes && read ? changesOf(read.rows as ChangesRow[]) : null,
  };
}

/**
 * Runs a string of several statements (one result each); on failure rolls back (quietly), so the
 * session stays usable whatever transaction the string left open, and rethrows.
 */
async function queryString(client: pg.Client, sql: string): Promise<pg.QueryResult[]> {
  try {
    return [(await client.query(sql)) as unknown as pg.QueryResult[]].flat();
  } catch (error) {
    await rollbackQuietly(client);
    throw error;
  }
}

function hasField(result: pg.QueryResult, name: string): boolean {
  return result.fields?.some((f) => f.name === name) ?? false;
}

/**
 * The listed tables with their emptiness as a string's reportEmptySql rows (oid, empty) say it, in
 * every result that has them; a table they do not report, or no longer find (NULL), is left out, as
 * leavesNow does.
 */
function leavesReported(leaves: readonly LeafTable[], results: readonly pg.QueryResult[]): LeafTable[] {
  const empty = new Map<number, boolean | null>();
  for (const r of results)
    if (hasField(r, 'empty'))
      for (const row of r.rows as { oid: number; empty: boolean | null }[]) empty.set(row.oid, row.empty);
  return leaves.flatMap((t) => {
    const e = empty.get(t.oid);
    return e === undefined || e === null ? [] : [{ ...t, empty: e }];
  });
}

/** What the target said when this fence attempt's catch-up saw its marker (ctx.targetNow), or null: another wave's, an earlier attempt's, or none. */
function currentTargetNow(ctx: MoveContext): MoveContext['targetNow'] {
  const now = ctx.targetNow;
  return now?.wave === ctx.wave && now.marker === ctx.fenceMarker ? now : null;
}

/**
 * Logical replication does not carry sequences. Each target sequence is set to at least the
 * source's state (read from the sequence itself, so a setval(..., false) is carried as such): every
 * new id on the target is then greater than every id of the shard (the sequence holds next_id's
 * position, and ids grow with it).
 */
export async function carrySequences(ctx: MoveContext): Promise<void> {
  if (ctx.mode === 'online')
    return underFence(ctx, 'the sequences of the wave on both hosts', () => carrySequencesNow(ctx));
  return carrySequencesNow(ctx);
}

async function carrySequencesNow(ctx: MoveContext): Promise<void> {
  const list = await listSequences(ctx);
  if (list.length === 0) return;
  // Online, the source's states as the fence string read them (every writer that got past the
  // fence had finished) and the target's as read before the fence (online, nothing writes to the
  // target's copies meanwhile; offline the copy does, and may fire triggers there): no round trip
  // while writes wait but the setval, if any.
  const fenced = ctx.mode === 'online' ? currentFenceReads(ctx) : null;
  const before = ctx.sequences?.wave === ctx.wave ? ctx.sequences.target : undefined;
  const [src, dst] =
    fenced?.sequences && before && fenced.sequences.length === list.length && before.length === list.length
      ? [fenced.sequences, before]
      : await Promise.all([readSequences(ctx.source, list), readSequences(ctx.target, list)]);
  const behind: SequenceValue[] = [];
  list.forEach((sequence, i) => {
    const increment = sequence.incrementBy;
    const next = (r: SequenceState): bigint => BigInt(r.last_value) + (r.is_called ? increment : 0n);
    const s = src[i]!;
    const d = dst[i]!;
    // The value the target would hand out next must not come before the source's.
    const targetBehind = increment > 0n ? next(d) < next(s) : next(d) > next(s);
    if (targetBehind)
      behind.push({
        schema: sequence.schema,
        name: sequence.name,
        lastValue: BigInt(s.last_value),
        isCalled: s.is_called,
      });
  });
  if (behind.length > 0) await ctx.target.client.query(setSequencesSql(behind));
}

/**
 * The sequences of the wave's shards on the source, listed once per wave: before its fence (the
 * list is a catalog read that costs more than the values), or here when a resumed run finds the
 * wave fenced already. A sequence created by hand after the list has no copy on the target to carry
 * to; the verification finds its table's rows missing there.
 */
async function listSequences(ctx: MoveContext): Promise<readonly ShardSequence[]> {
  if (ctx.sequences?.wave === ctx.wave) return ctx.sequences.list;
  const rows = await ctx.source.client.query<{ schemaname: string; sequencename: string; increment_by: string }>(
    SHARD_SEQUENCES_SQL,
    [schemasOf(ctx, waveShards(ctx))],
  );
  const list = rows.rows.map((r) => ({
    schema: r.schemaname,
    name: r.sequencename,
    incrementBy: BigInt(r.increment_by),
  }));
  ctx.sequences = { wave: ctx.wave, list };
  return list;
}

/** The sequences' states on one host, in order: one statement, whatever their number, from PostgreSQL 18. */
async function readSequences(side: MoveContext['source'], list: readonly ShardSequence[]): Promise<SequenceState[]> {
  if (side.serverVersionNum >= 180000) {
    const names = list.map((s) => `${quoteIdent(s.schema)}.${quoteIdent(s.name)}`);
    const result = await side.client.query<SequenceState & { i: number }>(READ_SEQUENCE_DATA_SQL, [names]);
    // pg_get_sequence_data says nothing (NULL) of a sequence the role may not read: read it directly, which says why.
    if (result.rows.every((r) => r.last_value !== null)) return result.rows;
  }
  const pairs = list.map((s) => [s.schema, s.name] as const);
  return (await side.client.query<SequenceState>(readSequencesSql(pairs))).rows;
}

export async function verify(ctx: MoveContext): Promise<void> {
  const shards = waveShards(ctx);
  const schemas = schemasOf(ctx, shards);
  const methods = await ensureMethods(ctx);
  const pre = ctx.pre?.wave === ctx.wave ? ctx.pre.verification : null;
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
        const emptyBefore = ctx.untracked?.wave === ctx.wave ? ctx.untracked.tables : undefined;
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
  if (ctx.untracked?.wave !== ctx.wave || ctx.untracked.triggers) {
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
    return;
  }
  const mismatches = result.mismatches.map((m) => `  - ${m}`).join('\n');
  const data = { moveId: ctx.moveId, verification: { ...result, rows: result.rows.toString() } };
  if (ctx.wave === 0) {
    // Nothing switched yet: the move is undone, the sources writable again, nothing is lost.
    throw new UndoThenReport(
      'sequences-carried',
      new HostError(
        ctx.target.host.name,
        `verification failed, the move was aborted and the source on ${ctx.source.host.name} is writable again:\n${mismatches}`,
        {
          shard: shards[0]!,
          code: 'VERIFY_FAILED',
          data,
          details: result.mismatches,
        },
      ),
    );
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
 * fence (ctx.leaves): the source's as its fence transactions reported them (ctx.sourceNow), the
 * target's as its catch-up reported them (ctx.targetNow), or else looked up by OID; undefined
 * (verifyShards reads them) when this run has no list. A table
 * added by hand after the list is not seen here: its writes reach no table on the target, so the
 * replication stops and the catch-up ends at the fence limit.
 */
async function leavesAfterFence(
  ctx: MoveContext,
): Promise<{ source: readonly LeafTable[]; target: readonly LeafTable[] } | undefined> {
  const listed = ctx.leaves;
  if (listed?.wave !== ctx.wave) return undefined;
  const fromFence = ctx.sourceNow?.wave === ctx.wave ? ctx.sourceNow.leaves : undefined;
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
  // From here the target may take the shards: watchFence no longer cuts it off.
  ctx.switchSent = true;
  if (reads) {
    const v = reads.placementVersion;
    const settled = await Promise.allSettled([
      ctx.source.client.query(switchPlacementSql(false), [shards, target, (v + 1n).toString()]),
      ctx.target.client.query(switchPlacementSql(true), [shards, target, (v + 2n).toString()]),
    ]);
    for (const r of settled) if (r.status === 'rejected') throw r.reason;
  } else {
    const onSource = await ctx.source.client.query<{ version: string }>(switchPlacementSql(false), [
      shards,
      target,
      '0',
    ]);
    await ctx.target.client.query(switchPlacementSql(true), [shards, target, onSource.rows[0]!.version]);
  }
  // Writable again from here: the fleet's placement names the target, whose copies are active (the
  // routers follow the fleet, not the file).
  noteBlocked(ctx);
  await endFenceTimeouts(ctx);
  const file = ctx.options.configFile ?? ctx.config.file;
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

/** How long the unfence keeps retrying while application transactions hold the fenced tables. */
const UNFENCE_LIMIT_MS = 5_000;

/**
 * The wave's shards writable again, each in its own short transaction whose lock waits are
 * bounded (unfenceSql) and retried: a TRUNCATE queued on a fenced table behind a long application
 * transaction must not hold the unfence without limit. Past `limitMs` it gives up, naming the holders.
 */
async function unfence(ctx: MoveContext, shards: readonly number[], limitMs = UNFENCE_LIMIT_MS): Promise<void> {
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
 * A failure after which the move is undone before it is reported (the verification of the first
 * wave: nothing switched yet). The step cannot undo the move itself: the undo of every step is
 * move.ts's, which runs the steps.
 */
export class UndoThenReport extends Error {
  constructor(
    readonly after: MoveStep,
    readonly failure: HostError,
  ) {
    super(failure.message);
  }
}
