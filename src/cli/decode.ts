import type { Command } from 'commander';
import { decodeIds } from '../commands/decode.js';
import { type CliContext, type ConfigOption, loadOptionalConfig } from './context.js';
import { Output } from './output.js';

export function registerDecode(program: Command, ctx: CliContext, done: (code: number) => void): void {
  program
    .command('decode')
    .description('decode ids into timestamp (UTC), shard, sequence and host')
    .argument('<id...>', 'ids as decimal numbers')
    .option('-c, --config <file>', 'config file for the id layout and the map (default: $SHARDCTL_CONFIG or ./shardctl.yaml if present)')
    .option('--json', 'print JSON on stdout (ids as decimal strings)')
    .action(async (ids: string[], options: ConfigOption & { json?: boolean }) => {
      const out = new Output(ctx.streams, options.json ?? false);
      const config = await loadOptionalConfig(ctx, options, out);
      const decoded = decodeIds(ids, config);
      if (out.json) out.data(decoded);
      else {
        for (const d of decoded) {
          out.line(`${d.id}  ${d.timestamp}  shard ${d.shard}  sequence ${d.sequence}  host ${d.host ?? '-'}`);
        }
      }
      done(0);
    });
}
