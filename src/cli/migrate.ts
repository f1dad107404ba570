import type { Command } from 'commander';
import { UsageError } from '../errors.js';
import { checkMigrations, migrate, type MigrationCheck } from '../commands/migrate.js';
import { type CliContext, type ConfigOption, loadCliConfig } from './context.js';
import { Output, plural } from './output.js';
import { hostProgress, printProvisionResult } from './provision-report.js';

export function registerMigrate(program: Command, ctx: CliContext, done: (code: number) => void): void {
  program
    .command('migrate')
    .description('apply pending migrations to every shard schema on every host; resumable, refuses on drift')
    .option('-c, --config <file>', 'config file (default: $SHARDCTL_CONFIG or ./shardctl.yaml)')
    .option('--dry-run', 'print the SQL plan and write nothing')
    .option('--check', 'write nothing; exit 3 when anything is pending or drifted, 0 when current')
    .option('--to <version>', 'apply migrations up to and including this version')
    .option('--json', 'print the result as JSON on stdout')
    .action(async (options: ConfigOption & { dryRun?: boolean; check?: boolean; to?: string; json?: boolean }) => {
      const out = new Output(ctx.streams, options.json ?? false);
      const toVersion = options.to === undefined ? undefined : parseVersion(options.to);
      const config = await loadCliConfig(ctx, options, out);
      if (options.check) {
        const check = await checkMigrations(config, toVersion === undefined ? {} : { toVersion });
        printCheck(out, check);
        done(check.exitCode);
        return;
      }
      const progress = hostProgress(out);
      try {
        const result = await migrate(config, {
          dryRun: options.dryRun ?? false,
          ...(toVersion === undefined ? {} : { toVersion }),
          onProgress: (e) => progress.update(e),
          onNotice: (m) => out.warn(m),
        });
        progress.stop();
        done(printProvisionResult(out, result, 'migrate'));
      } finally {
        progress.stop();
      }
    });
}

function printCheck(out: Output, check: MigrationCheck): void {
  if (out.json) out.data(check);
  for (const d of check.drift) out.info(`drift: ${d}`);
  for (const h of check.hosts) {
    if (h.error) out.info(`${h.host}: cannot be read: ${h.error}`);
    else if (h.shards > 0) {
      const files = h.pending.map((p) => `${p.name} on ${p.shards}`).join('; ');
      out.info(`${h.host}: ${plural(h.shards, 'shard')} behind (${plural(h.migrations, 'migration')} pending${files ? `: ${files}` : ''})`);
    }
  }
  const unread = check.hosts.filter((h) => h.error !== null).map((h) => h.host);
  const problems = [
    ...(check.drift.length > 0 ? [`drift found (${plural(check.drift.length, 'problem')})`] : []),
    ...(check.pending > 0 ? [`${plural(check.pending, 'migration')} pending`] : []),
    ...(unread.length > 0 ? [`${unread.join(', ')} could not be read`] : []),
  ];
  out.info(
    check.exitCode === 0
      ? `migrate --check: current (version ${check.targetVersion} on every shard)`
      : `migrate --check: ${problems.length > 0 ? problems.join(', ') : 'not current'}`,
  );
}

function parseVersion(text: string): number {
  if (!/^\d{1,9}$/.test(text) || Number(text) === 0) throw new UsageError(`option --to ${JSON.stringify(text)}: expected a migration version (a positive integer)`);
  return Number(text);
}
