import type { Command } from 'commander';
import type { MigrationCheck } from '../index.js';
import { lib } from './library.js';
import { type CliContext, loadCliConfig } from './context.js';
import {
  type CommonFlags,
  configOption,
  dryRunOption,
  jsonOption,
  parseHostListOption,
  withFlagNames,
} from './options.js';
import { Output, plural } from './output.js';
import { runProvision } from './provision-report.js';

export function registerMigrate(program: Command, ctx: CliContext, done: (code: number) => void): void {
  const command = program
    .command('migrate')
    .description('apply pending migrations to every shard schema on every host; resumable, refuses on drift')
    .option('--check', 'write nothing; exit 3 when anything is pending or drifted, 0 when current')
    .option('--to <version>', 'apply migrations up to and including this version')
    .option('--shards <list>', 'a stage: only these shards (17, 100-199, 1,5-9)')
    .option('--hosts <names>', 'a stage: only the shards of these hosts (pg1,pg2)')
    .option(
      '--canary <n>',
      'a stage: n shards with pending work, spread over the hosts; then stop and say how to go on',
    )
    .option('--max-failures <n>', 'stop starting shards once n have failed (default: every host finishes its list)')
    .option(
      '--lock-retries <n>',
      'times a shard that meets lock_timeout is tried again, with growing pauses (default 3)',
    );
  [configOption, dryRunOption, jsonOption].forEach((add) => add(command));
  command.action(async (flags: MigrateFlags) => {
    const { checkMigrations, migrate, parseShards, UsageError } = lib();
    const out = new Output(ctx.streams, flags.json ?? false);
    const toVersion = flags.to === undefined ? undefined : parseVersion(flags.to);
    const canary = count(flags.canary, '--canary', 1);
    const maxFailures = count(flags.maxFailures, '--max-failures', 1);
    const lockRetries = count(flags.lockRetries, '--lock-retries', 0);
    const hosts = flags.hosts === undefined ? undefined : parseHostListOption('--hosts', flags.hosts);
    const config = await loadCliConfig(ctx, flags, out);
    await withFlagNames(
      {
        toVersion: 'option --to',
        shards: 'option --shards',
        hosts: 'option --hosts',
        canary: 'option --canary',
        maxFailures: 'option --max-failures',
        lockRetries: 'option --lock-retries',
      },
      async () => {
        const shards = flags.shards === undefined ? undefined : parseShards(flags.shards, config.shards);
        if (flags.check) {
          const staged = (['shards', 'hosts', 'canary', 'maxFailures', 'lockRetries'] as const).filter(
            (k) => flags[k] !== undefined,
          );
          if (staged.length > 0)
            throw new UsageError(
              `option --check looks at every shard and writes nothing; it takes no ${staged.map(flagName).join(', ')}`,
            );
          const check = await checkMigrations(config, toVersion === undefined ? {} : { toVersion });
          done(printCheck(out, check));
          return;
        }
        done(
          await runProvision(out, 'migrate', (onProgress) =>
            migrate(config, {
              dryRun: flags.dryRun ?? false,
              ...(toVersion === undefined ? {} : { toVersion }),
              ...(shards === undefined ? {} : { shards }),
              ...(hosts === undefined ? {} : { hosts }),
              ...(canary === undefined ? {} : { canary }),
              ...(maxFailures === undefined ? {} : { maxFailures }),
              ...(lockRetries === undefined ? {} : { lockRetries }),
              onProgress,
              onNotice: (m) => out.warn(m),
            }),
          ),
        );
      },
    );
  });
}

interface MigrateFlags extends CommonFlags {
  check?: boolean;
  to?: string;
  shards?: string;
  hosts?: string;
  canary?: string;
  maxFailures?: string;
  lockRetries?: string;
}

function flagName(key: string): string {
  return `--${key.replace(/[A-Z]/g, (c) => `-${c.toLowerCase()}`)}`;
}

/**
 * A count flag: a whole number from `least` to 999999, or a usage error naming the flag, the value
 * and the range (the bound said too: "at least 0" reads as wrong of 1000000).
 */
function count(text: string | undefined, flag: string, least: number): number | undefined {
  if (text === undefined) return undefined;
  const { UsageError } = lib();
  if (!/^\d{1,6}$/.test(text) || Number(text) < least)
    throw new UsageError(`option ${flag} ${JSON.stringify(text)}: expected a whole number from ${least} to 999999`);
  return Number(text);
}

/** Prints the check; exit code 0 current, 3 pending or drift, 1 a host could not be read. */
function printCheck(out: Output, check: MigrationCheck): number {
  const exitCode = check.unreadHosts.length > 0 ? 1 : check.current ? 0 : 3;
  if (out.json) out.data({ ...check, exitCode });
  for (const d of check.drift) out.info(`drift: ${d}`);
  for (const line of lib().describeRollout(check.rollout)) out.info(`rollout: ${line}`);
  for (const h of check.hosts) {
    if (h.error) out.info(`${h.host}: cannot be read: ${h.error}`);
    else if (h.shards > 0) {
      const files = h.pending.map((p) => `${p.name} on ${p.shards}`).join('; ');
      out.info(
        `${h.host}: ${plural(h.shards, 'shard')} behind (${plural(h.migrations, 'migration')} pending${files ? `: ${files}` : ''})`,
      );
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
  if (!/^\d{1,9}$/.test(text) || Number(text) === 0)
    throw new UsageError(`option --to ${JSON.stringify(text)}: expected a migration version (a positive integer)`);
  return Number(text);
}
