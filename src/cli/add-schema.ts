import type { Command } from 'commander';
import { addSchema, parseShardArgument } from '../commands/add-schema.js';
import { type CliContext, type ConfigOption, loadCliConfig } from './context.js';
import { Output } from './output.js';
import { hostProgress, printProvisionResult } from './provision-report.js';

export function registerAddSchema(program: Command, ctx: CliContext, done: (code: number) => void): void {
  program
    .command('add-schema')
    .description('provision shards (e.g. 17 or 100-199) on their mapped hosts at the current migration level')
    .argument('<shards>', 'shard numbers: 17, 100-199, 1,5-9')
    .option('-c, --config <file>', 'config file (default: $SHARDCTL_CONFIG or ./shardctl.yaml)')
    .option('--dry-run', 'print the SQL plan and write nothing')
    .option('--json', 'print the result as JSON on stdout')
    .action(async (shardsText: string, options: ConfigOption & { dryRun?: boolean; json?: boolean }) => {
      const out = new Output(ctx.streams, options.json ?? false);
      const config = await loadCliConfig(ctx, options, out);
      const shards = parseShardArgument(shardsText, config);
      const progress = hostProgress(out);
      try {
        const result = await addSchema(config, shards, { dryRun: options.dryRun ?? false, onProgress: (e) => progress.update(e) });
        progress.stop();
        done(printProvisionResult(out, result, 'add-schema'));
      } finally {
        progress.stop();
      }
    });
}
