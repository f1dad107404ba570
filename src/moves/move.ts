import { randomBytes } from 'node:crypto';
import { pipeline } from 'node:stream/promises';
import pg from 'pg';
import type copyStreamsModule from 'pg-copy-streams';
import { rewriteShardOwner } from '../config/rewrite.js';
import type { ShardctlConfig } from '../config/types.js';
import { shardSchemaName } from '../config/types.js';
import { formatShardList } from '../config/ranges.js';
import { HostError, ShardctlError } from '../errors.js';
import { checkClientConnection, describePgError } from '../fleet/connect.js';
import { CONTROL } from '../fleet/control.js';
import { errorHost, openWorker, type HostSession } from '../fleet/session.js';
import { createShardSql, dropShardSql } from '../fleet/sql.js';
import { quoteIdent } from '../pg/quote.js';
import type { MigrationFile } from '../migrations/files.js';
import { migrationSql, noTransactionMigrationSteps } from '../migrations/sql.js';
import type { PreflightCheck } from './preflight.js';
import {
  createPublicationSql,
  createSlotCommand,
  createSubscriptionSql,
  dropPublicationSql,
  fenceMarkerSql,
  fenceSql,
  insertMarkerSql,
  oldCopyName,
  qualified,
  readSequencesSql,
  refreshMaterializedViewSql,
  renameWithStubSql,
  replicationName,
  setSequencesSql,
  unfenceSql,
  type SequenceValue,
} from './sql.js';
import { dropSlot, dropSubscription } from './leftovers.js';
import { faultAfter, recordStep, stepsFor, type MoveMode, type MoveRecord, type MoveStep } from './state.js';
import { endPreVerification, hashMethods, preVerify, shardTables, verifyShards, type PreVerification, type ShardTable, type VerifyResult } from './verify.js';
import { keyedTables, readChanges, startTrackingSql, stopTracking } from './tail.js';

/**
 * The move engine: the steps of moving a batch of logical shards from one host to another, online
 * (logical replication) or offline (COPY with writes fenced), each recorded on both hosts once
 * done, so a move cut off at any point is finished (runSteps from the last recorded step) or undone
 * (abortMove). A single shard is a batch of one. Online, the cut-over runs in waves (see planWaves)
 * so that no shard refuses writes for long. The command (src/commands/move-shard.ts) validates,
 * connects, runs the preflight and decides which of these to call.
 */

export interface MoveOptions {
  readonly mode?: MoveMode;
  readonly dryRun?: boolean;
  readonly resume?: boolean;
  readonly abort?: boolean;
  /** Drop the old copy right after the switch instead of keeping it (fenced, renamed) until gc. */
  readonly dropSource?: boolean;
  /** The config file to rewrite at the switch (default: config.file). */
  readonly configFile?: string;
  /** How long the target may take to apply the last changes after the fence (default 30 s). */
  readonly catchUpTimeoutMs?: number;
  /** How long the fence keeps retrying while application transactions hold the tables (default 30 s). */
  readonly fenceTimeoutMs?: number;
  /** How long to wait for the source (slot creation, replication catching up) before stopping (default 5 min). */
  readonly waitTimeoutMs?: number;
  /** Connections per host for creating the target shards and copying (default: the config's concurrency). */
  readonly concurrency?: number;
  /**
   * The caller already holds the runner lock on every host involved (rebalance holds them for its
   * whole run, so that its moves can share hosts); the command then takes none of its own.
   */
  readonly runnerLocksHeld?: boolean;
  /** Wave limits for the online cut-over (default 16 shards, 500,000 estimated rows). */
  readonly wave?: WaveLimits;
  readonly onStep?: (step: MoveStep, detail: string) => void;
  /** What a wait is waiting for, every few seconds; retries; anything a person should know. */
  readonly onNotice?: (message: string) => void;
}

export interface WaveLimits {
  readonly maxShards?: number;
  readonly maxRows?: number;
}

/** The result of one move: a batch of shards from one source host to the target. */
export interface MoveResult {
  readonly moveId: string;
  /** The shards of the batch, ascending. */
  readonly shards: readonly number[];
  /** The first shard of the batch (the shard, for a move of one). */
  readonly shard: number;
  readonly source: string;
  readonly target: string;
  readonly mode: MoveMode;
  readonly outcome: 'moved' | 'aborted' | 'dry-run';
  readonly preflight: readonly PreflightCheck[];
  readonly plan: readonly MoveStep[];
  /** The cut-over waves (online): shards fenced and switched together. */
  readonly waves: readonly (readonly number[])[];
  /** Rows verified on the target, over every wave, across resumes. Decimal string. */
  readonly rowsMoved: string;
  /**
   * The longest any shard of the batch refused writes: from its wave's fence until the map named the
   * target. Includes a fence left by an interrupted run. Null when nothing was fenced.
   */
  readonly writeBlockedMs: number | null;
  readonly durationMs: number;
  /** The tables verified by this run (every wave it cut over). */
  readonly verification: VerifyResult | null;
  /** Materialized views refreshed on the target after the switch (`schema.view`). */
  readonly materializedViews: readonly string[];
}

/** A host session on one side of the move. */
export type Side = HostSession;

export interface MoveContext {
  readonly config: ShardctlConfig;
  readonly moveId: string;
  readonly mode: MoveMode;
  readonly source: Side;
  readonly target: Side;
  readonly shards: readonly number[];
  readonly migrations: readonly MigrationFile[];
  readonly options: MoveOptions;
  /** Publication, subscription and slot share this name. */
  readonly name: string;
  readonly waves: readonly (readonly number[])[];
  /** The wave being cut over (online); 0 offline. */
  wave: number;
  /**
   * The marker kind of the current fence attempt. Each attempt has its own: after a catch-up timeout
   * the source is unfenced, and the old marker may still be on its way to the target.
   */
  fenceMarker: string | null;
  /** Wall-clock ms when the current wave's fence began (kept in the record: survives a kill). */
  fenceStartedAtMs: number | null;
  writeBlockedMs: number | null;
  rowsVerified: bigint;
  verification: VerifyResult | null;
  methods: Map<string, 'record' | 'text'> | null;
  refreshed: string[];
  /** The current wave's verification begun before its fence (this process only; see tail.ts). */
  pre: { readonly wave: number; readonly verification: PreVerification } | null;
}

// A wave's pause grows with the shards fenced and verified together: measured (docs/benchmarks.md,
// move-batch) 1.6-2.2 s for a 64-shard wave on a loaded machine. 16 trades a few more catch-up round
// trips for a quarter of that.
const DEFAULT_WAVE = { maxShards: 16, maxRows: 500_000 };

/**
 * Splits a batch into cut-over waves: consecutive shards while a wave has at most maxShards shards
 * and maxRows estimated rows (a shard over the limit goes alone). Verification runs while a wave is
 * fenced, so rows are what makes a wave's pause long.
 */
