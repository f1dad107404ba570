import type { Command } from 'commander';
import { gc } from '../index.js';
import { type CliContext, loadCliConfig } from './context.js';
import { type CommonFlags, configOption, confirmOrRefuse, dryRunOption, jsonOption, yesOption } from './options.js';
import { Output, plural } from './output.js';

export function registerGc(program: Command, ctx: CliContext, done: (code: number) => void): void {
  const command = program
    .command('gc')
    .description('drop the fenced old copies that finished moves left behind (asks first; --dry-run lists them)');
  configOption(command);
  dryRunOption(command, 'list the old copies, drop nothing');
  yesOption(command, 'drop without asking (required when not on a terminal)');
  jsonOption(command, 'print JSON');
  command.action(async (flags: CommonFlags) => {
    const out = new Output(ctx.streams, flags.json ?? false);
    const config = await loadCliConfig(ctx, flags, out);
    if (!flags.dryRun && !flags.yes) {
      const found = await gc(config, { dryRun: true });
      for (const c of found) out.info(`${c.host}: shard ${c.shard} (${c.schema})`);
      if (found.length > 0) await confirmOrRefuse(ctx.streams, `drop ${plural(found.length, 'old copy', 'old copies')}`);
    }
    const copies = await gc(config, { dryRun: flags.dryRun ?? false });
    if (out.json) out.data(copies);
    else for (const c of copies) out.line(`${c.host}: shard ${c.shard} (${c.schema})${flags.dryRun ? '' : ' dropped'}`);
    out.info(`gc: ${plural(copies.length, 'old copy', 'old copies')} ${flags.dryRun ? 'found' : 'dropped'}`);
    done(0);
  });
}
