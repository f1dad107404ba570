import type cliProgress from 'cli-progress';
import { createRequire } from 'node:module';
import type { ErrorJson, NextAction, NextStep } from '../index.js';
import { lib } from './library.js';

/**
 * Where every byte the CLI prints goes: data on stdout (JSON under --json), messages on stderr,
 * all through redact(). Colour only on a terminal and only without NO_COLOR.
 */
export interface Streams {
  readonly stdout: NodeJS.WritableStream & { isTTY?: boolean };
  readonly stderr: NodeJS.WritableStream & { isTTY?: boolean };
  readonly env: NodeJS.ProcessEnv;
}

export class Output {
  readonly color: boolean;

  constructor(
    readonly streams: Streams,
    readonly json: boolean,
  ) {
    this.color = Boolean(streams.stderr.isTTY) && !('NO_COLOR' in streams.env) && streams.env['TERM'] !== 'dumb';
  }

  /** A data line on stdout (human mode). */
  line(text: string): void {
    this.streams.stdout.write(`${lib().redact(text)}\n`);
  }

  /** A data document on stdout: JSON with bigints as decimal strings. */
  data(value: unknown): void {
    this.streams.stdout.write(`${lib().redactedJson(value, 2)}\n`);
  }

  info(text: string): void {
    this.streams.stderr.write(`${lib().redact(text)}\n`);
  }

  warn(text: string): void {
    this.streams.stderr.write(`${this.paint('33', 'warning:')} ${lib().redact(text)}\n`);
  }

  success(text: string): void {
    this.streams.stderr.write(`${this.paint('32', lib().redact(text))}\n`);
  }

  error(error: unknown): void {
    const json = errorJson(error);
    this.streams.stderr.write(`${this.paint('31', 'error:')} ${json.message}\n`);
    // The library says what to do next in words; here it becomes the commands a person types.
    if (json.next && json.next.length > 0) this.streams.stderr.write(`${nextLine(json.next, lib().formatShardList)}\n`);
    if (this.json) this.streams.stdout.write(`${toJson({ error: json })}\n`);
  }

  paint(code: string, text: string): string {
    return this.color ? `\u001b[${code}m${text}\u001b[0m` : text;
  }

  /** Progress bars per host on stderr when it is a terminal; nothing otherwise. */
  progress(): Progress {
    return new Progress(this.streams.stderr, Boolean(this.streams.stderr.isTTY) && !this.json);
  }
}

/** cli-progress is loaded only when bars are drawn (a terminal): most runs never need it. */
const requireCjs = createRequire(import.meta.url);

export class Progress {
  private readonly bars = new Map<string, cliProgress.SingleBar>();
  private readonly multi: cliProgress.MultiBar | null;

  constructor(stream: NodeJS.WritableStream, enabled: boolean) {
    const bars = enabled ? (requireCjs('cli-progress') as typeof cliProgress) : null;
    this.multi = bars
      ? new bars.MultiBar(
          {
            stream: stream as NodeJS.WriteStream,
            format: ' {host} [{bar}] {value}/{total} shards {failed}',
            hideCursor: true,
            clearOnComplete: false,
            etaBuffer: 50,
          },
          bars.Presets.shades_classic,
        )
      : null;
  }

  update(event: { host: string; done: number; total: number; failed: number }): void {
    if (!this.multi) return;
    let bar = this.bars.get(event.host);
    const payload = { host: event.host.padEnd(8), failed: event.failed > 0 ? `(${event.failed} failed)` : '' };
    if (!bar) {
      bar = this.multi.create(event.total, event.done, payload);
      this.bars.set(event.host, bar);
    }
    bar.setTotal(event.total);
    bar.update(event.done, payload);
  }

  stop(): void {
    this.multi?.stop();
  }
}

export function errorJson(error: unknown): ErrorJson {
  const { isShardctlError, redact, redactedJson } = lib();
  if (isShardctlError(error)) return JSON.parse(redactedJson(error.toJSON())) as ErrorJson;
  const message = error instanceof Error ? error.message : String(error);
  return { code: 'INTERNAL', message: redact(message), exitCode: 1 };
}

const NEXT_COMMANDS: Record<NextAction, (shards: string) => string> = {
  resume: (shards) => `shardctl move-shard ${shards} --resume`,
  abort: (shards) => `shardctl move-shard ${shards} --abort`,
  move: (shards) => `shardctl move-shard ${shards} --to <host>`,
  init: () => 'shardctl init',
  adopt: () => 'shardctl adopt',
  rebalance: () => 'shardctl rebalance',
  'map-pull': () => 'shardctl map pull',
};

/**
 * An error's next steps as the commands that take them: `next: shardctl move-shard 0-3 --resume,
 * or shardctl move-shard 0-3 --abort`. Steps of one action are merged (a resume of several shard
 * lists is one resume of them all: it finds every unfinished move of the shards listed).
 */
export function nextLine(next: readonly NextStep[], formatShards: (shards: number[]) => string): string {
  const merged = new Map<NextAction, Set<number>>();
  for (const step of next) {
    const shards = merged.get(step.action) ?? new Set<number>();
    for (const shard of step.shards ?? []) shards.add(shard);
    merged.set(step.action, shards);
  }
  const commands = [...merged].map(([action, shards]) =>
    NEXT_COMMANDS[action](formatShards([...shards].sort((a, b) => a - b))),
  );
  return `next: ${commands.join(', or ')}`;
}

export function toJson(value: unknown): string {
  return JSON.stringify(value, (_, v: unknown) => (typeof v === 'bigint' ? v.toString() : v), 2);
}

/** The library's plural(), under the name the CLI's modules import (they reach the library only through lib()). */
export function plural(n: number, word: string, pluralWord?: string): string {
  return lib().plural(n, word, pluralWord);
}

export function seconds(ms: number): string {
  return `${(ms / 1000).toFixed(1)} s`;
}

/** Bytes for a person: 1024-based units with one decimal (B, kB, MB, GB, TB), from a bigint. */
export function formatBytes(bytes: bigint): string {
  const units = ['B', 'kB', 'MB', 'GB', 'TB', 'PB'];
  let unit = 0;
  while (unit < units.length - 1 && bytes >= 1024n ** BigInt(unit + 1)) unit += 1;
  if (unit === 0) return `${bytes} B`;
  // One decimal from the exact value, without converting the whole count to a float.
  const divisor = 1024n ** BigInt(unit);
  const tenths = (bytes * 10n) / divisor;
  return `${tenths / 10n}.${tenths % 10n} ${units[unit]}`;
}

/** Rows of cells as left-aligned columns two spaces apart. */
export function columns(rows: readonly (readonly string[])[], indent = ''): string[] {
  const widths = rows.reduce<number[]>((w, row) => row.map((cell, i) => Math.max(w[i] ?? 0, cell.length)), []);
  return rows.map(
    (row) => `${indent}${row.map((cell, i) => (i === row.length - 1 ? cell : cell.padEnd(widths[i]!))).join('  ')}`,
  );
}
