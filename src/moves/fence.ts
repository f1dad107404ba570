import pg from 'pg';
import { lines } from '../pg/sql-template.js';
import { shardSchemaName } from '../config/types.js';
import { formatShardList } from '../config/ranges.js';
import { HostError, resumeOrAbort } from '../errors.js';
import { CLEANUP_CHUNK, CLEANUP_WORKER } from './workers.js';
import { FENCED_SHARDS_SQL } from './sql/control.js';
import {
  fenceGroups,
  fenceMarkerSql,
  fenceSql,
  fenceWaveSql,
  TABLE_NAMES_SQL,
  deallocateSql,
  prepareSequencesReadSql,
  recordFencedSql,
  prepareFenceSql,
  type FenceInput,
  PLACEMENT_VERSION_FIELD,
} from './sql/fence.js';
import { lockTimeoutSql } from './sql/locks.js';
import { insertMarkerSql } from './sql/replication.js';
import { statementTimeoutSql } from './sql/session.js';
import { recordStep } from './state.js';
import { BUSY, LOCK_WAIT_CODES, inTransaction, retryWhileBusy, runTransaction } from '../pg/quiet.js';
import { leavesNow, shardLeaves, type LeafTable } from './catalog.js';
import { type MoveContext, type SequenceState, schemasOf, waveShards, notice } from './context.js';
import { progress } from './progress.js';
import { waitForMarker } from './replication.js';
import { plural } from '../text.js';
import { fenceRemainingMs, underFence, stopCutOver } from './fence-limit.js';
import { lockLimits, FENCE_WAIT_CODES, lockHolders } from './fence-locks.js';
import { startPreVerification } from './pre-verification.js';
import { hasField, leavesReported } from './catch-up.js';
import { listSequences, readSequences } from './sequences.js';

