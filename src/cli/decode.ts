import type { Command } from 'commander';
import { lib } from './library.js';
import { type CliContext, loadOptionalConfig } from './context.js';
import { type CommonFlags, configOption, jsonOption, withFlagNames } from './options.js';
import { Output } from './output.js';

export function registerDecode(program: Command, ctx: CliContext, done: (code: number) => void): void {
  const command = program
    .command('decode')
    .description('decode ids into timestamp (UTC), shard, sequence and host')
    .argument('<id...>', 'ids as decimal numbers');
  configOption(
    command,
    'config file for the id layout and the map (default: $SHARDCTL_CONFIG or ./shardctl.yaml if present)',
  );
  jsonOption(command, 'print JSON on stdout (ids as decimal strings)');
  command.action(async (ids: string[], options: CommonFlags) => {
    const { currentMap, decodeIds } = lib();
    const out = new Output(ctx.streams, options.json ?? false);
    const config = await loadOptionalConfig(ctx, options, out);
    await withFlagNames({ ids: 'argument <id...>' }, async () => decodeIds(ids, config));
    // Hosts as the fleet places the shards; the file's where no host could be read.
    const routed = config
      ? await currentMap(config, 'shardctl decode').then(
          (m) => m.config,
          () => config,
        )
      : null;
    const decoded = decodeIds(ids, routed);
    if (!config)
      out.info('decode: no config read, so no host (host -); pass -c FILE (or set SHARDCTL_CONFIG) to name it');
    if (out.json) out.data(decoded);
    else {
      for (const d of decoded) {
        out.line(`${d.id}  ${d.timestamp}  shard ${d.shard}  sequence ${d.sequence}  host ${d.host ?? '-'}`);
      }
    }
    done(0);
  });
}
