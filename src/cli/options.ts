import type { Command } from 'commander';
import { createInterface } from 'node:readline/promises';
import { lib } from './library.js';
import type { Streams } from './output.js';

/**
 * What several commands share, declared once: the common options, the confirmation prompt, and
 * how a library error about an input becomes one about the flag a person typed.
 */

export interface CommonFlags {
  config?: string;
  json?: boolean;
  dryRun?: boolean;
  yes?: boolean;
}

const CONFIG_HELP = 'config file (default: $SHARDCTL_CONFIG or ./shardctl.yaml)';

export function configOption(command: Command, help = CONFIG_HELP): Command {
  return command.option('-c, --config <file>', help);
}

export function jsonOption(command: Command, help = 'print the result as JSON on stdout'): Command {
  return command.option('--json', help);
}

export function dryRunOption(command: Command, help = 'print the SQL plan and write nothing'): Command {
  return command.option('--dry-run', help);
}

export function yesOption(
  command: Command,
  help = 'do not ask for confirmation (required when not on a terminal)',
): Command {
  return command.option('--yes', help);
}

/**
 * Makes an option given twice with different values a usage error (exit 2), on one command.
 * Commander keeps the last value without a word: `move-shard 0 --to pg2 --to pg3` would move to pg3,
 * `migrate --shards 0-3 --shards 4` would migrate shard 4 alone. The same value twice is kept.
 */
export function refuseRepeatedOptions(command: Command): void {
  for (const option of command.options) {
    // A switch (--json, --yes) says the same thing however often it is given.
    if (!option.required && !option.optional) continue;
    const key = option.attributeName();
    option.argParser((value: string, previous: unknown) => {
      // 'default' (--mode online) or unset before the first occurrence; 'cli' only for a repeat.
      if (command.getOptionValueSource(key) === 'cli' && previous !== value)
        command.error(`error: ${repeatedOption(option.long ?? key, previous, value)}`, {
          exitCode: 2,
          code: 'shardctl.repeatedOption',
        });
      return value;
    });
  }
}

export function repeatedOption(flag: string, first: unknown, second: unknown): string {
  return `option ${flag} given twice (${JSON.stringify(first)}, then ${JSON.stringify(second)}); give it once`;
}

/**
 * Asks on the terminal before a command changes data; without a terminal, or when the answer is not
 * yes, refuses (exit 2, nothing done) and says to pass --yes.
 */
export async function confirmOrRefuse(
  streams: Streams,
  what: string,
  stdin: NodeJS.ReadStream = process.stdin,
): Promise<void> {
  const { UsageError } = lib();
  if (!stdin.isTTY) throw new UsageError(`${what} needs confirmation: pass --yes (no terminal to ask on)`);
  const rl = createInterface({ input: stdin, output: streams.stderr });
  try {
    const answer = await rl.question(`${what}? [y/N] `);
    if (!/^y(es)?$/i.test(answer.trim())) throw new UsageError(`not confirmed: pass --yes to ${what} without a prompt`);
  } finally {
    rl.close();
  }
}

/**
 * Runs a command's work, turning a UsageError about a library input ('shards', 'target', ...) into
 * one about the flag that carried it (`argument <shards> "9-x": ...`).
 */
export async function withFlagNames<T>(flags: Readonly<Record<string, string>>, fn: () => Promise<T>): Promise<T> {
  const { UsageError } = lib();
  try {
    return await fn();
  } catch (error) {
    if (error instanceof UsageError && error.input !== undefined && flags[error.input] !== undefined) {
      const value = error.value === undefined ? '' : ` ${JSON.stringify(error.value)}`;
      throw new UsageError(`${flags[error.input]}${value}: ${error.reason}`);
    }
    throw error;
  }
}

/** A duration as the options write it: 500ms, 20s, 60min. */
function durationText(ms: number): string {
  return ms % 60_000 === 0 ? `${ms / 60_000}min` : ms % 1000 === 0 ? `${ms / 1000}s` : `${ms}ms`;
}

/**
 * A duration option (500ms, 20s, 1min: the config's format, read by its durationMs) from `minMs`
 * to `maxMs`, in ms; anything else is a UsageError naming the option, the value and the range.
 */
export function parseDurationOption(option: string, text: string, minMs: number, maxMs: number): number {
  const { durationMs, UsageError } = lib();
  const ms = /^\d{1,7}(ms|s|min)$/.test(text) ? durationMs(text) : 0;
  if (ms < minMs || ms > maxMs) {
    throw new UsageError(
      `option ${option} ${JSON.stringify(text)}: expected a duration from ${durationText(minMs)} to ${durationText(maxMs)}, like 500ms, 20s or 1min`,
    );
  }
  return ms;
}

/**
 * A list of host names as an option writes it (pg1,pg2): each name once, none empty (two commas
 * in a row, a comma at either end); anything else is a UsageError naming the option and the value.
 * Whether each names a host of the config is the command's check.
 */
export function parseHostListOption(option: string, text: string): string[] {
  const { UsageError } = lib();
  const names = text.split(',').map((h) => h.trim());
  const refuse = (reason: string): never => {
    throw new UsageError(`option ${option} ${JSON.stringify(text)}: ${reason}`);
  };
  if (names.some((h) => h === '')) refuse('empty item (two commas in a row, or a comma at either end)');
  const repeated = names.find((h, i) => names.indexOf(h) !== i);
  if (repeated !== undefined) refuse(`names host ${repeated} twice`);
  return names;
}