export function planWaves(shards: readonly number[], rows: ReadonlyMap<number, number>, limits: WaveLimits = {}): number[][] {
  const maxShards = limits.maxShards ?? DEFAULT_WAVE.maxShards;
  const maxRows = limits.maxRows ?? DEFAULT_WAVE.maxRows;
  const waves: number[][] = [];
  let current: number[] = [];
  let currentRows = 0;
  for (const shard of shards) {
    const r = rows.get(shard) ?? 0;
    if (current.length > 0 && (current.length >= maxShards || currentRows + r > maxRows)) {
      waves.push(current);
      current = [];
      currentRows = 0;
    }
    current.push(shard);
    currentRows += r;
  }
  if (current.length > 0) waves.push(current);
  return waves;
}

export function moveContext(
  config: ShardctlConfig,
  record: Pick<MoveRecord, 'moveId' | 'mode' | 'shards' | 'detail'>,
  sides: { source: Side; target: Side },
  migrations: readonly MigrationFile[],
  options: MoveOptions,
): MoveContext {
  const detail = record.detail;
  const waves = Array.isArray(detail['waves']) ? (detail['waves'] as number[][]) : [[...record.shards]];
  return {
    config,
    moveId: record.moveId,
    mode: record.mode,
    source: sides.source,
    target: sides.target,
    shards: record.shards,
    migrations,
    options,
    name: replicationName(record.moveId),
    waves: record.mode === 'online' ? waves : [[...record.shards]],
    wave: record.mode === 'online' && typeof detail['wave'] === 'number' ? detail['wave'] : 0,
    fenceMarker: typeof detail['fenceMarker'] === 'string' ? detail['fenceMarker'] : null,
    fenceStartedAtMs: typeof detail['fenceStartedAtMs'] === 'number' ? detail['fenceStartedAtMs'] : null,
    writeBlockedMs: typeof detail['writeBlockedMs'] === 'number' ? detail['writeBlockedMs'] : null,
    rowsVerified: typeof detail['rowsVerified'] === 'string' ? BigInt(detail['rowsVerified']) : 0n,
    verification: null,
    methods: null,
    refreshed: [],
    pre: null,
  };
}

export function moveResult(ctx: MoveContext, outcome: MoveResult['outcome'], checks: readonly PreflightCheck[], started: number): MoveResult {
  return {
    moveId: ctx.moveId,
    shards: ctx.shards,
    shard: ctx.shards[0]!,
    source: ctx.source.host.name,
    target: ctx.target.host.name,
    mode: ctx.mode,
    outcome,
    preflight: checks,
    plan: stepsFor(ctx.mode),
    waves: ctx.waves,
    rowsMoved: ctx.rowsVerified.toString(),
    writeBlockedMs: ctx.writeBlockedMs,
    durationMs: elapsed(started),
    verification: ctx.verification,
    materializedViews: ctx.refreshed,
  };
}

/** What the record keeps of the context, so a resumed run goes on where this one stopped. */
function progress(ctx: MoveContext): Record<string, unknown> {
  return {
    wave: ctx.wave,
    rowsVerified: ctx.rowsVerified.toString(),
    writeBlockedMs: ctx.writeBlockedMs,
    fenceMarker: ctx.fenceMarker,
    fenceStartedAtMs: ctx.fenceStartedAtMs,
  };
}

/** Runs the steps after `after`; online, the cut-over steps once per wave. */
export async function runSteps(ctx: MoveContext, after: MoveStep): Promise<void> {
  const steps = stepsFor(ctx.mode);
  if (after === 'switched' && ctx.wave < ctx.waves.length - 1) {
    // Killed between a wave's switch and the next wave's start.
    await nextWave(ctx);
    after = 'synced';
  }
  let next = steps.indexOf(after) + 1;
  while (next < steps.length) {
    const step = steps[next]!;
    try {
      await STEP_ACTIONS[step](ctx);
    } catch (error) {
      await dropPreVerification(ctx);
      if (error instanceof ShardctlError) throw error;
      throw new HostError(
        errorHost(error) ?? ctx.source.host.name,
        `move ${ctx.moveId} failed at step ${step}: ${describePgError(error)}; run move-shard ${formatShardList(ctx.shards)} --resume to retry, or --abort to undo`,
        { shard: ctx.shards[0]!, code: 'MOVE_FAILED', cause: error, data: { moveId: ctx.moveId, step, shards: ctx.shards } },
      );
    }
    if (step === 'switched' && ctx.wave < ctx.waves.length - 1) {
      await record(ctx, step, 'running');
      await nextWave(ctx);
      next = steps.indexOf('synced') + 1;
      continue;
    }
    await record(ctx, step, step === 'cleaned' ? 'done' : 'running');
    next += 1;
  }
}

/** The next wave starts from the fence: recorded back at `synced`, with its number. */
async function nextWave(ctx: MoveContext): Promise<void> {
  ctx.wave += 1;
  ctx.fenceMarker = null;
  ctx.fenceStartedAtMs = null;
  await record(ctx, 'synced', 'running', { quiet: true });
}

export async function record(ctx: MoveContext, step: MoveStep, status: MoveRecord['status'], options: { quiet?: boolean } = {}): Promise<void> {
  const detail = progress(ctx);
  await recordStep(ctx.source.client, ctx.moveId, step, status, detail);
  await recordStep(ctx.target.client, ctx.moveId, step, status, detail);
  // Going back to `synced` for the next wave is no step completing: no announcement, no fault point.
  if (options.quiet) return;
  const wave = ctx.waves.length > 1 && ['fenced', 'caught-up', 'sequences-carried', 'verified', 'switched'].includes(step) ? ` (wave ${ctx.wave + 1} of ${ctx.waves.length})` : '';
  announce(ctx, step, status === 'aborted' ? 'aborted' : `done: ${step}${wave}`);
  // An abort re-records the step it undid: that is no step completing.
  if (status !== 'aborted') faultAfter(step);
}

type StepAction = (ctx: MoveContext) => Promise<void>;

const STEP_ACTIONS: Record<MoveStep, StepAction> = {
  prepared: async () => undefined,
  'target-created': createTargets,
  published: publish,
  subscribed: subscribe,
  synced: waitForSync,
  fenced: fence,
  'caught-up': waitForCatchUp,
  copied: (ctx) => (ctx.mode === 'online' ? copyFromSnapshot(ctx) : copyShards(ctx, ctx.shards)),
  'sequences-carried': carrySequences,
  verified: verify,
  switched: switchMap,
  cleaned: cleanUp,
};

function schemasOf(ctx: MoveContext, shards: readonly number[]): string[] {
  return shards.map((s) => shardSchemaName(ctx.config, s));
}

function waveShards(ctx: MoveContext): readonly number[] {
  return ctx.waves[ctx.wave] ?? ctx.shards;
}

