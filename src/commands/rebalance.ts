import { elapsed } from '../clock.js';
import { loadConfig } from '../config/load.js';
import type { HostConfig, ShardctlConfig } from '../config/types.js';
import { optionKeys, refuseUnknownOptions } from '../config/validate.js';
import { type NextStep, RuntimeFailure, UsageError } from '../errors.js';
import { controlTableExists } from '../fleet/control.js';
import { describePgError } from '../fleet/connect.js';
import { Fleet } from '../fleet/session.js';
import {
  lockAfterPlacement,
  readFleetPlacement,
  requireCurrentMapLocked,
  withFleetShardLists,
} from '../fleet/placement.js';
import { MOVE_OPTION_FLAGS, type MoveOptions } from '../moves/context.js';
import { planRebalance, type PlannedMove, type RebalanceBy, type RebalancePlan } from '../moves/rebalance.js';
import { abortBegun, type MoveStep } from '../moves/state.js';
import { findRunningMoves, runMoves } from '../moves/run.js';
import { describeMove, runPlan, type RebalanceMoveResult } from '../moves/schedule.js';
import { LOGICAL_WORKERS_SQL } from '../moves/sql/replication.js';
import { shardLoad } from './load.js';
import { shardSizes } from './sizes.js';
import { Limit } from '../router/limit.js';
import { inflect } from '../text.js';

/**
 * `shardctl rebalance`: finishes the moves an earlier run left unfinished, plans from the map as it
 * is now (src/moves/rebalance.ts) and runs the plan as batched moves, one per (source, target) pair,
 * through the scheduler beside the planner (src/moves/schedule.ts).
 * The rebalance holds the runner lock of every host for its whole run; up to maxParallel moves run at
 * once, a source giving to one target at a time while a target may take from several sources (a new
 * host fills from every old one at once; online, from at most as many as it has logical replication
 * workers free); a host is never source and target at once. Each move starts from the config file
 * as the moves before it rewrote it. Interrupted, a rerun resumes the unfinished moves and plans the
 * rest from the map they left: the planner is deterministic and never moves a shard back.
 */

export interface RebalanceOptions extends Omit<MoveOptions, 'dryRun' | 'resume' | 'abort' | 'configFile' | 'onStep'> {
  /** Balance the number of shards (default) or their bytes on disk, by each host's weight. */
  readonly by?: RebalanceBy;
  /** How many moves (pairs of hosts sharing no host) run at once (default 2, at most 64). */
  readonly maxParallel?: number;
  /** Plan and print, change nothing (unfinished moves are counted as finished in the plan). */
  readonly dryRun?: boolean;
  /**
   * Reads the map again: before each move (the moves change the placement), and once at the start
   * when the config is older than the fleet. Default before each move: the config given, with each
   * host's shard lists as the fleet places them then (its file is not read again: addresses and
   * credentials set in code stay); at the start: the file, read again, for its shard lists only.
   */
  readonly reload?: () => Promise<ShardctlConfig>;
  /** Called with the plan before any move of it starts. */
  readonly onPlan?: (plan: RebalancePlan) => void | Promise<void>;
  /** What is starting or finished: an unfinished move resumed, a move of the plan started or done. */
  readonly onEvent?: (message: string) => void;
  /** A step of one of the moves, with the pair it belongs to. */
  readonly onStep?: (move: Pick<PlannedMove, 'source' | 'target'>, step: MoveStep, detail: string) => void;
}

/**
 * A move recorded on the hosts but not finished: rebalance resumes it before planning, or aborts it
 * when an abort of it began (`aborting`).
 */
export interface UnfinishedMove {
  readonly moveId: string;
  readonly source: string;
  readonly target: string;
  readonly shards: readonly number[];
  readonly step: string;
  readonly aborting: boolean;
}

export type { RebalanceMoveResult };

