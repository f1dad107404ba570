import type pg from 'pg';
import { elapsed } from '../clock.js';
import type { HostConfig, ShardctlConfig } from '../config/types.js';
import { shardSchemaName } from '../config/types.js';
import type { HostSession } from '../fleet/session.js';
import type { MigrationFile } from '../migrations/files.js';
import type { LeafTable, TypedShardTable } from './catalog.js';
import type { PreflightCheck } from './preflight.js';
import { type PrivilegeObject } from './privileges.js';
import { replicationName } from './sql/names.js';
import { stepsFor, type MoveMode, type MoveRecord, type MoveStep } from './state.js';
import type { CopyFigure, PreVerification, VerifyResult } from './verify.js';
import type { TableChanges } from './tail.js';
import type { WaveLimits } from './waves.js';
import type { CopyEstimate, MoveProgressEvent } from './copy-meter.js';

/**
 * A move's state while it runs (MoveContext), its options and result, and what every step asks of
 * the context (its schemas, its wave, its reporting). The waves are planned in waves.ts, the
 * progress recorded in progress.ts, the worker connections in workers.ts.
 */

export interface MoveOptions {
  readonly mode?: MoveMode;
  readonly dryRun?: boolean;
  readonly resume?: boolean;
  readonly abort?: boolean;
  /** With resume or abort: only these unfinished moves (by id), of those that carry the shards. */
  readonly moveIds?: readonly string[];
  /**
   * With resume or abort, a target (and a mode) the caller named: each move keeps the one it
   * recorded, so one that recorded another is refused (UsageError) before anything is written,
   * rather than the name dropped without a word.
   */
  readonly stated?: { readonly target?: string; readonly mode?: MoveMode };
  /** Drop the old copy right after the switch instead of keeping it (fenced, renamed) until gc. */
  readonly dropSource?: boolean;
  /** The config file to rewrite at the switch (default: config.file). */
  readonly configFile?: string;
  /** How long the target may take to apply the last changes after the fence (default 30 s; maxFencedMs bounds it too). */
  readonly catchUpTimeoutMs?: number;
  /** How long the fence keeps retrying while application transactions hold the tables (default 30 s). */
  readonly fenceTimeoutMs?: number;
  /**
   * The longest a shard may refuse writes in one run (default 20 s): from its wave's fence, every wait
   * of the cut-over (the other shards' fences, the catch-up, sequences, verification) must end
   * within it, or the wave is unfenced and the move stops, resumable, naming what it waited for.
   */
  readonly maxFencedMs?: number;
  /** How long to wait for the source (slot creation, replication catching up) before stopping (default 5 min). */
  readonly waitTimeoutMs?: number;
  /** Connections per host for creating the target shards and copying (default: the config's concurrency). */
  readonly concurrency?: number;
  /**
   * The caller already holds the runner lock on every host involved (rebalance holds them for its
   * whole run, so that its moves can share hosts), and has checked its config against the fleet; the
   * command then takes no lock and checks no file of its own. A dry run takes no lock anyway: there
   * it says only that the config was checked (rebalance's dry run of its planned moves).
   */
  readonly runnerLocksHeld?: boolean;
  /** Wave limits for the online cut-over (default 64 shards, 2,000,000 estimated rows). */
  readonly wave?: WaveLimits;
  readonly onStep?: (step: MoveStep, detail: string) => void;
  /** What a wait is waiting for, every few seconds; retries; anything a person should know. */
  readonly onNotice?: (message: string) => void;
  /** The copy's bytes, rows, rate and time left, and the catch-up's lag, as they change (copy-meter.ts). */
  readonly onProgress?: (event: MoveProgressEvent) => void;
  /** The most bytes a second each move's copy may stream (all its connections together); no bound when unset. */
  readonly maxRate?: number;
  /**
   * The most WAL the move's slot may hold on the source while the copy runs: past it the copy
   * pauses (and says so) until the slot holds less again. No bound when unset.
   */
  readonly maxSlotWal?: number;
  /**
   * Online: tables of more estimated rows than this (with a primary key) are copied in chunks of
   * about this many rows, each committed with its record, so a resumed copy goes on with the
   * chunks not copied yet (default 1,000,000; chunks.ts).
   */
  readonly copyChunkRows?: number;
  /** Online: connection pairs copying the chunks of large tables at once (default: the move's concurrency). */
  readonly copyParallel?: number;
  /**
   * Stops the run when aborted: a wave fenced and not yet switched is released first (writable
   * again, the move left at `synced` for --resume or --abort); a wave not fenced is stopped before
   * its next step. The run then fails with code INTERRUPTED. Once a wave's switch is sent, that
   * wave is finished.
   */
  readonly signal?: AbortSignal;
}

