import { existsSync } from 'node:fs';
import type { ShardctlConfig } from '../index.js';
import { lib } from './library.js';
import type { CommonFlags } from './options.js';
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
  const config = await loadConfig(options.config ?? ctx.globalConfig(), {
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
  const named = options.config ?? ctx.globalConfig() ?? ctx.streams.env['SHARDCTL_CONFIG'];
  if (!named && !existsSync(resolveConfigPath(undefined, ctx.streams.env, ctx.cwd))) return null;
  return loadCliConfig(ctx, options, out, { checkMigrationsDir: false });
}