export interface RebalanceResult {
  /** rebalanced: moves ran; balanced: nothing to move; dry-run: planned only. */
  readonly outcome: 'rebalanced' | 'balanced' | 'dry-run';
  readonly by: RebalanceBy;
  /** Unfinished moves found first (resumed or aborted, or in a dry run, to be). */
  readonly unfinished: readonly UnfinishedMove[];
  readonly plan: RebalancePlan;
  /** The moves run, in the order they finished. */
  readonly moves: readonly RebalanceMoveResult[];
  /**
   * What the real run refuses before it changes anything (a dry run reports it, the real run throws
   * it): hosts of the map that were never initialised, with what to run first; or, in a dry run, a
   * check of a planned move's preflight that fails (a role missing on the target, …), each named
   * with its move. Null: nothing.
   */
  readonly refused: RebalanceRefusal | null;
  /** Rows verified over every move, the resumed ones included. Decimal string. */
  readonly rowsMoved: string;
  readonly durationMs: number;
}

export interface RebalanceRefusal {
  readonly code: 'HOSTS_NOT_INITIALISED' | 'PREFLIGHT_FAILED';
  readonly message: string;
  readonly hosts: readonly string[];
  readonly next: readonly NextStep[];
}

const DEFAULT_PARALLEL = 2;
/** Planned moves whose preflight a dry run runs at once (each opens its hosts' sessions). */
const PREFLIGHTS_AT_ONCE = 4;

/** Every key of RebalanceOptions: a move's, but those a rebalance decides itself, and its own. */
const { resume: _resume, abort: _abort, configFile: _configFile, ...moveFlags } = MOVE_OPTION_FLAGS;
const REBALANCE_OPTION_KEYS = optionKeys<RebalanceOptions>({
  ...moveFlags,
  by: true,
  maxParallel: true,
  reload: true,
  onPlan: true,
  onEvent: true,
});

export async function rebalance(config: ShardctlConfig, options: RebalanceOptions = {}): Promise<RebalanceResult> {
  refuseUnknownOptions('rebalance options', options, REBALANCE_OPTION_KEYS);
  const started = performance.now();
  const by = options.by ?? 'count';
  if (by !== 'count' && by !== 'size' && by !== 'load')
    throw new UsageError('expected count, size or load', { input: 'by', value: by });
  const maxParallel = options.maxParallel ?? DEFAULT_PARALLEL;
  if (!Number.isInteger(maxParallel) || maxParallel < 1 || maxParallel > 64) {
    throw new UsageError('must be an integer from 1 to 64', { input: 'maxParallel', value: maxParallel });
  }
  if (!options.dryRun && config.file === '<inline>') {
    throw new UsageError('rebalance rewrites the map as shards move: load the config from a file', { input: 'config' });
  }
  // The runner lock on every host for the whole rebalance: no migrate or other move can change the
  // fleet between the plan and its moves, and the moves of the plan can share hosts (several sources
  // into one new host copy at the same time).
  const fleet = await Fleet.open(config.hosts, { applicationName: 'shardctl rebalance' });
  try {
    fleet.requireAll();
    // The plan may give shards to any host of the map: each must hold the control schema. Said
    // before anything changes, by the dry run too.
    const refused = await uninitialisedHosts(fleet);
    if (refused && !options.dryRun)
      throw new RuntimeFailure(refused.code, refused.message, { hosts: refused.hosts }, [], [...refused.next]);
    // With the placement from before the locks: what a move that finishes while this run waits changes.
    const before = options.dryRun ? undefined : await lockAfterPlacement(fleet, { lockTimeout: config.lockTimeout });
    const placement = await readFleetPlacement(fleet);
    const reload = options.reload ?? ((file: string) => loadConfig(file));
    const current = await requireCurrentMapLocked(config, placement, () => reload(config.file), before);
    const intoLimit = options.mode === 'offline' || options.dryRun ? undefined : await freeWorkers(fleet);
    const reloadMap = options.reload ?? (async () => withFleetShardLists(current, await readFleetPlacement(fleet)));
    const result = await rebalanceLocked(current, options, by, maxParallel, started, reloadMap, intoLimit);
    // The dry run says what the real run's moves would refuse: each planned move's preflight, as
    // move-shard --dry-run runs it. Not when the run is refused already, nor while moves are
    // unfinished (the plan assumes their end), nor for a config given in code (the real run
    // refuses it: it must rewrite a file).
    const movesRefused =
      options.dryRun && !refused && result.unfinished.length === 0 && current.file !== '<inline>'
        ? await preflightRefusal(current, result.plan, options.mode)
        : undefined;
    return { ...result, refused: refused ?? movesRefused ?? null };
  } finally {
    await fleet.close();
  }
}

