import type { ShardctlConfig } from '../config/types.js';
import { hostForShard } from '../config/types.js';
import { RuntimeFailure, UsageError } from '../errors.js';
import { controlSchemaSql, controlTableExists } from '../fleet/control.js';
import { Fleet, withSession } from '../fleet/session.js';
import { readMigrations, type MigrationFile } from '../migrations/files.js';
import {
  abortMove,
  announce,
  elapsed,
  faultAfter,
  moveContext,
  moveResult,
  newMoveId,
  runSteps,
  type MoveOptions,
  type MoveResult,
} from '../moves/move.js';
import { preflight } from '../moves/preflight.js';
import { insertMove, runningMove, stepsFor, type MoveRecord } from '../moves/state.js';

/**
 * `shardctl move-shard`: checks the request, connects to both hosts and takes their runner locks,
 * runs the preflight, then starts the move (src/moves/move.ts), or finds an unfinished one and
 * carries it on (--resume) or undoes it (--abort).
 */
export async function moveShard(config: ShardctlConfig, shard: number, targetName: string | undefined, options: MoveOptions = {}): Promise<MoveResult> {
  const started = performance.now();
  if (!Number.isInteger(shard) || shard < 0 || shard >= config.shards) {
    throw new UsageError(`out of range 0-${config.shards - 1}`, { input: 'shard', value: shard });
  }
  if (options.resume && options.abort) throw new UsageError('resume and abort exclude each other', { input: 'resume+abort' });
  const migrations = await readMigrations(config.migrationsDir);

  if (options.resume || options.abort) {
    return continueMove(config, shard, migrations, options, started);
  }
  if (!targetName) throw new UsageError('a target host is required to start a move', { input: 'target' });
  const target = config.hosts.find((h) => h.name === targetName);
  if (!target) {
    throw new UsageError(`no such host in the map (hosts: ${config.hosts.map((h) => h.name).join(', ')})`, { input: 'target', value: targetName });
  }
  const source = hostForShard(config, shard)!;
  const mode = options.mode ?? 'online';
  const fleet = await Fleet.open([source, target], { applicationName: 'shardctl move' });
  try {
    fleet.requireAll();
    if (!options.dryRun) await fleet.lock({ lockTimeout: config.lockTimeout });
    const sides = { source: fleet.session(source.name), target: fleet.session(target.name) };
    const checks = await preflight({
      config,
      shard,
      mode,
      source: sides.source,
      target: sides.target,
      migrations,
      probeReachability: !options.dryRun && mode === 'online' && source.name !== target.name,
      configFile: options.configFile ?? config.file,
    });
    const failed = checks.filter((c) => !c.ok);
    if (options.dryRun) {
      return {
        moveId: '(dry run)',
        shard,
        source: source.name,
        target: target.name,
        mode,
        outcome: 'dry-run',
        preflight: checks,
        plan: stepsFor(mode),
        rowsMoved: '0',
        writeBlockedMs: null,
        durationMs: elapsed(started),
        verification: null,
      };
    }
    if (failed.length > 0) {
      throw new RuntimeFailure(
        'PREFLIGHT_FAILED',
        `move of shard ${shard} from ${source.name} to ${target.name} not started; nothing was changed:\n${failed.map((c) => `  - ${c.name}: ${c.message}`).join('\n')}`,
        { checks },
        failed.map((c) => `${c.name}: ${c.message}`),
      );
    }
    const moveId = newMoveId();
    const ctx = moveContext(config, shard, moveId, mode, sides, migrations, options);
    for (const side of [ctx.source, ctx.target]) await side.client.query(controlSchemaSql(config));
    for (const side of [ctx.source, ctx.target]) {
      await insertMove(side.client, { moveId, shard, source: source.name, target: target.name, mode, step: 'prepared' });
    }
    announce(ctx, 'prepared', `move ${moveId}: shard ${shard} from ${source.name} to ${target.name} (${mode})`);
    faultAfter('prepared');
    await runSteps(ctx, 'prepared');
    return moveResult(ctx, 'moved', checks, started);
  } finally {
    await fleet.close();
  }
}

/** --resume and --abort: find the unfinished move on the hosts and carry it on or undo it. */
async function continueMove(
  config: ShardctlConfig,
  shard: number,
  migrations: readonly MigrationFile[],
  options: MoveOptions,
  started: number,
): Promise<MoveResult> {
  const record = await findRunningMove(config, shard);
  if (!record) {
    throw new RuntimeFailure('NO_MOVE', `no unfinished move of shard ${shard} is recorded on any host; nothing to ${options.resume ? 'resume' : 'abort'}`);
  }
  const source = config.hosts.find((h) => h.name === record.source);
  const target = config.hosts.find((h) => h.name === record.target);
  if (!source || !target) {
    throw new RuntimeFailure('MOVE_HOSTS', `move ${record.moveId} is between ${record.source} and ${record.target}, but the map lacks one of them`);
  }
  const fleet = await Fleet.open([source, target], { applicationName: 'shardctl move' });
  try {
    fleet.requireAll();
    if (!options.dryRun) await fleet.lock({ lockTimeout: config.lockTimeout });
    const sides = { source: fleet.session(source.name), target: fleet.session(target.name) };
    // The hosts may disagree by one step (a crash between the two updates): redo from the earlier.
    const onSource = await runningMove(sides.source.client, shard);
    const onTarget = await runningMove(sides.target.client, shard);
    const steps = stepsFor(record.mode);
    const recorded = [onSource, onTarget].filter((r): r is MoveRecord => r !== null && r.moveId === record.moveId);
    const step = recorded.map((r) => r.step).sort((a, b) => steps.indexOf(a) - steps.indexOf(b))[0] ?? record.step;
    const detail = (onSource ?? onTarget ?? record).detail;
    const ctx = moveContext(config, shard, record.moveId, record.mode, sides, migrations, options, detail);
    if (options.dryRun) {
      return { ...moveResult(ctx, 'dry-run', [], started), plan: steps.slice(steps.indexOf(step) + 1) };
    }
    if (options.abort) {
      await abortMove(ctx, step);
      return moveResult(ctx, 'aborted', [], started);
    }
    announce(ctx, step, `resuming move ${record.moveId} after step ${step}`);
    await runSteps(ctx, step);
    return moveResult(ctx, 'moved', [], started);
  } finally {
    await fleet.close();
  }
}

async function findRunningMove(config: ShardctlConfig, shard: number): Promise<MoveRecord | null> {
  const errors: string[] = [];
  for (const host of config.hosts) {
    try {
      const record = await withSession(
        host,
        async ({ client }) => ((await controlTableExists(client, 'moves')) ? runningMove(client, shard) : null),
        { applicationName: 'shardctl move' },
      );
      if (record) return record;
    } catch (error) {
      errors.push(error instanceof Error ? error.message : String(error));
    }
  }
  if (errors.length > 0) throw new RuntimeFailure('HOST_UNREACHABLE', `cannot look for the move of shard ${shard}: ${errors.join('; ')}`);
  return null;
}