/**
 * The fence of a wave (a step of the cut-over): what can be done while the wave is still writable
 * (its change tracking, the tables' readiness, a catch-up), then its shards refusing writes in a
 * few short transactions, and the wave's marker. Its limit and its undo: fence-limit.ts,
 * unfence.ts.
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
  // Three reads queued at once on the source's session.
  const [tables, limits, fencedRows] = await Promise.all([
    source.client.query<{ schema: string; table: string }>(TABLE_NAMES_SQL, [schemas]),
    lockLimits(ctx),
    source.client.query<{ shard: number }>(FENCED_SHARDS_SQL, [shards]),
  ]);
  const lockWaitMs = limits.lockWaitMs;
  const limit = ctx.settings.fenceTimeoutMs;
  const fenced = new Set(fencedRows.rows.map((r) => r.shard));
  const shardOf = new Map(shards.map((shard) => [shardSchemaName(ctx.config, shard), shard]));
  const tablesOf = new Map<number, (readonly [string, string])[]>(shards.map((shard) => [shard, []]));
  for (const t of tables.rows) tablesOf.get(shardOf.get(t.schema)!)?.push([t.schema, t.table]);
  const pending = shards.filter((s) => !fenced.has(s));
  // At most half of max_locks_per_transaction tables a transaction (the lock slots the server
  // reserves per connection), so a fence never runs the shared lock table short; one round trip and
  // one commit per group instead of per shard is what keeps a 64-shard wave's fence short.
  const groups = fenceGroups(pending, (s) => tablesOf.get(s)!.length, limits.groupTables);
  const ofGroup = (group: readonly number[]) => group.map((shard) => ({ shard, tables: tablesOf.get(shard)! }));
  // A killed run's fence already runs: the rest is fenced as before, within a limit of this run's
  // own from now (its start is in the record; a wave found fenced without one refuses writes from
  // now on at the latest). Set before anything else can fail: a start the record kept of a wave
  // that was released since (on one host's record only) is not this wave's.
  if (fenced.size === 0) ctx.current.fenceStartedAtMs = null;
  else {
    ctx.current.fenceStartedAtMs ??= Date.now();
    fenceRemainingMs(ctx);
  }
  const { prepared, sequencesRead } =
    fenced.size === 0
      ? await whileWritable(ctx, schemas, groups.map(ofGroup), lockWaitMs)
      : { prepared: new Set<number>(), sequencesRead: null };
  const started = performance.now();
  let attempts = 0;
  let told = started;
  const withTables = (group: readonly number[]) =>
    ofGroup(group).map((s) => ({ ...s, prepared: prepared.has(s.shard) }));
  /** One shard's fence, retried while application transactions hold its tables, within the limits. */
  const fenceAlone = async (shard: number): Promise<void> => {
    const schema = shardSchemaName(ctx.config, shard);
    const once = async (): Promise<true | typeof BUSY> => {
      attempts += 1;
      // One shard that met a busy table: its retries give up early on a writer of the reverse lock order.
      return (await fenceOnce(ctx, withTables([shard]), lockWaitMs, { lockFirstAlone: true })) || BUSY;
    };
    await retryWhileBusy(once, async () => {
      if (ctx.current.fenceStartedAtMs !== null && fenceRemainingMs(ctx) <= 0) {
        // Who holds the locks only adds to the message, which stands without it.
        const holders = await lockHolders(source.client, schema).catch(() => '');
        await stopCutOver(
          ctx,
          `the fence of shard ${shard} (${attempts} attempts): application transactions kept the tables of ${schema} busy${holders ? ` (${holders})` : ''}`,
        );
      }
      const waited = performance.now() - started;
      if (ctx.current.fenceStartedAtMs === null && waited > limit) {
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
    });
  };
  // The whole wave in one round trip; the group-by-group fence below is for a wave that met a busy
  // table (or that a killed run fenced in part).
  // The group that met the busy table there: the first not fenced, which is not tried whole again.
  let busyGroup: readonly number[] | undefined;
  if (fenced.size === 0 && groups.length > 0) {
    attempts += 1;
    if (await fenceWaveOnce(ctx, groups.map(withTables), lockWaitMs, sequencesRead)) return;
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
  if (ctx.current.fenceStartedAtMs === null) ctx.current.fenceStartedAtMs = Date.now();
  ctx.current.fenceMarker = fenceMarkerKind(ctx, Date.now());
  // The step is recorded with the marker on the source, and on the target meanwhile (progress.ts).
  const detail = progress(ctx);
  await underFence(ctx, 'the fence marker on the source', () =>
    Promise.all([
      runTransaction(source.client, fenceMarkerSql(ctx.moveId, ctx.current.fenceMarker!, detail)),
      recordStep(ctx.target.client, ctx.moveId, 'fenced', 'running', detail),
    ]),
  );
}

/**
 * What a wave's cut-over does before its fence, while its shards still take writes, so that the
 * fence has less to do: its tables listed on both hosts (the wave's leaves), its fence triggers created
 * disabled (the shards returned), the target caught up, the verification begun, its sequences
 * listed and read once on both hosts: the target's states are kept (nothing moves the target's
 * copies of them; carrySequences sets them from these), and the source's read is the fence
 * string's own, prepared (its name returned: `sequencesRead`), so that the fence runs it by name
 * with its plan made and the sequences open; its tables opened by both hosts' sessions.
 */
async function whileWritable(
  ctx: MoveContext,
  schemas: readonly string[],
  groups: readonly FenceInput['shards'][],
  lockWaitMs: number,
): Promise<{ prepared: Set<number>; sequencesRead: string | null }> {
  // The sequences are listed meanwhile, queued behind the source's leaves.
  const [onSource, onTarget] = await Promise.all([
    shardLeaves(ctx.source.client, schemas),
    shardLeaves(ctx.target.client, schemas),
    listSequences(ctx),
  ]);
  ctx.current.leaves = { source: onSource, target: onTarget };
  const prepared = await prepareFence(ctx, groups, lockWaitMs);
  await catchUpBeforeFence(ctx);
  if (!ctx.current.pre) await startPreVerification(ctx, schemas);
  const sequences = await listSequences(ctx);
  // Last, after everything that changes the tables' triggers: each host's session also opens the
  // wave's tables once (their sizes), so that the fence's and the verification's reads of their
  // sizes find them open, not opened table by table while writes wait (a fifth of a fence's time).
  // A lock held or queued on one of them (a DDL statement, behind a long transaction) would hold
  // those reads while fenced until the fence limit: the fence waits for it here instead, while
  // the shards take writes, retrying for as long as it would retry its own locks (fenceTimeoutMs),
  // then stops with nothing fenced.
  /** The statement the source's read of this attempt prepared (or began to). */
  let attempted: string | null = null;
  const read = (side: MoveContext['source'], leaves: readonly LeafTable[]) =>
    readIfFree(side.client, lockWaitMs, async () => {
      let states: SequenceState[] | null = null;
      let name: string | null = null;
      if (sequences.length > 0 && side === ctx.source) {
        // A name of its own each time (a prepared statement outlives the transaction that made it);
        // an attempt that then meets a lock deallocates it (once).
        name = `shardctl_fence_sequences_${++preparedReads}`;
        attempted = name;
        await side.client.query(prepareSequencesReadSql(name, fenceSequenceReads(ctx, sequences)));
      } else if (sequences.length > 0) states = await readSequences(side, sequences);
      await leavesNow(side.client, leaves);
      return { states, name };
    });
  const limit = ctx.settings.fenceTimeoutMs;
  let told = false;
  let busy = ctx.source;
  const once = async (): Promise<{ prepared: Set<number>; sequencesRead: string | null } | typeof BUSY> => {
    attempted = null;
    const settled = await Promise.allSettled([read(ctx.source, onSource), read(ctx.target, onTarget)]);
    for (const r of settled) if (r.status === 'rejected') throw r.reason;
    const [source, target] = settled.map(
      (r) =>
        (r as PromiseFulfilledResult<{ value: { states: SequenceState[] | null; name: string | null } } | null>).value,
    );
    if (source && target) {
      if (target.value.states) ctx.current.sequences = { list: sequences, target: target.value.states };
      return { prepared, sequencesRead: source.value.name };
    }
    // Not left on the session for the attempts to come (none if the PREPARE itself met the lock).
    if (attempted !== null) await ctx.source.client.query(deallocateSql(attempted)).catch(() => undefined);
    busy = source ? ctx.target : ctx.source;
    return BUSY;
  };
  return retryWhileBusy(once, async (_, waited) => {
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
  });
}

/** The prepared sequence reads of this process, for their names. */
let preparedReads = 0;

/** The sequences' read of the fence string (fenceReadsSql), for these sequences on the source. */
function fenceSequenceReads(
  ctx: MoveContext,
  sequences: readonly { readonly schema: string; readonly name: string }[],
): { sequences: (readonly [string, string])[]; sequenceData: boolean } {
  return {
    sequences: sequences.map((q) => [q.schema, q.name] as const),
    sequenceData: ctx.source.serverVersionNum >= 180000,
  };
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
    return { value: await inTransaction(client, `BEGIN;\n${lockTimeoutSql(lockWaitMs)}`, read) };
  } catch (error) {
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
  /** One transaction for `shards`, or one for each of `inGroups` (their shards), in one round trip. */
  const attempt = async (
    shards: FenceInput['shards'],
    waitMs: number,
    inGroups: readonly FenceInput['shards'][] = [shards],
  ): Promise<boolean> => {
    attempts += 1;
    const sql = lines(
      inGroups.map((group) =>
        prepareFenceSql({
          shards: group,
          targetHost: ctx.target.host.name,
          lockWaitMs: waitMs,
          moveId: ctx.moveId,
          wave: ctx.wave,
        }),
      ),
    );
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
  // The wave's groups in one round trip, each its own transaction; when one meets a busy table,
  // group by group (a group that committed is prepared again, CREATE OR REPLACE TRIGGER).
  if (groups.length < 2 || !(await attempt(groups.flat(), lockWaitMs, groups)))
    for (const group of groups) if (!(await attempt(group, lockWaitMs))) busy.push(...group);
  const retried = busy.length;
  const deadline = performance.now() + PREPARE_RETRY_MS;
  // Rounds over the shards still busy, until none is or the time is up.
  const round = async (): Promise<undefined | typeof BUSY> => {
    const still: FenceInput['shards'][number][] = [];
    for (const shard of busy) {
      const left = deadline - performance.now();
      if (left < PREPARE_LEAST_WAIT_MS || !(await attempt([shard], Math.min(lockWaitMs, PREPARE_RETRY_WAIT_MS, left))))
        still.push(shard);
    }
    busy = still;
    return busy.length === 0 || deadline - performance.now() < PREPARE_LEAST_WAIT_MS ? undefined : BUSY;
  };
  if (busy.length > 0) await retryWhileBusy(round);
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
  await waitForMarker(ctx, kind, ctx.settings.waitTimeoutMs);
}

/**
 * One fence transaction for these shards (fenceSql). False when a lock wait ran out (the
 * application went on; the caller tries again); the wave's fence limit starts with the first that
 * commits.
 */
async function fenceOnce(
  ctx: MoveContext,
  shards: FenceInput['shards'],
  lockWaitMs: number,
  { lockFirstAlone = false }: { readonly lockFirstAlone?: boolean } = {},
): Promise<boolean> {
  const first = ctx.current.fenceStartedAtMs === null;
  const atMs = Date.now();
  const sql = fenceSql({
    shards,
    targetHost: ctx.target.host.name,
    lockWaitMs,
    lockFirstAlone,
    createOrReplaceTrigger: ctx.source.serverVersionNum >= 140000,
    ...(first ? { fenceStart: { moveId: ctx.moveId, atMs } } : {}),
    // Closing it again is harmless: a fence of a group after the first finds it closed.
    ...(shards.some((s) => s.prepared) ? { closeGuard: { moveId: ctx.moveId, wave: ctx.wave } } : {}),
  });
  try {
    await runTransaction(ctx.source.client, sql);
  } catch (error) {
    const code = (error as { code?: string }).code;
    // Lock wait over, statement timeout, or (should the server's settings differ) a deadlock this
    // transaction lost: the application went on; try again.
    if (code === undefined || !FENCE_WAIT_CODES.includes(code)) throw error;
    return false;
  }
  if (first) {
    ctx.current.fenceStartedAtMs = atMs;
    ctx.current.fenceDeadline = performance.now() + ctx.settings.maxFencedMs;
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
 * sequences' states, the placement version the switch starts from: the wave's fenceReads). The target's
 * statement timeout and step go at the same time, over its own session: a target that says
 * `fenced` while the source does not (its fence failed, or a kill came first) is carried on from
 * the source's step (resume.ts, reconcileRecords), and a fence that fenced nothing records the
 * target back. False when a group's lock wait ran out: the groups before it are fenced (the wave's
 * fence limit runs from this attempt), and the caller fences the rest group by group.
 */
async function fenceWaveOnce(
  ctx: MoveContext,
  groups: readonly FenceInput['shards'][],
  lockWaitMs: number,
  sequencesRead: string | null,
): Promise<boolean> {
  const { source, target } = ctx;
  const atMs = Date.now();
  const sentAt = performance.now();
  const marker = fenceMarkerKind(ctx, atMs);
  const limit = ctx.settings.maxFencedMs;
  const detail = { ...progress(ctx), fenceMarker: marker, fenceStartedAtMs: atMs };
  // Each group's transaction also reports which of its tables are empty, once fenced (verify).
  const leaves = ctx.current.leaves?.source ?? [];
  const oidOf = new Map(leaves.map((t) => [`${t.schema}.${t.table}`, t.oid]));
  const sequences = ctx.current.sequences?.list ?? [];
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
      ...fenceSequenceReads(ctx, sequences),
      shards: groups.flatMap((group) => group.map((s) => s.shard)),
      ...(sequencesRead === null ? {} : { prepared: sequencesRead }),
    },
  });
  // The target's statement timeout goes with the step's record, sent now: handled below, whatever the source says.
  const recorded = target.client.query(`${statementTimeoutSql(limit)};\n${recordFencedSql(ctx.moveId, detail)}`);
  recorded.catch(() => undefined);
  ctx.timeoutsSetAt.set(target.client, sentAt);
  let results: pg.QueryResult[];
  try {
    results = await runTransaction(source.client, sql);
  } catch (error) {
    // Whatever stopped it, the groups before the failing one committed: their shards refuse writes
    // from now on, and the fence limit, like a release after a failure (move.ts), must know it.
    const wave = groups.flatMap((group) => group.map((s) => s.shard));
    const fenced = await source.client.query(FENCED_SHARDS_SQL, [wave]).catch(() => null);
    // The string stopped before it ran the prepared read, which the fence group by group does not use.
    if (sequencesRead !== null) await source.client.query(deallocateSql(sequencesRead)).catch(() => undefined);
    if (fenced?.rowCount) {
      ctx.current.fenceStartedAtMs = atMs;
      ctx.current.fenceDeadline = sentAt + limit;
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
  ctx.current.fenceStartedAtMs = atMs;
  ctx.current.fenceDeadline = sentAt + limit;
  ctx.current.fenceMarker = marker;
  ctx.timeoutsSetAt.set(source.client, sentAt);
  let states: SequenceState[] | null = null;
  let placementVersion = 0n;
  for (const r of results) {
    if (hasField(r, 'is_called')) states = r.rows as SequenceState[];
    else if (hasField(r, PLACEMENT_VERSION_FIELD))
      placementVersion = BigInt((r.rows[0] as Record<string, string>)[PLACEMENT_VERSION_FIELD]!);
  }
  ctx.current.sourceNow = leavesReported(leaves, results);
  ctx.current.fenceReads = {
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