/** Every key of MoveOptions, once (the compiler checks the record is whole): what moveShards and rebalance accept. */
export const MOVE_OPTION_FLAGS: { readonly [K in keyof Required<MoveOptions>]: true } = {
  signal: true,
  mode: true,
  dryRun: true,
  resume: true,
  abort: true,
  moveIds: true,
  stated: true,
  dropSource: true,
  configFile: true,
  catchUpTimeoutMs: true,
  fenceTimeoutMs: true,
  maxFencedMs: true,
  waitTimeoutMs: true,
  concurrency: true,
  runnerLocksHeld: true,
  wave: true,
  onStep: true,
  onNotice: true,
  onProgress: true,
  maxRate: true,
  maxSlotWal: true,
  copyChunkRows: true,
  copyParallel: true,
};

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
  /** Online: the longest a wave may refuse writes in one run before it is unfenced and the move stops (maxFencedMs). */
  readonly maxFencedMs: number | null;
  /** Rows verified on the target, over every wave, across resumes. Decimal string. */
  readonly rowsMoved: string;
  /**
   * The longest any shard of the batch refused writes: from its wave's fence until the fleet's placement named the
   * target. Includes a fence left by an interrupted run. Null when nothing was fenced.
   */
  readonly writeBlockedMs: number | null;
  readonly durationMs: number;
  /** The tables verified by this run (every wave it cut over). */
  readonly verification: VerifyResult | null;
  /** Materialized views refreshed on the target after the switch (`schema.view`). */
  readonly materializedViews: readonly string[];
  /**
   * Chunks of large tables this run copied, and chunks an earlier run copied that differed and were
   * copied again; of the chunks an earlier run copied, how many were settled from the source's
   * change log (nothing read) and how many by reading them on both hosts (docs/moves.md, step 4).
   */
  readonly chunks: {
    readonly copied: number;
    readonly recopied: number;
    readonly fromLog: number;
    readonly compared: number;
  };
  /** Dry run: each shard's size and the copy's estimated time (null otherwise). */
  readonly copyEstimate: CopyEstimate | null;
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
  /** The options' bounds with their defaults, resolved once here (settingsOf). */
  readonly settings: MoveSettings;
  readonly waves: readonly (readonly number[])[];
  /** The wave being cut over (online); 0 offline. Changed only with `current`, by beginWave. */
  wave: number;
  /** What this run knows of that wave: made when the wave starts, replaced by the next wave's. */
  current: WaveState;
  writeBlockedMs: number | null;
  rowsVerified: bigint;
  verification: VerifyResult | null;
  /** The checksum method of each table, chosen once (checksum-methods.ts). */
  methods: Map<string, 'record' | 'text'> | null;
  /** The source's leaf tables of all the move's shards with their column types, read once (checksum-methods.ts). */
  leafTables: Promise<readonly TypedShardTable[]> | null;
  /**
   * The source's owners and grants of the move's schemas as this run's preflight read them
   * (createTargets carries them instead of reading them again); null in a resumed run.
   */
  sourcePrivileges: readonly PrivilegeObject[] | null;
  /**
   * The move's shards that the target held before, whose incoming copies are guarded
   * (sql/incoming.ts, targets.ts heldBefore), read once per run; null until read.
   */
  guarded: ReadonlySet<number> | null;
  refreshed: string[];
  /**
   * Online: this run copied the shards together with creating the target's copies (createAndCopy),
   * so the `published` and `copied` steps have nothing left to do.
   */
  copied: boolean;
  /** The COPY stream's bytes a second this run's copy reached (kept in the record for dry runs' estimates). */
  copyBytesPerSecond: number | null;
  /** Chunks this run copied, and chunks an earlier run copied that this one copied again (they differed). */
  chunksCopied: number;
  chunksRecopied: number;
  /** Chunks an earlier run copied, settled from the source's change log, or by reading both hosts. */
  chunksFromLog: number;
  chunksCompared: number;
  /**
   * Online: the standbys' physical slots the source's logical walsenders have waited for since the
   * move began (or since the last failover it came through), as recorded; only ever narrowed
   * (watchStandbySlots in failover.ts).
   */
  standbySlots: string[];
  /**
   * The large tables' figures this run's copy took for the first wave's verification (copy-logs.ts),
   * by `schema.table`, until its pre-verification takes them (takeCopyFigures); null when none.
   */
  copyFigures: Map<string, CopyFigure> | null;
  /**
   * Worker connections opened ahead of the steps that take them (workers.ts, Spares): the creation's
   * while the preflight runs, the clean-up's from the last wave's fence; null in a resumed run.
   */
  spares: {
    open(host: HostConfig, applicationName: string, count: number): void;
    take(host: HostConfig, applicationName: string): Promise<pg.Client>;
  } | null;
  /** When the cut-over last set the statement timeout of the source's and target's sessions (fence-limit.ts, underFence). */
  readonly timeoutsSetAt: Map<pg.Client, number>;
}

