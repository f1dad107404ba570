import type { Command } from 'commander';
import { lib } from './library.js';
import { type CliContext, loadCliConfig } from './context.js';
import { type CommonFlags, configOption, dryRunOption, jsonOption } from './options.js';
import { Output, plural } from './output.js';

interface GrantFlags extends CommonFlags {
  app?: boolean;
  readonly?: boolean;
}

export function registerGrant(program: Command, ctx: CliContext, done: (code: number) => void): void {
  const command = program
    .command('grant')
    .argument('<role>', 'an existing role (CREATE ROLE … LOGIN first)')
    .description(
      "give an existing role exactly what an application (--app) or a read-only client (--readonly) needs on every shard and on the control schema's placement, on every host",
    )
    .option(
      '--app',
      'read and write rows: SELECT, INSERT, UPDATE, DELETE on the shard tables, USAGE on their sequences',
    )
    .option('--readonly', 'read rows only: SELECT on the shard tables and sequences');
  configOption(command);
  dryRunOption(command, 'print the GRANT statements per host and grant nothing');
  jsonOption(command, 'print JSON');
  command.action(async (role: string, flags: GrantFlags) => {
    const { grant, UsageError } = lib();
    if (Boolean(flags.app) === Boolean(flags.readonly))
      throw new UsageError('give exactly one of --app and --readonly', { input: '--app/--readonly' });
    const out = new Output(ctx.streams, flags.json ?? false);
    const config = await loadCliConfig(ctx, flags, out);
    const result = await grant(config, role, flags.app ? 'app' : 'readonly', { dryRun: flags.dryRun ?? false });
    if (out.json) out.data(result);
    else if (flags.dryRun) for (const h of result.hosts) out.line(`-- host ${h.host}\n${h.sql.join('\n')}`);
    const schemas = result.hosts.reduce((n, h) => n + h.schemas, 0);
    out.info(
      `grant: ${result.mode} ${flags.dryRun ? 'would be granted' : 'granted'} to ${role} on ${plural(schemas, 'shard schema')} and the control schema's placement; ${plural(result.hosts.length, 'host')}`,
    );
    done(0);
  });
}
