import type { Command } from 'commander';
import { cutOverSignals } from './cut-over-signals.js';
import type { MoveMode, RebalanceBy, RebalancePlan, RebalanceResult, UnfinishedMove } from '../index.js';
import { lib } from './library.js';
import { type CliContext, loadCliConfig } from './context.js';
import {
  type CommonFlags,
  configOption,
  confirmOrRefuse,
  dryRunOption,
  jsonOption,
  withFlagNames,
  yesOption,
} from './options.js';
import { columns, formatBytes, nextLine, Output, plural, seconds } from './output.js';
import { maxFencedOption, parseMaxFenced } from './move-shard.js';

interface RebalanceFlags extends CommonFlags {
  by?: string;
  maxParallel?: string;
  mode?: string;
  maxFenced?: string;
}

/** Library inputs → the flags that carry them, for error messages. */
const FLAGS = { by: 'option --by', maxParallel: 'option --max-parallel', config: 'option -c' };

export function registerRebalance(program: Command, ctx: CliContext, done: (code: number) => void): void {
  const command = program
    .command('rebalance')
    .description(
      'move shards so every host has its weighted share (by count, size or load), empty draining hosts, fill new ones; batched moves in parallel (a source gives to one target at a time, a target may take from several); a rerun finishes an interrupted rebalance',
    )
    .option(
      '--by <what>',
      'balance the shard count, the bytes on disk, or the rows written and read (status --load): count, size or load',
      'count',
    )
    .option(
      '--max-parallel <n>',
      'moves running at once (a host is never source and target at once; a new host fills from several sources)',
      '2',
    )
    .option(
      '--mode <mode>',
      'how each move runs: online (logical replication) or offline (writes fenced during the copy)',
      'online',
    );
  maxFencedOption(command);
  dryRunOption(command, 'print the plan and change nothing');
  yesOption(command);
  configOption(
    command,
    'config file (default: $SHARDCTL_CONFIG or ./shardctl.yaml); rewritten in place as shards move',
  );
  jsonOption(command);
  command.action(async (flags: RebalanceFlags) => {
    const { rebalance, UsageError } = lib();
    const out = new Output(ctx.streams, flags.json ?? false);
    if (flags.mode !== 'online' && flags.mode !== 'offline') {
      throw new UsageError(`option --mode ${JSON.stringify(flags.mode)}: expected online or offline`);
    }
    const maxParallel = /^\d{1,6}$/.test(flags.maxParallel ?? '') ? Number(flags.maxParallel) : Number.NaN;
    if (Number.isNaN(maxParallel))
      throw new UsageError(
        `option --max-parallel ${JSON.stringify(flags.maxParallel)}: expected a whole number from 1 to 64`,
      );
    const maxFencedMs = parseMaxFenced(flags.maxFenced);
    const config = await loadCliConfig(ctx, flags, out);
    const base = {
      by: flags.by as RebalanceBy,
      maxParallel,
      mode: flags.mode as MoveMode,
      ...(maxFencedMs === undefined ? {} : { maxFencedMs }),
    };

    let shown: string | null = null;
    if (!flags.dryRun && !flags.yes) {
      // Show what will happen before asking; the run plans again from the map as it is then.
      const preview = await withFlagNames(FLAGS, () => rebalance(config, { ...base, dryRun: true }));
      if (preview.plan.moves.length === 0 && preview.unfinished.length === 0 && !preview.refused) {
        if (out.json) out.data({ ...preview, outcome: 'balanced' });
        else printPlan(out, preview.plan, []);
        out.success(`rebalance by ${preview.by}: every host has its share; nothing to move`);
        done(0);
        return;
      }
      if (!out.json) printPlan(out, preview.plan, preview.unfinished);
      shown = planKey(preview.plan);
      // A run that would refuse does so at once, below: nothing to confirm.
      if (!preview.refused) await confirmOrRefuse(ctx.streams, `run this plan (${planSummary(preview.plan)})`);
    }
    // SIGINT and SIGTERM during a cut-over release the fenced wave first (cut-over-signals.ts).
    const signals = cutOverSignals((text) => out.warn(text));
    const result = await withFlagNames(FLAGS, () =>
      signals.run(
        rebalance(config, {
          ...base,
          signal: signals.signal,
          dryRun: flags.dryRun ?? false,
          reload: () => loadCliConfig(ctx, flags, out),
          onPlan: (plan) => {
            // A dry run prints its plan at the end, with the unfinished moves first.
            if (out.json || flags.dryRun || planKey(plan) === shown) return;
            if (shown !== null)
              out.warn('the map or the sizes changed since the plan above; running this plan instead:');
            printPlan(out, plan, []);
          },
          onEvent: (message) => out.info(message),
          onStep: (pair, _step, detail) => out.info(`${pair.source} → ${pair.target}: ${detail}`),
          onNotice: (message) => out.warn(message),
        }),
      ),
    );
    finish(out, result);
    // A dry run whose real run would refuse fails, as move-shard's dry run with a failed check does.
    done(result.refused ? 1 : 0);
  });
}

