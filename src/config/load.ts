/**
 * Reads and validates the config map (shardctl.yaml): the file (text.ts), the fields against the
 * schema and then across fields (validate.ts). Every problem is collected and reported at once in
 * a single ConfigError, each naming the field and the offending value, so a broken file is fixed
 * in one pass instead of one error per run.
 */
import { readFile, stat } from 'node:fs/promises';
import path from 'node:path';
import { ConfigError, type ConfigIssue } from '../errors.js';
import type { Env } from './env.js';
import { parseJson, parseYaml, unreadableFileMessage } from './text.js';
import type { ShardctlConfig } from './types.js';
import { validateConfig } from './validate.js';

export const DEFAULT_CONFIG_FILE = 'shardctl.yaml';

export interface ParseConfigOptions {
  /** Where the text came from; relative paths (e.g. migrations) resolve against its folder. */
  file: string;
  /** Defaults to the file's extension: .json → JSON, anything else → YAML. */
  format?: 'yaml' | 'json';
  /** For ${VAR} in host URLs; defaults to process.env. */
  env?: Env;
  /** The moment the id layout is checked against; defaults to now. */
  now?: Date;
  /** Refuse a migrations folder that does not exist (default true). */
  checkMigrationsDir?: boolean;
  /** Resolves a relative `file`; defaults to process.cwd(). */
  cwd?: string;
}

export interface LoadConfigOptions {
  env?: Env;
  now?: Date;
  cwd?: string;
  checkMigrationsDir?: boolean;
}

/** The config file to read: the argument, else $SHARDCTL_CONFIG, else ./shardctl.yaml; absolute. */
export function resolveConfigPath(file?: string, env: Env = process.env, cwd: string = process.cwd()): string {
  const chosen = file || env['SHARDCTL_CONFIG'] || DEFAULT_CONFIG_FILE;
  return path.resolve(cwd, chosen);
}

export async function loadConfig(file?: string, options: LoadConfigOptions = {}): Promise<ShardctlConfig> {
  const env = options.env ?? process.env;
  const configPath = resolveConfigPath(file, env, options.cwd);
  let text: string;
  try {
    // stat first: opening a FIFO for reading would wait for a writer forever.
    const info = await stat(configPath);
    const refusal = info.isDirectory() ? undefined : notAConfigFile(configPath, info);
    if (refusal) throw new ConfigError(configPath, [{ path: '', message: refusal }]);
    text = await readFile(configPath, 'utf8');
  } catch (error) {
    if (error instanceof ConfigError) throw error;
    throw new ConfigError(configPath, [{ path: '', message: unreadableFileMessage(configPath, error) }]);
  }
  return parseConfig(text, { ...options, env, file: configPath });
}

/**
 * A map of thousands of shards is a few kilobytes; a config larger than this is a mistake, and
 * parsing it (YAML keeps every node) would take many times its size in memory.
 */
export const MAX_CONFIG_BYTES = 1024 * 1024;

function notAConfigFile(configPath: string, info: { isFile(): boolean; size: number }): string | undefined {
  if (!info.isFile())
    return `config file ${configPath} is not a regular file (a FIFO, socket or device); pass the path of a file`;
  if (info.size > MAX_CONFIG_BYTES) return tooLarge(configPath, info.size);
  return undefined;
}

function tooLarge(file: string, bytes: number): string {
  return `config file ${file} is ${(bytes / 1024 / 1024).toFixed(1)} MiB; a config is at most ${MAX_CONFIG_BYTES / 1024 / 1024} MiB`;
}

export function parseConfig(text: string, options: ParseConfigOptions): ShardctlConfig {
  const file = options.file === INLINE ? INLINE : path.resolve(options.cwd ?? process.cwd(), options.file);
  const format = options.format ?? (file.toLowerCase().endsWith('.json') ? 'json' : 'yaml');
  const bytes = Buffer.byteLength(text);
  if (bytes > MAX_CONFIG_BYTES) throw new ConfigError(file, [{ path: '', message: tooLarge(file, bytes) }]);
  const parsed = format === 'json' ? parseJson(text) : parseYaml(text);
  if ('error' in parsed) throw new ConfigError(file, [{ path: '', message: parsed.error }]);
  const issues: ConfigIssue[] = [];
  const config = validateConfig(parsed.value, issues, {
    file,
    baseDir: file === INLINE ? (options.cwd ?? process.cwd()) : path.dirname(file),
    env: options.env ?? process.env,
    now: options.now ?? new Date(),
    checkMigrationsDir: options.checkMigrationsDir ?? true,
  });
  if (issues.length > 0 || !config) throw new ConfigError(file, issues);
  return config;
}

/** types.ts documents this as the file of a config parsed from a string without a path. */
const INLINE = '<inline>';