function concurrency(ctx: MoveContext, items: number): number {
  return Math.max(1, Math.min(ctx.options.concurrency ?? ctx.config.concurrency, items));
}

/** Runs fn over items with `workers` worker connections to `host`, each item on one of them. */
async function withWorkers<T>(
  ctx: MoveContext,
  side: Side,
  items: readonly T[],
  fn: (client: pg.Client, item: T) => Promise<void>,
): Promise<void> {
  let next = 0;
  let failed: unknown = null;
  const worker = async (): Promise<void> => {
    const client = await openWorker(side.host, 'shardctl move worker');
    try {
      while (failed === null && next < items.length) await fn(client, items[next++]!);
    } catch (error) {
      failed ??= error;
    } finally {
      await client.end().catch(() => undefined);
    }
  };
  await Promise.all(Array.from({ length: concurrency(ctx, items.length) }, worker));
  if (failed !== null) throw failed;
}

/** Every shard's schema on the target, at the source's migration level for that shard, marked incoming. */
async function createTargets(ctx: MoveContext): Promise<void> {
  const { source, target, config } = ctx;
  const schemas = schemasOf(ctx, ctx.shards);
  const [applied, existing, done] = await Promise.all([
    source.client.query<{ shard: number; version: number }>(`SELECT shard, version FROM ${CONTROL}.migrations WHERE shard = ANY($1) ORDER BY version`, [ctx.shards]),
    target.client.query<{ nspname: string }>(`SELECT nspname FROM pg_namespace WHERE nspname = ANY($1)`, [schemas]),
    target.client.query<{ shard: number; version: number }>(`SELECT shard, version FROM ${CONTROL}.migrations WHERE shard = ANY($1)`, [ctx.shards]),
  ]);
  const files = new Map(ctx.migrations.map((m) => [m.version, m]));
  const exists = new Set(existing.rows.map((r) => r.nspname));
  const have = new Set(done.rows.map((r) => `${r.shard}:${r.version}`));
  const work = ctx.shards.map((shard) => {
    const statements: string[] = [];
    if (!exists.has(shardSchemaName(config, shard))) statements.push(createShardSql(config, shard, true, 'incoming'));
    for (const { version } of applied.rows.filter((r) => r.shard === shard)) {
      if (have.has(`${shard}:${version}`)) continue;
      const file = files.get(version);
      if (!file) {
        throw new HostError(source.host.name, `migration version ${version} is applied but has no file; restore it and --resume`, { shard, code: 'MIGRATION_DRIFT' });
      }
      if (file.noTransaction) statements.push(...noTransactionMigrationSteps(config, shard, file));
      else statements.push(migrationSql(config, shard, file));
    }
    return { shard, statements };
  });
  const pending = work.filter((w) => w.statements.length > 0);
  await withWorkers(ctx, target, pending, async (client, { shard, statements }) => {
    // Whole transactions, one round trip when they can share one; no-transaction steps alone.
    const batch: string[] = [];
    const flush = async (): Promise<void> => {
      if (batch.length > 0) await client.query(batch.splice(0).join('\n'));
    };
    try {
      for (const sql of statements) {
        if (sql.startsWith('BEGIN;')) batch.push(sql);
        else {
          await flush();
          await client.query(sql);
        }
      }
      await flush();
    } catch (error) {
      await client.query('ROLLBACK').catch(() => undefined);
      throw new HostError(target.host.name, `cannot create the target copy: ${describePgError(error)}`, { shard, code: 'MOVE_FAILED', cause: error });
    }
  });
}

async function publish(ctx: MoveContext): Promise<void> {
  const exists = await ctx.source.client.query(`SELECT 1 FROM pg_publication WHERE pubname = $1`, [ctx.name]);
  if (exists.rowCount) return;
  // The marker table rides along (only this move's rows): see waitForCatchUp.
  await ctx.source.client.query(createPublicationSql(ctx.name, schemasOf(ctx, ctx.shards), ctx.moveId));
}

async function subscribe(ctx: MoveContext): Promise<void> {
  const exists = await ctx.target.client.query(`SELECT 1 FROM pg_subscription WHERE subname = $1`, [ctx.name]);
  if (exists.rowCount) return;
  const tables = await shardTables(ctx.source.client, schemasOf(ctx, ctx.shards), 'leaves');
  // Binary replication carries type OIDs in arrays and records, and reg* values as raw OIDs.
  const binary = sameMajorVersion(ctx) && tables.every((t) => t.portable);
  await ctx.target.client.query(createSubscriptionSql(ctx.name, ctx.source.host.replicationUrl, binary));
}

/**
 * Online copy: a logical slot created with an exported snapshot, and every table of every shard
 * copied as of that snapshot, so the subscription created next streams exactly the changes after
 * the copy. Measured faster than the subscription's own initial copy (PostgreSQL 15: 1.2-1.4 s vs
 * 1.8 s for a million rows). A slot left by an interrupted copy lost its snapshot with its
 * connection: dropped, copied again.
 */
async function copyFromSnapshot(ctx: MoveContext): Promise<void> {
  await dropMoveSlot(ctx);
  // node-postgres supports replication connections; its type definitions do not list the option.
  const config: pg.ClientConfig & { replication: string } = {
    connectionString: ctx.source.host.url,
    replication: 'database',
    application_name: 'shardctl move',
  };
  const replication = new pg.Client(config);
  replication.on('error', () => undefined);
  try {
    await replication.connect();
    await checkClientConnection(replication);
  } catch (error) {
    throw new HostError(ctx.source.host.name, `cannot open a replication connection: ${describePgError(error)}`, { shard: ctx.shards[0]!, code: 'MOVE_FAILED' });
  }
  try {
    const snapshot = await createSlotWatched(ctx, replication);
    await copyShards(ctx, ctx.shards, snapshot);
  } finally {
    await replication.end().catch(() => undefined);
  }
}

/**
 * Creating a logical slot waits for every transaction that holds a transaction id on the source
 * server, in any database. Says which ones every few seconds, and gives up after waitTimeoutMs
 * (the step is not recorded: --resume tries again).
 */
