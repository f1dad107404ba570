import type { Command } from 'commander';
import { lib } from './library.js';
import { type CliContext, loadCliConfig } from './context.js';
import { type CommonFlags, configOption, jsonOption, withFlagNames } from './options.js';
import { Output } from './output.js';

export function registerMigration(program: Command, ctx: CliContext, done: (code: number) => void): void {
  const migration = program.command('migration').description('work on the migrations folder');
  const command = migration
    .command('new')
    .description('write the next NNNN_<name>.sql in the migrations folder, with a header on how it runs')
    .argument('<name>', 'letters, digits, _ . - (e.g. add_photo_views)')
    .option('--no-transaction', 'a file that runs outside a transaction (e.g. CREATE INDEX CONCURRENTLY)');
  [configOption, jsonOption].forEach((add) => add(command));
  command.action(async (name: string, flags: CommonFlags & { transaction: boolean }) => {
    const { newMigration } = lib();
    const out = new Output(ctx.streams, flags.json ?? false);
    const config = await loadCliConfig(ctx, flags, out);
    const result = await withFlagNames({ name: 'argument <name>' }, () =>
      newMigration(config, name, { noTransaction: !flags.transaction }),
    );
    if (out.json) out.data(result);
    else out.line(result.path);
    out.success(
      `migration new: wrote ${result.name}.sql (version ${result.version}${result.noTransaction ? ', no transaction' : ''})`,
    );
    done(0);
  });
}
