import type { Command } from 'commander';
import { lib } from './library.js';
import { type CliContext, loadCliConfig } from './context.js';
import { type CommonFlags, configOption, confirmOrRefuse, dryRunOption, jsonOption, yesOption } from './options.js';
import { Output, plural } from './output.js';
import type { LeftTrigger } from '../index.js';

export function registerGc(program: Command, ctx: CliContext, done: (code: number) => void): void {
  const command = program
    .command('gc')
    .description('drop the fenced old copies that finished moves left behind (asks first; --dry-run lists them)');
  configOption(command);
  dryRunOption(command, 'list the old copies, drop nothing');
  yesOption(command, 'drop without asking (required when not on a terminal)');
  jsonOption(command, 'print JSON');
  command.action(async (flags: CommonFlags) => {
    const { gc } = lib();
    const out = new Output(ctx.streams, flags.json ?? false);
    const config = await loadCliConfig(ctx, flags, out);
    if (!flags.dryRun && !flags.yes) {
      const found = await gc(config, { dryRun: true });
      for (const c of found.oldCopies) out.info(`${c.host}: shard ${c.shard} (${c.schema})`);
      for (const l of found.leftovers) out.info(`${l.host}: ${l.kind} ${l.name} left by a killed run`);
      for (const t of found.triggers) out.info(`${t.host}: ${triggerText(t)} left by a move`);
      const count = found.oldCopies.length + found.leftovers.length + found.triggers.length;
      if (count > 0) {
        const what = [
          ...(found.oldCopies.length > 0 ? [plural(found.oldCopies.length, 'old copy', 'old copies')] : []),
          ...(found.leftovers.length > 0 ? [plural(found.leftovers.length, 'leftover')] : []),
          ...(found.triggers.length > 0 ? [plural(found.triggers.length, 'trigger')] : []),
        ].join(' and ');
        await confirmOrRefuse(ctx.streams, `drop ${what}`);
      }
    }
    const result = await gc(config, { dryRun: flags.dryRun ?? false });
    if (out.json) out.data(result);
    else {
      for (const c of result.oldCopies)
        out.line(`${c.host}: shard ${c.shard} (${c.schema})${flags.dryRun ? '' : ' dropped'}`);
      for (const l of result.leftovers) out.line(`${l.host}: ${l.kind} ${l.name}${flags.dryRun ? '' : ' dropped'}`);
      for (const t of result.triggers)
        out.line(
          `${t.host}: ${triggerText(t)}${flags.dryRun ? '' : t.dropped ? ' dropped' : ` kept: ${t.kept ?? 'not dropped'} (run gc again)`}`,
        );
    }
    const leftovers = result.leftovers.length > 0 ? ` and ${plural(result.leftovers.length, 'leftover')}` : '';
    const dropped = result.triggers.filter((t) => flags.dryRun || t.dropped).length;
    const triggers = dropped > 0 ? ` and ${plural(dropped, 'trigger')}` : '';
    const kept = result.triggers.length - dropped;
    out.info(
      `gc: ${plural(result.oldCopies.length, 'old copy', 'old copies')}${leftovers}${triggers} ${flags.dryRun ? 'found' : 'dropped'}` +
        (kept > 0 ? `; ${plural(kept, 'trigger')} kept` : ''),
    );
    done(0);
  });
}

function triggerText(t: LeftTrigger): string {
  return `trigger ${t.trigger} on ${t.schema}.${t.table} (shard ${t.shard})`;
}
