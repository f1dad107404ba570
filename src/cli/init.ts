import type { Command } from 'commander';
import { init } from '../commands/init.js';
import { type CliContext, type ConfigOption, loadCliConfig } from './context.js';
import { Output } from './output.js';
import { hostProgress, printProvisionResult } from './provision-report.js';

export function registerInit(program: Command, ctx: CliContext, done: (code: number) => void): void {
  program
    .command('init')
    .description('create the control schema and every mapped shard (schema, next_id, migrations) on every host; idempotent')
    .option('-c, --config <file>', 'config file (default: $SHARDCTL_CONFIG or ./shardctl.yaml)')
    .option('--dry-run', 'print the SQL plan and write nothing')
    .option('--json', 'print the result as JSON on stdout')
    .action(async (options: ConfigOption & { dryRun?: boolean; json?: boolean }) => {
      const out = new Output(ctx.streams, options.json ?? false);
      const config = await loadCliConfig(ctx, options, out);
      const progress = hostProgress(out);
      try {
        const result = await init(config, { dryRun: options.dryRun ?? false, onProgress: (e) => progress.update(e) });
        progress.stop();
        done(printProvisionResult(out, result, 'init'));
      } finally {
        progress.stop();
      }
    });
}