/**
 * One wave's state in this run: what its fence recorded (kept in the move's record, so a resumed run
 * starts with them) and what its steps read once and share. Made when the wave starts (beginWave)
 * and dropped when the next one starts: nothing in it can be taken for another wave's.
 */
export interface WaveState {
  /**
   * The marker kind of the current fence attempt. Each attempt has its own: after a catch-up timeout
   * the source is unfenced, and the old marker may still be on its way to the target.
   */
  fenceMarker: string | null;
  /** Wall-clock ms when the wave's fence began (kept in the record: survives a kill). */
  fenceStartedAtMs: number | null;
  /** performance.now() by which this run must have switched the fenced wave, or unfence it (see maxFencedMs). */
  fenceDeadline: number | null;
  /** The wave's switch was sent (switchMap): from then on the target may hold the shards (see watchFence). */
  switchSent: boolean;
  /** The wave's verification begun before its fence (this process only; see tail.ts). */
  pre: PreVerification | null;
  /**
   * The wave's tables left untracked because they were empty when this run began its cut-over
   * (fence.ts), and whether the wave may have tracking or change-log triggers (false only when
   * this run found none before its fence and created none).
   */
  untracked: { readonly tables: ReadonlySet<string>; readonly triggers: boolean } | null;
  /** The wave's tables on each host, listed before its fence (fence.ts). */
  leaves: { readonly source: readonly LeafTable[]; readonly target: readonly LeafTable[] } | null;
  /** The source's tables of the wave with their emptiness as its fence transactions reported it (fence.ts). */
  sourceNow: readonly LeafTable[] | null;
  /**
   * The sequences of the wave's shards, listed before its fence (sequences.ts, listSequences), and the
   * target's states of them read then (nothing moves the target's copies of the sequences).
   */
  sequences: { readonly list: readonly ShardSequence[]; readonly target?: readonly SequenceState[] } | null;
  /**
   * What the wave's fence string read on the source once the wave was fenced (fence.ts,
   * fenceWaveOnce): its sequences' states (null when one could not be read that way) and the
   * placement version the switch starts from.
   */
  fenceReads: {
    readonly marker: string;
    readonly sequences: readonly SequenceState[] | null;
    readonly placementVersion: bigint;
  } | null;
  /**
   * What the target said in the round trip that saw the wave's fence marker applied (catch-up.ts,
   * waitForCatchUp): its tables with their emptiness, and the move's recorded changes (null when
   * no verification was begun before the fence). Nothing changes either until the switch.
   */
  targetNow: {
    readonly marker: string;
    readonly leaves: readonly LeafTable[];
    readonly changes: ReadonlyMap<string, TableChanges> | null;
  } | null;
  /** The source's bounds on the fence's locks, read once per wave (fence-locks.ts, lockLimits). */
  lockLimits: { readonly lockWaitMs: number; readonly groupTables: number } | null;
}

function waveState(
  fence: { marker: string | null; startedAtMs: number | null } = { marker: null, startedAtMs: null },
): WaveState {
  return {
    fenceMarker: fence.marker,
    fenceStartedAtMs: fence.startedAtMs,
    fenceDeadline: null,
    switchSent: false,
    pre: null,
    untracked: null,
    leaves: null,
    sourceNow: null,
    sequences: null,
    fenceReads: null,
    targetNow: null,
    lockLimits: null,
  };
}

/** The next wave starts: its number and a state of its own, nothing carried from the last. */
export function beginWave(ctx: MoveContext, wave: number): void {
  ctx.wave = wave;
  ctx.current = waveState();
}

/** A sequence's state as read from the sequence itself. */
export interface SequenceState {
  readonly last_value: string;
  readonly is_called: boolean;
}

