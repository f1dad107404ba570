import type { Command } from 'commander';
import { lib } from './library.js';
import { type CliContext, loadOptionalConfig } from './context.js';
import { type CommonFlags, configOption, jsonOption, withFlagNames } from './options.js';
import { Output } from './output.js';

/** How long decode waits for a host's word on where the shards are before it goes by the file. */
const DECODE_WAIT_MS = 2_000;

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
    // Hosts as the fleet places the shards; the file's where no host could be read. Not worth a
    // long wait (decode is what one runs while a host is in trouble): DECODE_WAIT_MS per host.
    let failure: unknown;
    const read = config
      ? await currentMap(config, 'shardctl decode', { waitMs: DECODE_WAIT_MS }).catch((error: unknown) => {
          failure = error;
          return null;
        })
      : null;
    const decoded = decodeIds(ids, read?.config ?? config);
    if (!config)
      out.info('decode: no config read, so no host (host -); pass -c FILE (or set SHARDCTL_CONFIG) to name it');
    else if (!read)
      out.info(
        `decode: hosts as the file places the shards: the fleet's placement could not be read (${failure instanceof Error ? failure.message : String(failure)})`,
      );
    else if (read.discovery.unreachable.length > 0)
      out.info(
        `decode: ${read.discovery.unreachable.map((u) => `${u.name} could not be read (${u.reason})`).join('; ')}; its shards' hosts are as the file and the other hosts say`,
      );
    if (out.json) out.data(decoded);
    else {
      for (const d of decoded) {
        out.line(`${d.id}  ${d.timestamp}  shard ${d.shard}  sequence ${d.sequence}  host ${d.host ?? '-'}`);
      }
    }
    done(0);
  });
}
