import type { Command } from 'commander';
import { lib } from './library.js';
import { type CliContext, loadCliConfig } from './context.js';
import { type CommonFlags, configOption, dryRunOption, jsonOption, withFlagNames } from './options.js';
import { Output } from './output.js';
import { runProvision } from './provision-report.js';

export function registerAddSchema(program: Command, ctx: CliContext, done: (code: number) => void): void {
  const command = program
    .command('add-schema')
    .description('provision shards (e.g. 17 or 100-199) on their mapped hosts at the current migration level')
    .argument('<shards>', 'shard numbers: 17, 100-199, 1,5-9');
  [configOption, dryRunOption, jsonOption].forEach((add) => add(command));
  command.action(async (shardsText: string, flags: CommonFlags) => {
    const { addSchema, parseShards } = lib();
    const out = new Output(ctx.streams, flags.json ?? false);
    const config = await loadCliConfig(ctx, flags, out);
    const shards = await withFlagNames({ shards: 'argument <shards>' }, async () =>
      parseShards(shardsText, config.shards),
    );
    done(
      await runProvision(out, 'add-schema', (onProgress) =>
        addSchema(config, shards, { dryRun: flags.dryRun ?? false, onProgress }),
      ),
    );
  });
}