async function createSlotWatched(ctx: MoveContext, replication: pg.Client): Promise<string> {
  const pid = Number((await replication.query<{ pid: number }>('SELECT pg_backend_pid() AS pid')).rows[0]!.pid);
  const limit = ctx.options.waitTimeoutMs ?? 300_000;
  const started = performance.now();
  let done = false;
  const creating = replication.query<{ snapshot_name: string }>(createSlotCommand(ctx.name)).finally(() => (done = true));
  creating.catch(() => undefined);
  let blockers = '';
  while (!done) {
    await Promise.race([creating.then(() => undefined, () => undefined), sleep(2000)]);
    if (done) break;
    blockers = await xidHolders(ctx.source.client, pid);
    const waited = Math.round((performance.now() - started) / 1000);
    if (performance.now() - started > limit) {
      await ctx.source.client.query('SELECT pg_terminate_backend($1)', [pid]).catch(() => undefined);
      await creating.catch(() => undefined);
      throw new HostError(
        ctx.source.host.name,
        `creating the replication slot waited ${waited} s for transactions to finish (${blockers || 'none visible any more'}); ` +
          `nothing is fenced. End or commit them and run move-shard ${formatShardList(ctx.shards)} --resume, or --abort`,
        { shard: ctx.shards[0]!, code: 'SLOT_WAIT_TIMEOUT' },
      );
    }
    notice(ctx, `host ${ctx.source.host.name}: creating the replication slot waits for open transactions to finish (${waited} s): ${blockers || 'none visible'}`);
  }
  try {
    return (await creating).rows[0]!.snapshot_name;
  } catch (error) {
    throw new HostError(ctx.source.host.name, `cannot create the replication slot: ${describePgError(error)}`, { shard: ctx.shards[0]!, code: 'MOVE_FAILED', cause: error });
  }
}

/** The transactions holding a transaction id on the server (any database), oldest first. */
async function xidHolders(client: pg.Client, except: number): Promise<string> {
  const result = await client.query<{ pid: number; datname: string | null; application_name: string; age: number; query: string }>(
    `SELECT pid, datname, application_name, extract(epoch FROM now() - xact_start)::int AS age, left(query, 80) AS query
       FROM pg_stat_activity
      WHERE (backend_xid IS NOT NULL OR backend_xmin IS NOT NULL) AND pid <> pg_backend_pid() AND pid <> $1 AND backend_type = 'client backend'
      ORDER BY xact_start LIMIT 3`,
    [except],
  );
  return result.rows
    .map((r) => `pid ${r.pid} (database ${r.datname ?? '?'}, ${r.application_name || 'no application name'}, open ${r.age} s: ${JSON.stringify(r.query)})`)
    .join('; ');
}

/**
 * Copies every table of the shards, each shard in one target transaction after a TRUNCATE (a retried
 * copy starts clean, and a migration's seed rows give way to the source's), shards spread over
 * `concurrency` pairs of connections. Online the source side reads the slot's snapshot; offline the
 * source is fenced. Binary COPY only for tables whose types travel in binary (ShardTable.portable)
 * between equal majors. Tables of at least INDEXES_AFTER_BYTES on the source are loaded without
 * their indexes, which are built again after the COPY in the same transaction (see copyShard).
 */
async function copyShards(ctx: MoveContext, shards: readonly number[], snapshot?: string): Promise<void> {
  const { source, target } = ctx;
  const schemas = schemasOf(ctx, shards);
  const tables = await shardTables(source.client, schemas, 'leaves');
  const sameMajor = sameMajorVersion(ctx);
  const large = await largeTables(source.client, schemas);
  const byShard = shards.map((shard) => ({ shard, tables: tables.filter((t) => t.schema === shardSchemaName(ctx.config, shard)) }));
  let next = 0;
  let failed: unknown = null;
  const worker = async (): Promise<void> => {
    let reader: pg.Client | null = null;
    let writer: pg.Client | null = null;
    try {
      reader = await openWorker(source.host, 'shardctl move copy');
      writer = await openWorker(target.host, 'shardctl move copy');
      await reader.query('BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY');
      if (snapshot) await reader.query(`SET TRANSACTION SNAPSHOT '${snapshot.replaceAll("'", "''")}'`);
      while (failed === null && next < byShard.length) {
        const { shard, tables: shardTablesToCopy } = byShard[next++]!;
        try {
          await copyShard(writer, reader, shardTablesToCopy, sameMajor, large);
        } catch (error) {
          await writer.query('ROLLBACK').catch(() => undefined);
          throw new HostError(errorHost(error) ?? target.host.name, `copy failed: ${describePgError(error)}`, { shard, code: 'MOVE_FAILED', cause: error });
        }
      }
      await reader.query('COMMIT');
    } catch (error) {
      failed ??= error;
    } finally {
      await reader?.end().catch(() => undefined);
      await writer?.end().catch(() => undefined);
    }
  };
  await Promise.all(Array.from({ length: concurrency(ctx, byShard.length) }, worker));
  if (failed !== null) throw failed;
}

/**
 * From this size on the source, a table is loaded without its indexes and they are built after the
 * COPY (one sort per index instead of one insertion per row and index). Below it, dropping and
 * creating them costs more than it saves (bench/move-batch.js, docs/benchmarks.md).
 */
export const INDEXES_AFTER_BYTES = 4 * 1024 * 1024;

/** The tables of these schemas (schema.table, quoted) of at least INDEXES_AFTER_BYTES on the source. */
async function largeTables(source: pg.Client, schemas: readonly string[]): Promise<Set<string>> {
  const result = await source.query<{ schema: string; table: string }>(
    `SELECT n.nspname AS schema, c.relname AS table FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
      WHERE n.nspname = ANY($1::text[]) AND c.relkind = 'r' AND pg_relation_size(c.oid) >= $2`,
    [schemas, INDEXES_AFTER_BYTES],
  );
  return new Set(result.rows.map((r) => qualified(r.schema, r.table)));
}

/** pg-copy-streams is loaded by the first copy, not by every command that loads the library. */
async function copyStreams(): Promise<typeof copyStreamsModule> {
  return (await import('pg-copy-streams')).default;
}

async function copyShard(writer: pg.Client, reader: pg.Client, tables: readonly ShardTable[], sameMajor: boolean, large: ReadonlySet<string>): Promise<void> {
  const { to, from } = await copyStreams();
  await writer.query('BEGIN');
  // Foreign keys between the shard's tables must not depend on the copy order (superusers only).
  await writer.query('SAVEPOINT replica_role');
  await writer.query('SET LOCAL session_replication_role = replica').catch(() => writer.query('ROLLBACK TO SAVEPOINT replica_role'));
  if (tables.length > 0) await writer.query(`TRUNCATE ${tables.map((t) => qualified(t.schema, t.table)).join(', ')}`);
  const rebuild = await dropIndexesForCopy(writer, tables.map((t) => qualified(t.schema, t.table)).filter((name) => large.has(name)));
  for (const t of tables) {
    const name = qualified(t.schema, t.table);
    const format = sameMajor && t.portable ? ' (FORMAT binary)' : '';
    const out = reader.query(to(`COPY ${name} TO STDOUT${format}`));
    const into = writer.query(from(`COPY ${name} FROM STDIN${format}`));
    await pipeline(out, into);
  }
  for (const sql of rebuild) await writer.query(sql);
  await writer.query('COMMIT');
}

/**
 * Drops the indexes of the (just truncated) tables that can be built again exactly from their
 * definition, in the copy's transaction, and returns the statements that build them again: a crash
 * or an error before COMMIT leaves every table as it was. Plain indexes and the indexes of primary
 * key, unique and exclusion constraints (pg_get_indexdef / pg_get_constraintdef), in their order of
 * creation. Only on tables the mover may alter (it owns them, as it created them). Left in place,
 * because recreating them would lose something or is not allowed: indexes
 * and constraints anything depends on (a foreign key referencing the key), inherited from a
 * partitioned parent, invalid, the replica identity or clustering index, outside the default
 * tablespace, with a comment, security label or column statistics target.
 */
