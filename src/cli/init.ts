import type { Command } from 'commander';
import { lib } from './library.js';
import { type CliContext, loadCliConfig } from './context.js';
import { type CommonFlags, configOption, dryRunOption, jsonOption } from './options.js';
import { Output } from './output.js';
import { runProvision } from './provision-report.js';

export function registerInit(program: Command, ctx: CliContext, done: (code: number) => void): void {
  const command = program
    .command('init')
    .description(
      'create the control schema and every mapped shard (schema, next_id, migrations) on every host; idempotent',
    );
  [configOption, dryRunOption, jsonOption].forEach((add) => add(command));
  command.action(async (flags: CommonFlags) => {
    const { init } = lib();
    const out = new Output(ctx.streams, flags.json ?? false);
    const config = await loadCliConfig(ctx, flags, out);
    done(await runProvision(out, 'init', (onProgress) => init(config, { dryRun: flags.dryRun ?? false, onProgress })));
  });
}