/**
 * Per host, its free logical replication workers (read once, before the plan runs): an online move
 * into a host needs one for its subscription, so a host takes from at most that many sources at
 * once (at least one: a host with none is refused by the move's preflight, which says what to raise).
 */
async function freeWorkers(fleet: Fleet): Promise<(host: string) => number> {
  const free = new Map(
    await Promise.all(
      fleet.sessions.map(async ({ host, client }) => {
        const row = (await client.query<{ workers: number; slots: number }>(LOGICAL_WORKERS_SQL)).rows[0]!;
        return [host.name, Math.max(1, row.slots - row.workers)] as const;
      }),
    ),
  );
  return (host) => free.get(host) ?? 1;
}

/** The failed checks of the planned moves' preflights (each move's dry run), as one refusal; undefined when all pass. */
async function preflightRefusal(
  config: ShardctlConfig,
  plan: RebalancePlan,
  mode: MoveOptions['mode'],
): Promise<RebalanceRefusal | undefined> {
  const limit = new Limit(PREFLIGHTS_AT_ONCE);
  const found = await Promise.all(
    plan.moves.map((move) =>
      limit.run(async (): Promise<string[]> => {
        const what = `${move.source} → ${move.target}`;
        try {
          const dry = await runMoves(
            config,
            [...move.shards].sort((a, b) => a - b),
            hostNamed(config, move.target),
            {
              dryRun: true,
              // The map was checked against the fleet by this run (requireCurrentMapLocked): not again per move.
              runnerLocksHeld: true,
              ...(mode ? { mode } : {}),
            },
          );
          return dry.moves
            .flatMap((m) => m.preflight)
            .filter((c) => !c.ok)
            .map((c) => `${what}: ${c.name}: ${c.message}`);
        } catch (error) {
          return [`${what}: its preflight could not run: ${describePgError(error)}`];
        }
      }),
    ),
  );
  const failed = found.flat();
  const targets = new Set(plan.moves.filter((_, i) => found[i]!.length > 0).map((m) => m.target));
  if (failed.length === 0) return undefined;
  return {
    code: 'PREFLIGHT_FAILED',
    message: `a planned move's preflight fails (the real run stops at that move): ${failed.join('; ')}`,
    hosts: [...targets],
    next: [],
  };
}

async function uninitialisedHosts(fleet: Fleet): Promise<RebalanceRefusal | null> {
  const initialised = await Promise.all(fleet.sessions.map((s) => controlTableExists(s.client, 'shards')));
  const hosts = fleet.sessions.filter((_, i) => !initialised[i]).map((s) => s.host.name);
  if (hosts.length === 0) return null;
  const which = hosts.length === 1 ? `${hosts[0]} has` : `${hosts.join(', ')} have`;
  return {
    code: 'HOSTS_NOT_INITIALISED',
    message: `rebalance refused before moving anything: ${which} no shardctl control schema (never initialised); initialise every host of the map first`,
    hosts,
    next: [{ action: 'init' }],
  };
}

