import type { Command } from 'commander';
import { lib } from './library.js';
import type { CliContext } from './context.js';

export function registerConfig(program: Command, ctx: CliContext, done: (code: number) => void): void {
  const config = program.command('config').description('the config file: its JSON Schema');

  config
    .command('schema')
    .description(
      'print the JSON Schema of shardctl.yaml (for editors and CI validators; also shipped as shardctl.schema.json)',
    )
    .action(() => {
      const { configJsonSchema } = lib();
      ctx.streams.stdout.write(`${JSON.stringify(configJsonSchema(), null, 2)}\n`);
      done(0);
    });
}
