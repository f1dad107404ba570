import { spawn } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import type { Command } from 'commander';
import { lib } from './library.js';
import { type CliContext, loadCliConfig } from './context.js';
import { configOption, type CommonFlags as ConfigOption } from './options.js';
import { Output } from './output.js';

interface PsqlFlags extends ConfigOption {
  key?: string;
  id?: string;
}

export function registerPsql(program: Command, ctx: CliContext, done: (code: number) => void): void {
  const command = program
    .command('psql')
    .description(
      "open psql on a shard's host with search_path set to its schema (the password goes through PGPASSWORD, never the command line)",
    )
    .argument('[shard]', 'the shard number')
    .option('--key <key>', 'the shard of this key (key mod shards), e.g. a user id')
    .option('--id <id>', 'the shard this id carries');
  configOption(command);
  command.action(async (shardText: string | undefined, flags: PsqlFlags) => {
    const { currentMap, decodeId, findPsql, MAX_KEY, parseIdString, psqlInvocation, shardForKey, UsageError } = lib();
    const given = [shardText !== undefined, flags.key !== undefined, flags.id !== undefined].filter(Boolean).length;
    if (given !== 1) throw new UsageError('give exactly one of <shard>, --key K or --id ID');
    if (shardText !== undefined && !/^\d{1,7}$/.test(shardText)) {
      throw new UsageError(`argument <shard> ${JSON.stringify(shardText)}: expected a shard number`);
    }
    if (flags.key !== undefined && (!/^\d{1,19}$/.test(flags.key) || BigInt(flags.key) > MAX_KEY)) {
      throw new UsageError(
        `option --key ${JSON.stringify(flags.key)}: expected a whole number from 0 to 2^63 - 1 (a PostgreSQL bigint)`,
      );
    }
    const id = flags.id === undefined ? undefined : parseIdString(flags.id);
    if (flags.id !== undefined && id === undefined) {
      throw new UsageError(`option --id ${JSON.stringify(flags.id)}: expected a decimal 64-bit id`);
    }
    const out = new Output(ctx.streams, false);
    const config = await loadCliConfig(ctx, flags, out, { checkMigrationsDir: false });
    const shard =
      shardText !== undefined
        ? Number(shardText)
        : flags.key !== undefined
          ? shardForKey(BigInt(flags.key), config.shards)
          : decodeId(id!, config.idLayout).shard;
    if (shard >= config.shards) {
      const what =
        shardText !== undefined ? `argument <shard> ${shardText}` : `option --id ${flags.id} (carries shard ${shard})`;
      throw new UsageError(`${what}: not in the map (0-${config.shards - 1})`);
    }
    // The fleet's placement, not the file's: a shard another operator moved is found where it is.
    const invocation = psqlInvocation((await currentMap(config, 'shardctl psql')).config, shard, ctx.streams.env);
    const psql = findPsql(ctx.streams.env);
    if (!psql) {
      out.info(
        `psql is not on PATH (install the PostgreSQL client, or set SHARDCTL_PSQL). Shard ${shard} is ${invocation.schema} on ${invocation.host}:`,
      );
      out.line(invocation.display.url);
      out.info(`connect with PGOPTIONS='${invocation.display.pgOptions}' so that search_path is ${invocation.schema}`);
      done(1);
      return;
    }
    out.info(`shard ${shard}: ${invocation.schema} on ${invocation.host} (${invocation.display.url})`);
    // psql's own codes (2: its connection failed or was lost; 3: a script error) mean something else
    // here (2: bad usage, 3: a check found a problem): any failure of psql is a failure at run time.
    const finish = (code: number): void => {
      if (code !== 0)
        out.info(`psql ended with exit code ${code} (shard ${shard}, ${invocation.schema} on ${invocation.host})`);
      done(code === 0 ? 0 : 1);
    };
    if (invocation.serviceFile === undefined) {
      finish(await runPsql(psql, invocation.args, invocation.env));
      return;
    }
    // The sslpassword, which libpq reads from no environment variable, in a service file only this
    // user can read, for as long as psql runs.
    const dir = await mkdtemp(path.join(os.tmpdir(), 'shardctl-psql-'));
    try {
      const file = path.join(dir, 'pg_service.conf');
      await writeFile(file, invocation.serviceFile, { mode: 0o600 });
      finish(await runPsql(psql, invocation.args, { ...invocation.env, PGSERVICEFILE: file }));
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });
}

/** Runs psql on the terminal; resolves with its exit code. */
function runPsql(file: string, args: readonly string[], env: Record<string, string>): Promise<number> {
  const { UsageError } = lib();
  return new Promise((resolve, reject) => {
    const child = spawn(file, args, { stdio: 'inherit', env });
    // psql handles Ctrl-C itself (it cancels the query); shardctl must not die of it meanwhile.
    const ignore = (): void => undefined;
    process.on('SIGINT', ignore);
    child.once('error', (error) => {
      process.off('SIGINT', ignore);
      reject(new UsageError(`cannot run ${file}: ${error.message}`));
    });
    child.once('exit', (code, signal) => {
      process.off('SIGINT', ignore);
      resolve(code ?? (signal ? 1 : 0));
    });
  });
}
