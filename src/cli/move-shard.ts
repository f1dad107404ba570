import type { Command } from 'commander';
import { createInterface } from 'node:readline/promises';
import { UsageError } from '../errors.js';
import { moveShard, type MoveResult } from '../moves/move.js';
import type { MoveMode } from '../moves/state.js';
import { type CliContext, type ConfigOption, loadCliConfig } from './context.js';
import { Output, seconds } from './output.js';

interface MoveFlags extends ConfigOption {
  to?: string;
  mode?: string;
  dryRun?: boolean;
  resume?: boolean;
  abort?: boolean;
  yes?: boolean;
  json?: boolean;
  dropSource?: boolean;
}

export function registerMoveShard(program: Command, ctx: CliContext, done: (code: number) => void): void {
  program
    .command('move-shard')
    .description('move a logical shard to another host (online with logical replication, or offline), resumable')
    .argument('<shard>', 'the shard number')
    .option('--to <host>', 'the host to move it to (a name from the map)')
    .option('--mode <mode>', 'online (logical replication, PostgreSQL 15+) or offline (writes fenced during the copy)', 'online')
    .option('--dry-run', 'print the plan and the preflight results; change nothing')
    .option('--resume', 'finish the unfinished move of this shard')
    .option('--abort', 'undo the unfinished move of this shard')
    .option('--drop-source', 'drop the old copy right after the switch instead of keeping it until gc')
    .option('--yes', 'do not ask for confirmation')
    .option('-c, --config <file>', 'config file (default: $SHARDCTL_CONFIG or ./shardctl.yaml); rewritten in place at the switch')
    .option('--json', 'print the result as JSON on stdout')
    .action(async (shardText: string, flags: MoveFlags) => {
      const out = new Output(ctx.streams, flags.json ?? false);
      if (!/^\d{1,7}$/.test(shardText)) throw new UsageError(`argument <shard> ${JSON.stringify(shardText)}: expected a shard number`);
      if (flags.mode !== 'online' && flags.mode !== 'offline') {
        throw new UsageError(`option --mode ${JSON.stringify(flags.mode)}: expected online or offline`);
      }
      const config = await loadCliConfig(ctx, flags, out);
      const shard = Number(shardText);
      if (!flags.dryRun && !flags.yes) {
        const what = flags.abort ? `undo the unfinished move of shard ${shard}` : flags.resume ? `finish the move of shard ${shard}` : `move shard ${shard} to ${flags.to}`;
        if (!(await confirm(`${what}? [y/N] `))) {
          throw new UsageError(`not confirmed: pass --yes to ${what} without a prompt`);
        }
      }
      const result = await moveShard(config, shard, flags.to, {
        mode: flags.mode as MoveMode,
        dryRun: flags.dryRun ?? false,
        resume: flags.resume ?? false,
        abort: flags.abort ?? false,
        dropSource: flags.dropSource ?? false,
        onStep: (_step, detail) => out.info(detail),
      });
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

async function confirm(question: string): Promise<boolean> {
  if (!process.stdin.isTTY) return false;
  const rl = createInterface({ input: process.stdin, output: process.stderr });
  try {
    return /^y(es)?$/i.test((await rl.question(question)).trim());
  } finally {
    rl.close();
  }
}