async function dropIndexesForCopy(writer: pg.Client, tables: readonly string[]): Promise<string[]> {
  if (tables.length === 0) return [];
  const result = await writer.query<{ index_name: string; table_name: string; conname: string | null; indexdef: string; condef: string | null }>(
    `SELECT format('%I.%I', n.nspname, ic.relname) AS index_name, format('%I.%I', n.nspname, t.relname) AS table_name,
            c.conname, pg_get_indexdef(i.indexrelid) AS indexdef, CASE WHEN c.oid IS NOT NULL THEN pg_get_constraintdef(c.oid) END AS condef
       FROM pg_index i
       JOIN pg_class ic ON ic.oid = i.indexrelid
       JOIN pg_class t ON t.oid = i.indrelid
       JOIN pg_namespace n ON n.oid = t.relnamespace
       LEFT JOIN pg_constraint c ON c.conindid = i.indexrelid AND c.conrelid = i.indrelid AND c.contype IN ('p', 'u', 'x')
      WHERE t.oid = ANY($1::text[]::regclass[])
        AND pg_has_role(t.relowner, 'USAGE')
        AND i.indisvalid AND i.indisready AND i.indislive AND NOT i.indisreplident AND NOT i.indisclustered
        AND ic.reltablespace = 0
        AND NOT EXISTS (SELECT 1 FROM pg_inherits h WHERE h.inhrelid = i.indexrelid)
        AND (c.oid IS NULL OR c.conparentid = 0)
        AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.refclassid = 'pg_class'::regclass AND d.refobjid = i.indexrelid)
        AND (c.oid IS NULL OR NOT EXISTS (
              SELECT 1 FROM pg_depend d WHERE d.refclassid = 'pg_constraint'::regclass AND d.refobjid = c.oid
                 AND NOT (d.classid = 'pg_class'::regclass AND d.objid = i.indexrelid)))
        AND NOT EXISTS (SELECT 1 FROM pg_description x
                         WHERE (x.classoid = 'pg_class'::regclass AND x.objoid = i.indexrelid) OR (x.classoid = 'pg_constraint'::regclass AND x.objoid = c.oid))
        AND NOT EXISTS (SELECT 1 FROM pg_seclabel x
                         WHERE (x.classoid = 'pg_class'::regclass AND x.objoid = i.indexrelid) OR (x.classoid = 'pg_constraint'::regclass AND x.objoid = c.oid))
        AND NOT EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = i.indexrelid AND a.attstattarget > 0)
      ORDER BY i.indexrelid`,
    [tables],
  );
  if (result.rows.length === 0) return [];
  const drop = result.rows.map((r) => (r.conname !== null ? `ALTER TABLE ${r.table_name} DROP CONSTRAINT ${quoteIdent(r.conname)};` : `DROP INDEX ${r.index_name};`));
  await writer.query(drop.join('\n'));
  return result.rows.map((r) => (r.conname !== null ? `ALTER TABLE ONLY ${r.table_name} ADD CONSTRAINT ${quoteIdent(r.conname)} ${r.condef}` : r.indexdef));
}

/** Every table streaming; then one marker round trip, so the cut-over starts nearly caught up. */
async function waitForSync(ctx: MoveContext): Promise<void> {
  const errors = async (): Promise<number> => {
    const r = await ctx.target.client.query<{ n: string }>(
      `SELECT coalesce(sum(sync_error_count + apply_error_count), 0)::text AS n FROM pg_stat_subscription_stats WHERE subname = $1`,
      [ctx.name],
    );
    return Number(r.rows[0]?.n ?? 0);
  };
  const baseline = await errors();
  const limit = ctx.options.waitTimeoutMs ?? 300_000;
  const started = performance.now();
  let told = started;
  for (;;) {
    // The subscription retries a failed apply for ever; three failures in a row stop the move instead.
    const failures = (await errors()) - baseline;
    if (failures >= 3) {
      throw new HostError(
        ctx.target.host.name,
        `applying the replicated changes failed ${failures} times (the reason is in that host's server log); ` +
          `fix it and run move-shard ${formatShardList(ctx.shards)} --resume, or --abort to undo the move`,
        { shard: ctx.shards[0]!, code: 'SYNC_FAILED' },
      );
    }
    const r = await ctx.target.client.query<{ total: string; pending: string }>(
      `SELECT count(*) AS total, count(*) FILTER (WHERE r.srsubstate <> 'r') AS pending
         FROM pg_subscription_rel r JOIN pg_subscription s ON s.oid = r.srsubid WHERE s.subname = $1`,
      [ctx.name],
    );
    const { total, pending } = r.rows[0]!;
    if (Number(total) > 0 && Number(pending) === 0) break;
    if (performance.now() - started > limit) {
      throw new HostError(ctx.target.host.name, `${pending} of ${total} tables are still not streaming after ${Math.round(limit / 1000)} s; nothing is fenced. Run --resume to wait again, or --abort`, {
        shard: ctx.shards[0]!,
        code: 'SYNC_TIMEOUT',
      });
    }
    if (performance.now() - told > 5000) {
      told = performance.now();
      notice(ctx, `host ${ctx.target.host.name}: waiting for the subscription: ${pending} of ${total} tables not streaming yet`);
    }
    await sleep(50);
  }
  await ctx.source.client.query(insertMarkerSql(ctx.moveId, 'synced'));
  await waitForMarker(ctx, 'synced', limit, true);
  // Checksum methods are chosen now, while nothing is fenced.
  await ensureMethods(ctx);
}

async function ensureMethods(ctx: MoveContext): Promise<Map<string, 'record' | 'text'>> {
  if (!ctx.methods) {
    const tables = await shardTables(ctx.source.client, schemasOf(ctx, ctx.shards));
    ctx.methods = await hashMethods(ctx.source.client, tables, Math.min(ctx.source.serverVersionNum, ctx.target.serverVersionNum) >= 140000);
  }
  return ctx.methods;
}

/**
 * The fence of the current wave: each shard fenced in its own short transaction (fenceSql), retried
 * while application transactions hold its tables, and reported; then the wave's marker. If the
 * fence cannot be had within fenceTimeoutMs, the wave is unfenced again and the move stops, resumable.
 */
