import { Command, CommanderError } from 'commander';
import { readFileSync } from 'node:fs';
import { registerAddSchema } from './add-schema.js';
import { registerAdopt } from './adopt.js';
import { registerConfig } from './config.js';
import type { CliContext } from './context.js';
import { registerDecode } from './decode.js';
import { registerDev } from './dev.js';
import { registerExec } from './exec.js';
import { registerInit } from './init.js';
import { loadLibrary } from './library.js';
import { registerGc } from './gc.js';
import { registerGrant } from './grant.js';
import { registerMap } from './map.js';
import { registerMigrate } from './migrate.js';
import { registerMigration } from './migration.js';
import { registerMoveShard } from './move-shard.js';
import { registerPsql } from './psql.js';
import { refuseRepeatedOptions } from './options.js';
import { Output, type Streams } from './output.js';
import { registerRebalance } from './rebalance.js';
import { registerStatus } from './status.js';

const VERSION = (
  JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')) as { version: string }
).version;

/**
 * Entry point: parses argv, runs one command, returns the exit code (0 ok, 1 failed at run time,
 * 2 bad usage or config, 3 a check found a problem). Never calls process.exit, so tests can run it.
 */
export async function main(
  argv: readonly string[],
  streams: Streams = defaultStreams(),
  cwd = process.cwd(),
): Promise<number> {
  let exitCode = 0;
  const program = new Command('shardctl');
  const ctx: CliContext = { streams, cwd, globalConfig: () => program.opts<{ config?: string }>().config };
  const done = (code: number): void => {
    exitCode = code;
  };
  program
    .description('Instagram-style sharded PostgreSQL: logical shard schemas over physical hosts, race-free 64-bit ids')
    .version(VERSION, '-V, --version')
    .option('-c, --config <file>', 'config file (default: $SHARDCTL_CONFIG or ./shardctl.yaml)')
    .exitOverride()
    .showHelpAfterError('(run shardctl --help for usage)')
    .configureOutput({
      writeOut: (text) => streams.stdout.write(text),
      writeErr: (text) => streams.stderr.write(text),
    });
  for (const register of [
    registerInit,
    registerAddSchema,
    registerAdopt,
    registerMigrate,
    registerMigration,
    registerStatus,
    registerMoveShard,
    registerRebalance,
    registerGc,
    registerGrant,
    registerExec,
    registerPsql,
    registerDecode,
    registerMap,
    registerConfig,
    registerDev,
  ]) {
    register(program, ctx, done);
  }
  for (const command of allCommands(program)) command.exitOverride();
  for (const command of [program, ...allCommands(program)]) refuseRepeatedOptions(command);
  // The library loads when a command runs: parsing argv, --help and usage errors need none of it.
  program.hook('preAction', async () => {
    const { registerSecret } = await loadLibrary();
    registerSecret(streams.env['PGPASSWORD']);
  });

  try {
    await program.parseAsync(argv as string[]);
    return exitCode;
  } catch (error) {
    if (error instanceof CommanderError) {
      // --help and --version exit 0; every parse error (unknown command or option) is usage: 2.
      if (error.exitCode === 0) return 0;
      // Commander has said it on stderr; a script reading --json gets it on stdout as well.
      if (argv.includes('--json')) {
        const { redactedJson, registerSecret } = await loadLibrary();
        registerSecret(streams.env['PGPASSWORD']);
        const message = error.message.replace(/^error: /, '');
        streams.stdout.write(`${redactedJson({ error: { code: 'USAGE', message, exitCode: 2 } }, 2)}\n`);
      }
      return 2;
    }
    const { registerSecret, UsageError } = await loadLibrary();
    registerSecret(streams.env['PGPASSWORD']);
    const json = argv.includes('--json');
    const out = new Output(streams, json);
    out.error(error);
    return error instanceof UsageError ? 2 : ((error as { exitCode?: number }).exitCode ?? 1);
  }
}

function allCommands(command: Command): Command[] {
  return command.commands.flatMap((c) => [c, ...allCommands(c)]);
}

function defaultStreams(): Streams {
  return { stdout: process.stdout, stderr: process.stderr, env: process.env };
}
