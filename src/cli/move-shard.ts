import type { Command } from 'commander';
import { moveShard, UsageError, type MoveMode, type MoveResult } from '../index.js';
import { type CliContext, loadCliConfig } from './context.js';
import { type CommonFlags, configOption, confirmOrRefuse, dryRunOption, jsonOption, withFlagNames, yesOption } from './options.js';
import { Output, seconds } from './output.js';

interface MoveFlags extends CommonFlags {
  to?: string;
  mode?: string;
  resume?: boolean;
  abort?: boolean;
  dropSource?: boolean;
}

/** Library inputs → the flags that carry them, for error messages. */
const FLAGS = { shard: 'argument <shard>', target: 'option --to', 'resume+abort': 'options --resume and --abort' };

export function registerMoveShard(program: Command, ctx: CliContext, done: (code: number) => void): void {
  const command = program
    .command('move-shard')
    .description('move a logical shard to another host (online with logical replication, or offline), resumable')
    .argument('<shard>', 'the shard number')
    .option('--to <host>', 'the host to move it to (a name from the map)')
    .option('--mode <mode>', 'online (logical replication, PostgreSQL 15+) or offline (writes fenced during the copy)', 'online')
    .option('--resume', 'finish the unfinished move of this shard')
    .option('--abort', 'undo the unfinished move of this shard')
    .option('--drop-source', 'drop the old copy right after the switch instead of keeping it until gc');
  dryRunOption(command, 'print the plan and the preflight results; change nothing');
  yesOption(command);
  configOption(command, 'config file (default: $SHARDCTL_CONFIG or ./shardctl.yaml); rewritten in place at the switch');
  jsonOption(command);
  command.action(async (shardText: string, flags: MoveFlags) => {
    const out = new Output(ctx.streams, flags.json ?? false);
    if (!/^\d{1,7}$/.test(shardText)) throw new UsageError(`argument <shard> ${JSON.stringify(shardText)}: expected a shard number`);
    if (flags.mode !== 'online' && flags.mode !== 'offline') {
      throw new UsageError(`option --mode ${JSON.stringify(flags.mode)}: expected online or offline`);
    }
    const config = await loadCliConfig(ctx, flags, out);
    const shard = Number(shardText);
    if (!flags.dryRun && !flags.yes) {
      const what = flags.abort ? `undo the unfinished move of shard ${shard}` : flags.resume ? `finish the move of shard ${shard}` : `move shard ${shard} to ${flags.to}`;
      await confirmOrRefuse(ctx.streams, what);
    }
    const result = await withFlagNames(FLAGS, () =>
      moveShard(config, shard, flags.to, {
        mode: flags.mode as MoveMode,
        dryRun: flags.dryRun ?? false,
        resume: flags.resume ?? false,
        abort: flags.abort ?? false,
        dropSource: flags.dropSource ?? false,
        onStep: (_step, detail) => out.info(detail),
      }),
    );
    print(out, result);
    done(result.outcome === 'dry-run' && result.preflight.some((c) => !c.ok) ? 1 : 0);
  });
}

function print(out: Output, result: MoveResult): void {
  if (out.json) {
    out.data(result);
    return;
  }
  if (result.outcome === 'dry-run') {
    out.line(`move of shard ${result.shard} from ${result.source} to ${result.target} (${result.mode}) — dry run, nothing changed`);
    for (const check of result.preflight) out.line(`  ${check.ok ? 'ok  ' : 'FAIL'} ${check.name}: ${check.message}`);
    out.line(`  steps: ${result.plan.join(' → ')}`);
    return;
  }
  if (result.outcome === 'aborted') {
    out.success(`move ${result.moveId} of shard ${result.shard} aborted: ${result.source} is writable again, nothing left on ${result.target}`);
    return;
  }
  out.line(
    `shard ${result.shard} moved from ${result.source} to ${result.target}: ${result.rowsMoved} rows verified, ` +
      `writes blocked ${result.writeBlockedMs === null ? 'not measured (resumed move)' : `${result.writeBlockedMs} ms`}, total ${seconds(result.durationMs)}`,
  );
}
