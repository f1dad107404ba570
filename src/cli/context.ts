import { existsSync } from 'node:fs';
import path from 'node:path';
import type { ShardctlConfig } from '../index.js';
import { lib } from './library.js';
import { type CommonFlags, repeatedOption } from './options.js';
import type { Output, Streams } from './output.js';

/** What every command's action receives: the streams, and a way to load the config. */
export interface CliContext {
  readonly streams: Streams;
  readonly cwd: string;
  /** The global -c/--config, if given before the command name. */
  globalConfig(): string | undefined;
}

/** Loads the config named by -c, $SHARDCTL_CONFIG or ./shardctl.yaml, printing its warnings. */
export async function loadCliConfig(
  ctx: CliContext,
  options: CommonFlags,
  out: Output,
  settings: { checkMigrationsDir?: boolean } = {},
): Promise<ShardctlConfig> {
  const { loadConfig } = lib();
  const config = await loadConfig(namedConfig(ctx, options), {
    env: ctx.streams.env,
    cwd: ctx.cwd,
    ...(settings.checkMigrationsDir === undefined ? {} : { checkMigrationsDir: settings.checkMigrationsDir }),
  });
  for (const warning of config.warnings) out.warn(warning);
  return config;
}

/** For commands that work without a config (decode): load one only if it was named or exists. */
export async function loadOptionalConfig(
  ctx: CliContext,
  options: CommonFlags,
  out: Output,
): Promise<ShardctlConfig | null> {
  const { resolveConfigPath } = lib();
  const named = namedConfig(ctx, options) ?? ctx.streams.env['SHARDCTL_CONFIG'];
  if (!named && !existsSync(resolveConfigPath(undefined, ctx.streams.env, ctx.cwd))) return null;
  return loadCliConfig(ctx, options, out, { checkMigrationsDir: false });
}

/**
 * The file -c names, before the command name or after it. Both, naming different files, is a
 * usage error: which one was meant is unclear, and the command would silently take the second.
 */
function namedConfig(ctx: CliContext, options: CommonFlags): string | undefined {
  const before = ctx.globalConfig();
  const after = options.config;
  // An empty path (an unset variable in `-c "$CONFIG"`) would fall back to ./shardctl.yaml unsaid.
  if (before === '' || after === '')
    throw new (lib().UsageError)('option --config "": expected the path of a config file');
  if (before !== undefined && after !== undefined && path.resolve(ctx.cwd, before) !== path.resolve(ctx.cwd, after))
    throw new (lib().UsageError)(repeatedOption('--config', before, after));
  return after ?? before;
}
