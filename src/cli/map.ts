import type { Command } from 'commander';
import { lib } from './library.js';
import { type CliContext, loadCliConfig } from './context.js';
import { type CommonFlags, configOption, dryRunOption, jsonOption } from './options.js';
import { Output } from './output.js';

export function registerMap(program: Command, ctx: CliContext, done: (code: number) => void): void {
  const map = program
    .command('map')
    .description("the shard map as the fleet's hosts hold it: show it, or pull it into the config file");

  const show = map
    .command('show')
    .description(
      "print where each shard is, as the hosts say (the file's hosts and every host their registry names); exit 3 when the file disagrees",
    );
  configOption(show);
  jsonOption(show, 'print JSON');
  show.action(async (flags: CommonFlags) => {
    const { mapShow } = lib();
    const out = new Output(ctx.streams, flags.json ?? false);
    const config = await loadCliConfig(ctx, flags, out, { checkMigrationsDir: false });
    const result = await mapShow(config);
    const code =
      result.unreachable.length > 0 ? 1 : result.disagreements.length > 0 || result.problems.length > 0 ? 3 : 0;
    if (out.json) out.data({ ...result, exitCode: code });
    else {
      const fleet =
        result.fleetId ??
        (config.hosts.every((h) => result.unreachable.some((u) => u.name === h.name))
          ? '(unknown: no host could be read)'
          : '(none recorded: run init)');
      out.line(`fleet ${fleet}, placement version ${result.placementVersion}`);
      for (const h of result.hosts) {
        out.line(
          `${h.name}: ${h.count === 0 ? 'no shards' : `${h.count} shards: ${h.shards}`}${h.address ? ` — ${h.address}` : ''}${h.answered ? '' : ' (not read)'}`,
        );
        if (h.topology) {
          const t = h.topology;
          out.line(
            `  ${t.inRecovery ? 'a STANDBY (in recovery)' : 'primary'}${t.primary ? ` at ${t.primary}` : ''}; ` +
              (t.standbys.length === 0
                ? 'no standbys streaming from it'
                : `standbys: ${t.standbys.map((s) => lib().describeStandby(s)).join('; ')}`),
          );
        }
        if (h.fileAddress)
          out.line(
            `  the registry says ${h.address}, the file ${h.fileAddress} (after a failover: shardctl map set-address ${h.name})`,
          );
      }
      for (const u of result.unreachable) out.line(`${u.name}: UNREACHABLE: ${u.reason}`);
      for (const d of result.disagreements) out.line(`the file disagrees: ${d}`);
      if (result.disagreements.length > 0) out.line('update the file: shardctl map pull');
      for (const p of result.problems) out.line(`PROBLEM: ${p}`);
    }
    done(code);
  });

  const setAddress = map
    .command('set-address')
    .argument('<host>', 'the host whose address changed (a failover)')
    .argument('[url]', "its new address; default: the host's url in the config file (which may list several)")
    .description(
      "record a host's address in every host's registry after a failover (routers from seeds, or from an older config, follow it); refused unless the server there is that host's primary, of this fleet",
    );
  configOption(setAddress);
  dryRunOption(setAddress, 'check the address, change nothing');
  jsonOption(setAddress, 'print JSON');
  setAddress.action(async (host: string, url: string | undefined, flags: CommonFlags) => {
    const { mapSetAddress } = lib();
    const out = new Output(ctx.streams, flags.json ?? false);
    const config = await loadCliConfig(ctx, flags, out, { checkMigrationsDir: false });
    const result = await mapSetAddress(config, host, {
      ...(url !== undefined ? { url } : {}),
      dryRun: flags.dryRun ?? false,
    });
    const code = result.unreachable.length > 0 || result.stillWritable.length > 0 ? 1 : 0;
    if (out.json) out.data({ ...result, exitCode: code });
    else {
      out.line(
        `${result.host}: primary at ${result.primary ?? '?'}; registry address ${result.previous ?? '(none)'} → ${result.address}`,
      );
      if (!result.dryRun)
        out.line(
          result.updated.length > 0
            ? `updated the registry of ${result.updated.join(', ')}`
            : "updated no host's registry",
        );
      for (const u of result.unreachable)
        out.line(`${u.name}: UNREACHABLE, its registry not updated (run again): ${u.reason}`);
      for (const old of result.stillWritable)
        out.line(
          `${result.host}: TWO PRIMARIES: the old address ${old} still answers as a writable primary of ${result.host}; whatever reaches it (a router or a config file that names it) writes there, apart from the new primary. Stop it, or make it a standby of the new primary`,
        );
    }
    out.info(
      `map set-address: ${result.dryRun ? 'checked, nothing changed (dry run)' : result.unreachable.length > 0 ? 'some hosts were not updated' : 'done'}${result.stillWritable.length > 0 ? `; the old primary at ${result.stillWritable.join(', ')} still takes writes` : ''}`,
    );
    done(code);
  });

  const pull = map
    .command('pull')
    .description(
      "rewrite the config file's shard lists from the fleet, keeping comments, ${VAR} and layout; adds hosts the file lacks",
    );
  configOption(pull);
  dryRunOption(pull, 'print what would change, change nothing');
  jsonOption(pull, 'print JSON');
  pull.action(async (flags: CommonFlags) => {
    const { mapPull } = lib();
    const out = new Output(ctx.streams, flags.json ?? false);
    const config = await loadCliConfig(ctx, flags, out, { checkMigrationsDir: false });
    const result = await mapPull(config, { dryRun: flags.dryRun ?? false });
    if (out.json) out.data(result);
    else {
      for (const c of result.changes) out.line(`${result.dryRun ? 'would change' : 'changed'}: ${c}`);
      for (const h of result.addedHosts)
        out.line(
          `${result.dryRun ? 'would add' : 'added'} host ${h} (its url has no credentials: add them, or use PGUSER/PGPASSWORD/~/.pgpass)`,
        );
    }
    out.info(
      result.changes.length === 0
        ? `map pull: ${result.file} already agrees with the fleet (placement version ${result.placementVersion})`
        : `map pull: ${result.file} ${result.dryRun ? 'would be' : 'was'} updated to placement version ${result.placementVersion}`,
    );
    done(0);
  });
}