async function fence(ctx: MoveContext): Promise<void> {
  const { source } = ctx;
  const shards = waveShards(ctx);
  const schemas = schemasOf(ctx, shards);
  const tables = await shardTables(source.client, schemas, 'all');
  const deadlock = await source.client.query<{ ms: string }>(`SELECT setting AS ms FROM pg_settings WHERE name = 'deadlock_timeout'`);
  // Below half the deadlock timeout, so the fence always gives up first (see fenceSql).
  const lockWaitMs = Math.max(20, Math.min(500, Number(deadlock.rows[0]?.ms ?? 1000) / 2));
  const limit = ctx.options.fenceTimeoutMs ?? 30_000;
  const fenced = new Set(
    (await source.client.query<{ shard: number }>(`SELECT shard FROM ${CONTROL}.shards WHERE shard = ANY($1) AND state = 'fenced'`, [shards])).rows.map((r) => r.shard),
  );
  if (fenced.size === 0 && ctx.pre?.wave !== ctx.wave) await startPreVerification(ctx, schemas);
  const started = performance.now();
  if (ctx.fenceStartedAtMs === null) {
    // Kept in the record before the first shard is fenced: a resumed run counts this run's fence too.
    ctx.fenceStartedAtMs = Date.now();
    await source.client.query(`UPDATE ${CONTROL}.moves SET detail = detail || jsonb_build_object('fenceStartedAtMs', $2::bigint) WHERE move_id = $1`, [
      ctx.moveId,
      ctx.fenceStartedAtMs,
    ]);
  }
  let attempts = 0;
  let told = started;
  for (const shard of shards) {
    if (fenced.has(shard)) continue;
    const schema = shardSchemaName(ctx.config, shard);
    const sql = fenceSql({
      shard,
      tables: tables.filter((t) => t.schema === schema).map((t) => [t.schema, t.table] as const),
      targetHost: ctx.target.host.name,
      lockWaitMs,
      createOrReplaceTrigger: source.serverVersionNum >= 140000,
    });
    for (;;) {
      attempts += 1;
      try {
        await source.client.query(sql);
        break;
      } catch (error) {
        await source.client.query('ROLLBACK').catch(() => undefined);
        const code = (error as { code?: string }).code;
        // Lock wait over, statement timeout, or (should the server's settings differ) a deadlock this
        // transaction lost: the application went on; try again.
        if (code !== '55P03' && code !== '57014' && code !== '40P01') throw error;
      }
      const waited = performance.now() - started;
      if (waited > limit) {
        const holders = await lockHolders(source.client, schema).catch(() => '');
        await unfence(ctx, shards);
        ctx.fenceStartedAtMs = null;
        throw new HostError(
          source.host.name,
          `could not fence within ${Math.round(limit / 1000)} s (${attempts} attempts): application transactions kept the tables of ${schema} busy` +
            `${holders ? ` (${holders})` : ''}. The source is writable again; run move-shard ${formatShardList(ctx.shards)} --resume to retry, or --abort`,
          { shard, code: 'FENCE_TIMEOUT' },
        );
      }
      if (performance.now() - told > 2000) {
        told = performance.now();
        notice(ctx, `host ${source.host.name}, shard ${shard}: fence attempt ${attempts} waits for ${(await lockHolders(source.client, schema).catch(() => '')) || 'busy tables'}`);
      }
      await sleep(10 + Math.random() * 40);
    }
  }
  if (attempts > shards.length) notice(ctx, `host ${source.host.name}: fenced ${shards.length} shard${shards.length === 1 ? '' : 's'} in ${attempts} attempts (tables were busy)`);
  const marker = `fenced-${Date.now().toString(36)}-${ctx.wave}`;
  await source.client.query(fenceMarkerSql(ctx.moveId, marker, ctx.fenceStartedAtMs));
  ctx.fenceMarker = marker;
}

/**
 * The first part of the wave's verification, while the source is still writable (see tail.ts):
 * tracking on the target, then a snapshot of every keyed table on both hosts, kept open until the
 * wave is verified. Best effort: if it cannot be had, the wave is verified whole while fenced.
 */
async function startPreVerification(ctx: MoveContext, schemas: readonly string[]): Promise<void> {
  await dropPreVerification(ctx);
  if (ctx.mode !== 'online') return;
  let held: pg.Client[] = [];
  try {
    const keyed = await keyedTables(ctx.source.client, schemas);
    if (keyed.length === 0) return;
    const methods = await ensureMethods(ctx);
    await ctx.target.client.query(startTrackingSql(ctx.moveId, keyed));
    held = await Promise.all([openWorker(ctx.source.host, 'shardctl move verify'), openWorker(ctx.target.host, 'shardctl move verify')]);
    const started = performance.now();
    const verification = await preVerify(held[0]!, held[1]!, keyed, methods);
    ctx.pre = { wave: ctx.wave, verification };
    notice(ctx, `host ${ctx.target.host.name}: ${keyed.length} table${keyed.length === 1 ? '' : 's'} of wave ${ctx.wave + 1} checksummed before the fence in ${Math.round(performance.now() - started)} ms; while fenced only their changed rows are compared`);
  } catch (error) {
    await Promise.all(held.map((c) => c.end().catch(() => undefined)));
    await stopTracking(ctx.target.client, ctx.moveId, schemas).catch(() => undefined);
    notice(ctx, `host ${ctx.target.host.name}: no verification before the fence (${describePgError(error)}); every table of the wave is checksummed while fenced`);
  }
}

async function dropPreVerification(ctx: MoveContext): Promise<void> {
  const pre = ctx.pre;
  ctx.pre = null;
  if (pre) await endPreVerification(pre.verification);
}

/** Who holds locks on a schema's tables: pid, application, transaction age and query. */
async function lockHolders(client: pg.Client, schema: string): Promise<string> {
  const result = await client.query<{ pid: number; application_name: string; age: number | null; relname: string; query: string }>(
    `SELECT DISTINCT ON (a.pid) a.pid, a.application_name, extract(epoch FROM now() - a.xact_start)::int AS age, c.relname, left(a.query, 80) AS query
       FROM pg_locks l JOIN pg_class c ON c.oid = l.relation JOIN pg_stat_activity a ON a.pid = l.pid
      WHERE c.relnamespace = to_regnamespace($1) AND l.granted AND l.pid <> pg_backend_pid()
      ORDER BY a.pid LIMIT 3`,
    [schema],
  );
  return result.rows
    .map((r) => `${r.relname} held by pid ${r.pid} (${r.application_name || 'no application name'}, transaction open ${r.age ?? 0} s: ${JSON.stringify(r.query)})`)
    .join('; ');
}

/** Logical replication applies in commit order: once the fence marker is on the target, so is every earlier change. */
async function waitForCatchUp(ctx: MoveContext): Promise<void> {
  const limit = ctx.options.catchUpTimeoutMs ?? 30_000;
  try {
    // A move fenced before markers were per attempt used the plain kind 'fenced'.
    await waitForMarker(ctx, ctx.fenceMarker ?? 'fenced', limit);
  } catch (error) {
    // Do not keep the shards unwritable while the target is stuck: unfence and let the operator retry.
    await unfence(ctx, waveShards(ctx));
    ctx.fenceMarker = null;
    ctx.fenceStartedAtMs = null;
    await record(ctx, 'synced', 'running');
    throw new HostError(
      ctx.target.host.name,
      `the target did not apply the last changes within ${limit / 1000} s; the source was unfenced and is writable again. Run move-shard ${formatShardList(ctx.shards)} --resume to retry the cut-over, or --abort. (${(error as Error).message})`,
      { shard: waveShards(ctx)[0]!, code: 'CATCH_UP_TIMEOUT' },
    );
  }
}