/** A sequence of a shard, as carried at the cut-over. */
export interface ShardSequence {
  readonly schema: string;
  readonly name: string;
  readonly incrementBy: bigint;
}

/** The default of MoveOptions.maxFencedMs. */
export const DEFAULT_MAX_FENCED_MS = 20_000;

/** The default of MoveOptions.copyChunkRows. */
export const DEFAULT_COPY_CHUNK_ROWS = 1_000_000;

/** A move's options that have a default, with it: the one place the defaults are written. */
export interface MoveSettings {
  readonly catchUpTimeoutMs: number;
  readonly fenceTimeoutMs: number;
  readonly maxFencedMs: number;
  readonly waitTimeoutMs: number;
  readonly copyChunkRows: number;
  /** The config file rewritten at the switch. */
  readonly configFile: string;
}

function settingsOf(config: ShardctlConfig, options: MoveOptions): MoveSettings {
  return {
    catchUpTimeoutMs: options.catchUpTimeoutMs ?? 30_000,
    fenceTimeoutMs: options.fenceTimeoutMs ?? 30_000,
    maxFencedMs: options.maxFencedMs ?? DEFAULT_MAX_FENCED_MS,
    waitTimeoutMs: options.waitTimeoutMs ?? 300_000,
    copyChunkRows: options.copyChunkRows ?? DEFAULT_COPY_CHUNK_ROWS,
    configFile: options.configFile ?? config.file,
  };
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
    settings: settingsOf(config, options),
    waves: record.mode === 'online' ? waves : [[...record.shards]],
    wave: record.mode === 'online' && typeof detail['wave'] === 'number' ? detail['wave'] : 0,
    current: waveState({
      marker: typeof detail['fenceMarker'] === 'string' ? detail['fenceMarker'] : null,
      startedAtMs: typeof detail['fenceStartedAtMs'] === 'number' ? detail['fenceStartedAtMs'] : null,
    }),
    writeBlockedMs: typeof detail['writeBlockedMs'] === 'number' ? detail['writeBlockedMs'] : null,
    rowsVerified: typeof detail['rowsVerified'] === 'string' ? BigInt(detail['rowsVerified']) : 0n,
    verification: null,
    methods: null,
    leafTables: null,
    sourcePrivileges: null,
    guarded: null,
    refreshed: [],
    copied: false,
    copyBytesPerSecond: typeof detail['copyBytesPerSecond'] === 'number' ? detail['copyBytesPerSecond'] : null,
    chunksCopied: 0,
    chunksRecopied: 0,
    chunksFromLog: 0,
    chunksCompared: 0,
    standbySlots: Array.isArray(detail['standbySlots']) ? (detail['standbySlots'] as unknown[]).map(String) : [],
    copyFigures: null,
    spares: null,
    timeoutsSetAt: new Map(),
  };
}

export function moveResult(
  ctx: MoveContext,
  outcome: MoveResult['outcome'],
  checks: readonly PreflightCheck[],
  started: number,
  copyEstimate: CopyEstimate | null = null,
): MoveResult {
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
    maxFencedMs: ctx.mode === 'online' ? ctx.settings.maxFencedMs : null,
    rowsMoved: ctx.rowsVerified.toString(),
    writeBlockedMs: ctx.writeBlockedMs,
    durationMs: elapsed(started),
    verification: ctx.verification,
    materializedViews: ctx.refreshed,
    chunks: {
      copied: ctx.chunksCopied,
      recopied: ctx.chunksRecopied,
      fromLog: ctx.chunksFromLog,
      compared: ctx.chunksCompared,
    },
    copyEstimate,
  };
}

export function schemasOf(ctx: MoveContext, shards: readonly number[]): string[] {
  return shards.map((s) => shardSchemaName(ctx.config, s));
}

export function waveShards(ctx: MoveContext): readonly number[] {
  return ctx.waves[ctx.wave] ?? ctx.shards;
}

export function announce(ctx: MoveContext, step: MoveStep, detail: string): void {
  ctx.options.onStep?.(step, detail);
}

export function notice(ctx: MoveContext, message: string): void {
  ctx.options.onNotice?.(message);
}

/** Binary COPY and binary replication are safe only between equal major versions. */
export function sameMajorVersion(ctx: MoveContext): boolean {
  return Math.floor(ctx.source.serverVersionNum / 10000) === Math.floor(ctx.target.serverVersionNum / 10000);
}
