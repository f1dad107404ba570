import type { Command } from 'commander';
import type { MigrationCheck } from '../index.js';
import { lib } from './library.js';
import { type CliContext, loadCliConfig } from './context.js';
import { type CommonFlags, configOption, dryRunOption, jsonOption, withFlagNames } from './options.js';
import { Output, plural } from './output.js';
import { runProvision } from './provision-report.js';

export function registerMigrate(program: Command, ctx: CliContext, done: (code: number) => void): void {
  const command = program
    .command('migrate')
    .description('apply pending migrations to every shard schema on every host; resumable, refuses on drift')
    .option('--check', 'write nothing; exit 3 when anything is pending or drifted, 0 when current')
    .option('--to <version>', 'apply migrations up to and including this version');
  [configOption, dryRunOption, jsonOption].forEach((add) => add(command));
  command.action(async (flags: CommonFlags & { check?: boolean; to?: string }) => {
    const { checkMigrations, migrate } = lib();
    const out = new Output(ctx.streams, flags.json ?? false);
    const toVersion = flags.to === undefined ? undefined : parseVersion(flags.to);
    const config = await loadCliConfig(ctx, flags, out);
    await withFlagNames({ toVersion: 'option --to' }, async () => {
      if (flags.check) {
        const check = await checkMigrations(config, toVersion === undefined ? {} : { toVersion });
        done(printCheck(out, check));
        return;
      }
      done(
        await runProvision(out, 'migrate', (onProgress) =>
          migrate(config, {
            dryRun: flags.dryRun ?? false,
            ...(toVersion === undefined ? {} : { toVersion }),
            onProgress,
            onNotice: (m) => out.warn(m),
          }),
        ),
      );
    });
  });
}

/** Prints the check; exit code 0 current, 3 pending or drift, 1 a host could not be read. */
function printCheck(out: Output, check: MigrationCheck): number {
  const exitCode = check.unreadHosts.length > 0 ? 1 : check.current ? 0 : 3;
  if (out.json) out.data({ ...check, exitCode });
  for (const d of check.drift) out.info(`drift: ${d}`);
  for (const h of check.hosts) {
    if (h.error) out.info(`${h.host}: cannot be read: ${h.error}`);
    else if (h.shards > 0) {
      const files = h.pending.map((p) => `${p.name} on ${p.shards}`).join('; ');
      out.info(`${h.host}: ${plural(h.shards, 'shard')} behind (${plural(h.migrations, 'migration')} pending${files ? `: ${files}` : ''})`);
    }
  }
  const unread = check.unreadHosts;
  const problems = [
    ...(check.drift.length > 0 ? [`drift found (${plural(check.drift.length, 'problem')})`] : []),
    ...(check.pending > 0 ? [`${plural(check.pending, 'migration')} pending`] : []),
    ...(unread.length > 0 ? [`${unread.join(', ')} could not be read`] : []),
  ];
  out.info(
    exitCode === 0
      ? `migrate --check: current (version ${check.targetVersion} on every shard)`
      : `migrate --check: ${problems.length > 0 ? problems.join(', ') : 'not current'}`,
  );
  return exitCode;
}

function parseVersion(text: string): number {
  const { UsageError } = lib();
  if (!/^\d{1,9}$/.test(text) || Number(text) === 0) throw new UsageError(`option --to ${JSON.stringify(text)}: expected a migration version (a positive integer)`);
  return Number(text);
}