async function waitForMarker(ctx: MoveContext, kind: string, timeoutMs: number, tell = false): Promise<void> {
  const started = performance.now();
  let told = started;
  for (;;) {
    const r = await ctx.target.client.query(`SELECT 1 FROM ${CONTROL}.move_markers WHERE move_id = $1 AND kind = $2`, [ctx.moveId, kind]);
    if (r.rowCount) return;
    if (performance.now() - started > timeoutMs) throw new Error(`marker ${kind} not replicated within ${timeoutMs} ms`);
    if (tell && performance.now() - told > 5000) {
      told = performance.now();
      const lag = await ctx.source.client
        .query<{ lag: string | null }>(`SELECT pg_size_pretty(pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)) AS lag FROM pg_replication_slots WHERE slot_name = $1`, [ctx.name])
        .then((q) => q.rows[0]?.lag ?? 'unknown', () => 'unknown');
      notice(ctx, `host ${ctx.target.host.name}: catching up with ${ctx.source.host.name} (${lag} of WAL behind, ${Math.round((performance.now() - started) / 1000)} s)`);
    }
    await sleep(10);
  }
}

/**
 * Logical replication does not carry sequences. Each target sequence is set to at least the
 * source's state (read from the sequence itself, so a setval(..., false) is carried as such): every
 * new id on the target is then greater than every id of the shard (the sequence holds next_id's
 * position, and ids grow with it).
 */
async function carrySequences(ctx: MoveContext): Promise<void> {
  const schemas = schemasOf(ctx, waveShards(ctx));
  const list = await ctx.source.client.query<{ schemaname: string; sequencename: string; increment_by: string }>(
    `SELECT schemaname, sequencename, increment_by::text FROM pg_sequences WHERE schemaname = ANY($1) ORDER BY 1, 2`,
    [schemas],
  );
  if (list.rows.length === 0) return;
  const sequences = list.rows.map((r) => [r.schemaname, r.sequencename] as const);
  const sql = readSequencesSql(sequences);
  const [src, dst] = await Promise.all([
    ctx.source.client.query<{ last_value: string; is_called: boolean }>(sql),
    ctx.target.client.query<{ last_value: string; is_called: boolean }>(sql),
  ]);
  const behind: SequenceValue[] = [];
  list.rows.forEach((row, i) => {
    const increment = BigInt(row.increment_by);
    const next = (r: { last_value: string; is_called: boolean }): bigint => BigInt(r.last_value) + (r.is_called ? increment : 0n);
    const s = src.rows[i]!;
    const d = dst.rows[i]!;
    // The value the target would hand out next must not come before the source's.
    const targetBehind = increment > 0n ? next(d) < next(s) : next(d) > next(s);
    if (targetBehind) behind.push({ schema: row.schemaname, name: row.sequencename, lastValue: BigInt(s.last_value), isCalled: s.is_called });
  });
  if (behind.length > 0) await ctx.target.client.query(setSequencesSql(behind));
}

async function verify(ctx: MoveContext): Promise<void> {
  const shards = waveShards(ctx);
  const schemas = schemasOf(ctx, shards);
  const methods = await ensureMethods(ctx);
  const pre = ctx.pre?.wave === ctx.wave ? ctx.pre.verification : null;
  let result: VerifyResult;
  try {
    const tail = pre ? { pre, changes: await readChanges(ctx.target.client, ctx.moveId) } : undefined;
    result = await verifyShards(ctx.source.client, ctx.target.client, schemas, methods, tail);
  } finally {
    await dropPreVerification(ctx);
  }
  // Still fenced: the tracking triggers go before the wave's copies take application writes.
  await stopTracking(ctx.target.client, ctx.moveId, schemas);
  const before = ctx.verification;
  ctx.verification = before
    ? {
        ok: before.ok && result.ok,
        rows: before.rows + result.rows,
        tables: [...before.tables, ...result.tables],
        mismatches: [...before.mismatches, ...result.mismatches],
        byKey: { tables: before.byKey.tables + result.byKey.tables, keys: before.byKey.keys + result.byKey.keys },
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
    await abortMove(ctx, 'sequences-carried');
    throw new HostError(ctx.target.host.name, `verification failed, the move was aborted and the source on ${ctx.source.host.name} is writable again:\n${mismatches}`, {
      shard: shards[0]!,
      code: 'VERIFY_FAILED',
      data,
      details: result.mismatches,
    });
  }
  // Earlier waves are live on the target: this wave is unfenced and the move stops, resumable.
  await unfence(ctx, shards);
  ctx.fenceMarker = null;
  ctx.fenceStartedAtMs = null;
  await record(ctx, 'synced', 'running');
  throw new HostError(
    ctx.target.host.name,
    `verification failed; shards ${formatShardList(shards)} were unfenced and are writable on ${ctx.source.host.name} (earlier waves are already on ${ctx.target.host.name}); run --resume to retry this wave:\n${mismatches}`,
    { shard: shards[0]!, code: 'VERIFY_FAILED', data, details: result.mismatches },
  );
}

/** The map now says target for the wave: its copies become active, and the config file is rewritten in place. */
async function switchMap(ctx: MoveContext): Promise<void> {
  const shards = waveShards(ctx);
  await ctx.target.client.query(`UPDATE ${CONTROL}.shards SET state = 'active' WHERE shard = ANY($1)`, [shards]);
  const file = ctx.options.configFile ?? ctx.config.file;
  try {
    await rewriteShardOwner(file, shards, ctx.source.host.name, ctx.target.host.name);
  } catch (error) {
    throw new HostError(
      ctx.target.host.name,
      `the target ${shards.length === 1 ? 'copy of shard' : 'copies of shards'} ${formatShardList(shards)} ${shards.length === 1 ? 'is' : 'are'} active, but the map ${file} could not be rewritten: ${(error as Error).message}. ` +
        `Fix that and run move-shard ${formatShardList(ctx.shards)} --resume (the move can no longer be aborted)`,
      { shard: shards[0]!, code: 'MAP_REWRITE_FAILED', cause: error },
    );
  }
  if (ctx.fenceStartedAtMs !== null) ctx.writeBlockedMs = Math.max(ctx.writeBlockedMs ?? 0, Date.now() - ctx.fenceStartedAtMs);
}

/**
 * Replication objects removed; each old copy kept fenced under a new name until gc, or dropped;
 * materialized views refreshed on the target. What is left to do is decided by the source's control
 * rows, not by what schemas exist: after the rename a schema of views keeps the old name, so
 * existence cannot tell a finished clean-up from an interrupted one.
 */