function finish(out: Output, result: RebalanceResult): void {
  const { shardsPhrase } = lib();
  if (out.json) {
    out.data(result);
    return;
  }
  if (result.outcome === 'dry-run') {
    printPlan(out, result.plan, result.unfinished);
    out.info(`rebalance by ${result.by}: dry run, nothing changed`);
    if (result.refused) {
      out.warn(`the real run would refuse: ${result.refused.message}`);
      if (result.refused.next.length > 0) out.info(nextLine(result.refused.next, lib().formatShardList));
    }
    return;
  }
  if (result.outcome === 'balanced') {
    out.success(
      `rebalance by ${result.by}: every host has its share${result.unfinished.length > 0 ? ` (after finishing ${result.unfinished.length} unfinished move(s))` : ''}; nothing to move`,
    );
    return;
  }
  for (const move of result.moves) {
    out.line(
      `${move.source} → ${move.target}: ${shardsPhrase(move.shards)} moved, ` +
        `${move.result.rowsMoved} rows verified, longest write block ${move.result.writeBlockedMs === null ? 'none' : `${move.result.writeBlockedMs} ms`}, ${seconds(move.result.durationMs)}`,
    );
  }
  out.success(
    `rebalance by ${result.by}: ${planSummary(result.plan)} moved, ${result.rowsMoved} rows verified, total ${seconds(result.durationMs)}`,
  );
}

function printPlan(out: Output, plan: RebalancePlan, unfinished: readonly UnfinishedMove[]): void {
  const { formatShardList } = lib();
  if (unfinished.length > 0) printUnfinished(out, unfinished);
  if (plan.moves.length === 0) {
    out.line(`rebalance by ${plan.by}: nothing to move`);
  } else {
    out.line(`rebalance by ${plan.by}: ${planSummary(plan)}`);
    const rows = plan.moves.map((m) => [
      `${m.source} → ${m.target}`,
      formatShardList([...m.shards]),
      String(m.shards.length),
      formatBytes(m.bytes),
    ]);
    for (const line of columns([['move', 'shards', 'count', 'bytes'], ...rows], '  ')) out.line(line);
  }
  printHosts(out, plan);
}

function printHosts(out: Output, plan: RebalancePlan): void {
  const rows = plan.hosts.map((h) => [
    h.host,
    `${h.shardsBefore} → ${h.shardsAfter}`,
    `${formatBytes(h.bytesBefore)} → ${formatBytes(h.bytesAfter)}`,
    h.drain
      ? 'draining'
      : `weight ${h.weight}${plan.by === 'load' ? '' : `, share ${plan.by === 'count' ? `${h.idealShards} shards` : formatBytes(h.idealBytes)}`}`,
  ]);
  for (const line of columns([['host', 'shards', 'bytes', ''], ...rows], '  ')) out.line(line);
}

function printUnfinished(out: Output, unfinished: readonly UnfinishedMove[]): void {
  const { shardsPhrase } = lib();
  out.line('unfinished moves, finished first:');
  for (const u of unfinished)
    out.line(
      `  ${u.source} → ${u.target}: ${shardsPhrase(u.shards)} (move ${u.moveId}, after step ${u.step}${u.aborting ? '; its abort was cut off: aborted, not resumed, the shards stay on ' + u.source : ''})`,
    );
}

function planSummary(plan: RebalancePlan): string {
  return `${plural(plan.moves.length, 'move')}, ${plural(plan.shardsMoved, 'shard')}, ${formatBytes(plan.bytesMoved)}`;
}

function planKey(plan: RebalancePlan): string {
  return JSON.stringify(plan.moves.map((m) => [m.source, m.target, m.shards]));
}
