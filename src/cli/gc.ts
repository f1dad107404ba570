import type { Command } from 'commander';
import { createInterface } from 'node:readline/promises';
import { UsageError } from '../errors.js';
import { gc } from '../commands/gc.js';
import { type CliContext, type ConfigOption, loadCliConfig } from './context.js';
import { Output, plural } from './output.js';

export function registerGc(program: Command, ctx: CliContext, done: (code: number) => void): void {
  program
    .command('gc')
    .description('drop the fenced old copies that finished moves left behind (asks first; --dry-run lists them)')
    .option('-c, --config <file>', 'config file (default: $SHARDCTL_CONFIG or ./shardctl.yaml)')
    .option('--dry-run', 'list the old copies, drop nothing')
    .option('--yes', 'drop without asking (required when not on a terminal)')
    .option('--json', 'print JSON')
    .action(async (flags: ConfigOption & { dryRun?: boolean; yes?: boolean; json?: boolean }) => {
      const out = new Output(ctx.streams, flags.json ?? false);
      const config = await loadCliConfig(ctx, flags, out);
      if (!flags.dryRun && !flags.yes) {
        if (!process.stdin.isTTY) throw new UsageError('gc drops data: pass --yes (or --dry-run to list what it would drop)');
        const found = await gc(config, { dryRun: true });
        for (const c of found) out.info(`${c.host}: shard ${c.shard} (${c.schema})`);
        if (found.length > 0 && !(await confirm(`drop ${plural(found.length, 'old copy', 'old copies')}? [y/N] `))) {
          throw new UsageError('not confirmed: pass --yes to drop the old copies without a prompt');
        }
      }
      const copies = await gc(config, { dryRun: flags.dryRun ?? false });
      if (out.json) out.data(copies);
      else for (const c of copies) out.line(`${c.host}: shard ${c.shard} (${c.schema})${flags.dryRun ? '' : ' dropped'}`);
      out.info(`gc: ${plural(copies.length, 'old copy', 'old copies')} ${flags.dryRun ? 'found' : 'dropped'}`);
      done(0);
    });
}

async function confirm(question: string): Promise<boolean> {
  const rl = createInterface({ input: process.stdin, output: process.stderr });
  try {
    return /^y(es)?$/i.test((await rl.question(question)).trim());
  } finally {
    rl.close();
  }
}