async function cleanUp(ctx: MoveContext): Promise<void> {
  await dropReplication(ctx);
  const { source } = ctx;
  const rows = await source.client.query<{ shard: number; schema_name: string }>(`SELECT shard, schema_name FROM ${CONTROL}.shards WHERE shard = ANY($1)`, [ctx.shards]);
  const current = new Map(rows.rows.map((r) => [r.shard, r.schema_name]));
  for (const shard of ctx.shards) {
    const schema = shardSchemaName(ctx.config, shard);
    const now = current.get(shard);
    if (ctx.options.dropSource) {
      if (now !== undefined) await source.client.query(dropShardSql(shard, [now, schema]));
    } else if (now === schema) {
      await source.client.query(await renameWithStub(ctx, shard, oldCopyName(schema, ctx.moveId)));
    }
  }
  const views = await ctx.target.client.query<{ schemaname: string; matviewname: string }>(
    `SELECT schemaname, matviewname FROM pg_matviews WHERE schemaname = ANY($1) ORDER BY 1, 2`,
    [schemasOf(ctx, ctx.shards)],
  );
  for (const v of views.rows) {
    await ctx.target.client.query(refreshMaterializedViewSql(v.schemaname, v.matviewname));
    ctx.refreshed.push(`${v.schemaname}.${v.matviewname}`);
  }
  for (const side of [ctx.source, ctx.target]) {
    await side.client.query(`DELETE FROM ${CONTROL}.move_markers WHERE move_id = $1`, [ctx.moveId]);
  }
}

/** The SQL of the rename (see renameWithStubSql), with the grants read from the source's catalog. */
async function renameWithStub(ctx: MoveContext, shard: number, renamed: string): Promise<string> {
  const { source } = ctx;
  const schema = shardSchemaName(ctx.config, shard);
  const tables = (await shardTables(source.client, schema, 'all')).map((t) => t.table);
  const schemaGrants = await source.client.query<{ grantee: string | null; privilege: string }>(
    `SELECT r.rolname AS grantee, a.privilege_type AS privilege FROM pg_namespace n, aclexplode(n.nspacl) a
       LEFT JOIN pg_roles r ON r.oid = a.grantee WHERE n.nspname = $1 AND a.grantee <> n.nspowner`,
    [schema],
  );
  const tableGrants = await source.client.query<{ relname: string; grantee: string | null; privilege: string }>(
    `SELECT c.relname, r.rolname AS grantee, a.privilege_type AS privilege FROM pg_class c, aclexplode(c.relacl) a
       LEFT JOIN pg_roles r ON r.oid = a.grantee
      WHERE c.relnamespace = to_regnamespace($1) AND c.relkind IN ('r', 'p') AND a.grantee <> c.relowner`,
    [schema],
  );
  return renameWithStubSql({
    shard,
    schema,
    renamed,
    targetHost: ctx.target.host.name,
    tables,
    schemaGrants: schemaGrants.rows,
    tableGrants: tableGrants.rows,
  });
}

async function dropReplication(ctx: MoveContext): Promise<void> {
  const { source, target, name } = ctx;
  await dropSubscription(target.client, name);
  await source.client.query(dropPublicationSql(name));
  await dropMoveSlot(ctx);
}

/** Drops the move's slot on the source if it exists; a slot still held by a dying walsender is waited for. */
async function dropMoveSlot(ctx: MoveContext): Promise<void> {
  const { source, name } = ctx;
  if (await dropSlot(source.client, name)) return;
  throw new HostError(source.host.name, `replication slot ${name} could not be dropped; drop it with pg_drop_replication_slot`, {
    shard: ctx.shards[0]!,
    code: 'SLOT_LEFT',
  });
}

async function unfence(ctx: MoveContext, shards: readonly number[]): Promise<void> {
  const tables = await shardTables(ctx.source.client, schemasOf(ctx, shards), 'all');
  for (const shard of shards) {
    const schema = shardSchemaName(ctx.config, shard);
    const own = tables.filter((t) => t.schema === schema).map((t) => [t.schema, t.table] as const);
    await ctx.source.client.query(unfenceSql(shard, own, ctx.moveId));
  }
}

/**
 * Undoes a move that has not switched any shard: no subscription, publication or slot left behind,
 * the sources writable again, the target's copies dropped.
 */
export async function abortMove(ctx: MoveContext, step: MoveStep): Promise<void> {
  const steps = stepsFor(ctx.mode);
  const active = await ctx.target.client.query<{ shard: number }>(`SELECT shard FROM ${CONTROL}.shards WHERE shard = ANY($1) AND state = 'active'`, [ctx.shards]);
  // The switch activates the target's copies before it rewrites the map and records the step: a
  // run killed in between left active copies that the map may already name. Undoing the move then
  // would leave two writable copies.
  if (steps.indexOf(step) >= steps.indexOf('switched') || ctx.wave > 0 || (active.rowCount ?? 0) > 0) {
    const switched = active.rows.map((r) => r.shard);
    throw new HostError(
      ctx.target.host.name,
      `move ${ctx.moveId} already switched shard${switched.length === 1 ? '' : 's'} ${formatShardList(switched.length > 0 ? switched : ctx.shards)} to ${ctx.target.host.name}; it cannot be aborted. ` +
        `Run --resume to finish it, then move the shards back if needed.`,
      { shard: ctx.shards[0]!, code: 'MOVE_SWITCHED' },
    );
  }
  await dropPreVerification(ctx);
  await dropReplication(ctx);
  await unfence(ctx, ctx.shards);
  // Only copies this move created (incoming, never active: see above) are dropped.
  for (const shard of ctx.shards) await ctx.target.client.query(dropShardSql(shard, [shardSchemaName(ctx.config, shard)]));
  await stopTracking(ctx.target.client, ctx.moveId, schemasOf(ctx, ctx.shards));
  for (const side of [ctx.source, ctx.target]) {
    await side.client.query(`DELETE FROM ${CONTROL}.move_markers WHERE move_id = $1`, [ctx.moveId]);
  }
  await record(ctx, step, 'aborted');
}

export function announce(ctx: MoveContext, step: MoveStep, detail: string): void {
  ctx.options.onStep?.(step, detail);
}

function notice(ctx: MoveContext, message: string): void {
  ctx.options.onNotice?.(message);
}

/** Binary COPY and binary replication are safe only between equal major versions. */
function sameMajorVersion(ctx: MoveContext): boolean {
  return Math.floor(ctx.source.serverVersionNum / 10000) === Math.floor(ctx.target.serverVersionNum / 10000);
}

export function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

export function elapsed(started: number): number {
  return Math.round(performance.now() - started);
}

export function newMoveId(): string {
  return `${Date.now().toString(36)}${randomBytes(3).toString('hex')}`;
}