async function rebalanceLocked(
  config: ShardctlConfig,
  options: RebalanceOptions,
  by: RebalanceBy,
  maxParallel: number,
  started: number,
  reload: () => Promise<ShardctlConfig>,
  intoLimit?: (target: string) => number,
): Promise<Omit<RebalanceResult, 'refused'>> {
  const event = options.onEvent ?? (() => undefined);
  const moveOptions = (pair: Pick<PlannedMove, 'source' | 'target'>): MoveOptions => {
    const {
      by: _by,
      maxParallel: _parallel,
      dryRun: _dry,
      reload: _reload,
      onPlan: _plan,
      onEvent: _event,
      onStep,
      ...rest
    } = options;
    return {
      ...rest,
      runnerLocksHeld: true,
      ...(onStep ? { onStep: (step: MoveStep, detail: string) => onStep(pair, step, detail) } : {}),
    };
  };

  const records = await findRunningMoves(config);
  const unfinished = records.map((r) => ({
    moveId: r.moveId,
    source: r.source,
    target: r.target,
    shards: r.shards,
    step: r.step,
    aborting: abortBegun(r.detail),
  }));
  let current = config;
  let rows = 0n;
  if (unfinished.length > 0 && !options.dryRun) {
    event(
      `finishing ${unfinished.length} unfinished ${inflect(unfinished.length, 'move')} first: ${unfinished.map(describeUnfinished).join('; ')}`,
    );
    // A move whose abort began is aborted (it can be nothing else), the others resumed.
    for (const aborting of [true, false]) {
      const these = unfinished.filter((u) => u.aborting === aborting);
      if (these.length === 0) continue;
      const shards = [...new Set(these.flatMap((u) => u.shards))].sort((a, b) => a - b);
      const finished = await runMoves(config, shards, undefined, {
        ...moveOptions({
          source: aborting ? '(aborted)' : '(resumed)',
          target: these.map((u) => u.target).join(', '),
        }),
        ...(aborting ? { abort: true } : { resume: true }),
        // Only these moves: another one carrying a shard of theirs is not theirs to finish.
        moveIds: these.map((u) => u.moveId),
      });
      rows += BigInt(finished.rowsMoved);
    }
    current = await reload();
  }

  const sizes = await shardSizes(current);
  const hosts = current.hosts.map((h) => ({ name: h.name, weight: h.weight, drain: h.drain, shards: h.shards }));
  if (options.dryRun) {
    // The unfinished moves will end on their targets (those whose abort began, on their sources):
    // plan from the map as they will leave it.
    for (const u of unfinished.filter((m) => !m.aborting)) {
      const moving = new Set(u.shards);
      for (const [i, h] of hosts.entries()) {
        if (h.name === u.source) hosts[i] = { ...h, shards: h.shards.filter((s) => !moving.has(s)) };
        if (h.name === u.target)
          hosts[i] = { ...h, shards: [...new Set([...h.shards, ...u.shards])].sort((a, b) => a - b) };
      }
    }
  }
  const load =
    by === 'load' ? new Map((await shardLoad(current)).shards.map((s) => [s.shard, s.writes + s.reads])) : undefined;
  const plan = planRebalance(hosts, new Map(sizes.shards.map((s) => [s.shard, s.bytes])), by, load);
  await options.onPlan?.(plan);
  if (options.dryRun || plan.moves.length === 0) {
    return {
      outcome: options.dryRun ? 'dry-run' : 'balanced',
      by,
      unfinished,
      plan,
      moves: [],
      rowsMoved: rows.toString(),
      durationMs: elapsed(started),
    };
  }

  const done = await runPlan(
    plan.moves,
    maxParallel,
    async (move) => {
      event(`starting ${describeMove(move)}`);
      const map = await reload();
      const result = await runMoves(
        map,
        [...move.shards].sort((a, b) => a - b),
        hostNamed(map, move.target),
        moveOptions(move),
      );
      event(`done ${describeMove(move)}: ${result.rowsMoved} rows verified`);
      return result;
    },
    intoLimit,
  );
  rows += done.reduce((n, m) => n + BigInt(m.result.rowsMoved), 0n);
  return {
    outcome: 'rebalanced',
    by,
    unfinished,
    plan,
    moves: done,
    rowsMoved: rows.toString(),
    durationMs: elapsed(started),
  };
}

/** The plan names hosts of the map it was made from; the map reloaded before a move still has them unless edited meanwhile. */
function hostNamed(config: ShardctlConfig, name: string): HostConfig {
  const host = config.hosts.find((h) => h.name === name);
  if (!host)
    throw new RuntimeFailure('MOVE_HOSTS', `the plan moves shards to host ${name}, which ${config.file} no longer has`);
  return host;
}

function describeUnfinished(move: UnfinishedMove): string {
  return `${describeMove(move)} after step ${move.step}${move.aborting ? ' (its abort was cut off: aborted, not resumed)' : ''}`;
}
