import type { Command } from 'commander';
import { lib } from './library.js';
import { type CliContext, loadCliConfig } from './context.js';
import {
  type CommonFlags,
  configOption,
  confirmOrRefuse,
  dryRunOption,
  jsonOption,
  withFlagNames,
  yesOption,
} from './options.js';
import { Output, plural } from './output.js';

interface AdoptFlags extends CommonFlags {
  baseline?: string;
  shards?: string;
}

export function registerAdopt(program: Command, ctx: CliContext, done: (code: number) => void): void {
  const command = program
    .command('adopt')
    .description(
      'take over a fleet built from the Instagram article: check every mapped schema, replace its published next_id() in place, record the shards',
    );
  configOption(command);
  command.option(
    '--baseline <version>',
    'record the migrations up to this version as applied, after checking that what they create exists',
  );
  command.option('--shards <list>', 'adopt only these shards, e.g. 0-15,20');
  dryRunOption(command, 'print the SQL per host and change nothing');
  yesOption(command, 'replace next_id() without asking (required when not on a terminal)');
  jsonOption(command);
  command.action(async (flags: AdoptFlags) => {
    const { adopt, parseShards, UsageError } = lib();
    const out = new Output(ctx.streams, flags.json ?? false);
    const config = await loadCliConfig(ctx, flags, out);
    let baseline: number | undefined;
    if (flags.baseline !== undefined) {
      if (!/^\d{1,9}$/.test(flags.baseline) || Number(flags.baseline) === 0) {
        throw new UsageError(
          `option --baseline ${JSON.stringify(flags.baseline)}: not a migration version (a positive integer)`,
        );
      }
      baseline = Number(flags.baseline);
    }
    const names = { baseline: 'option --baseline', shards: 'option --shards' };
    const shards =
      flags.shards === undefined
        ? undefined
        : await withFlagNames(names, async () => parseShards(flags.shards!, config.shards));
    const options = { ...(baseline === undefined ? {} : { baseline }), ...(shards ? { shards } : {}) };
    if (!flags.dryRun && !flags.yes) {
      const plan = await withFlagNames(names, () => adopt(config, { ...options, dryRun: true }));
      const count = plan.hosts.reduce((n, h) => n + h.shards.filter((s) => s.sql !== null).length, 0);
      if (count > 0)
        await confirmOrRefuse(ctx.streams, `adopt ${plural(count, 'shard')} (next_id() replaced under live traffic)`);
    }
    const result = await withFlagNames(names, () => adopt(config, { ...options, dryRun: flags.dryRun ?? false }));
    // The SQL is data only in a dry run: a real run's JSON stays small on thousands of shards.
    if (out.json) {
      out.data(
        result.dryRun
          ? result
          : {
              ...result,
              hosts: result.hosts.map(({ controlSql: _, ...h }) => ({
                ...h,
                shards: h.shards.map(({ sql: __, ...s }) => s),
              })),
            },
      );
    } else if (flags.dryRun) {
      for (const host of result.hosts) {
        out.line(`-- host ${host.host}`);
        out.line(host.controlSql);
        for (const shard of host.shards) if (shard.sql !== null) out.line(shard.sql);
      }
    }
    for (const host of result.hosts) {
      const work = host.shards.filter((s) => s.sql !== null);
      const switching = work.filter((s) => s.action === 'switch').length;
      const recording = work.length - switching;
      const already = host.shards.length - work.length;
      const parts = result.dryRun
        ? [`${plural(switching, 'shard')} to switch`, ...(recording > 0 ? [`${recording} to record`] : [])]
        : [`${plural(host.switched, 'shard')} switched`, ...(host.recorded > 0 ? [`${host.recorded} recorded`] : [])];
      if (already > 0) parts.push(`${already} already shardctl's`);
      if (host.missing.length > 0)
        parts.push(`${plural(host.missing.length, 'mapped shard')} without a schema (shardctl init creates them)`);
      out.info(`${host.host}: ${parts.join(', ')}`);
      if (host.hostError) out.warn(`host ${host.host}: ${host.hostError}`);
      for (const f of host.failures)
        out.warn(`host ${host.host}, shard ${f.shard}: ${f.reason}; run shardctl adopt again`);
    }
    if (result.baseline)
      out.info(`baseline: ${result.baseline.files.join(', ')} recorded as applied${result.dryRun ? ' (dry run)' : ''}`);
    done(result.ok ? 0 : 1);
  });
}
