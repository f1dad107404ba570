/**
 * Typed errors: each carries a stable code, the exit code the CLI should use, a human message and
 * structured data, so the same failure prints well for a person and serialises under --json.
 * Every message passes through redact() before it leaves the process (see src/pg/redact.ts).
 */
import { plural } from './text.js';

/** 1: failed at run time; 2: bad usage or config, nothing written; 3: a check found a problem. */
export type FailureExitCode = 1 | 2 | 3;

export interface ErrorJson {
  code: string;
  message: string;
  exitCode: FailureExitCode;
  details?: string[];
  data?: Record<string, unknown>;
  next?: NextStep[];
}

/**
 * What the operator can do next, as data. The library's message says it in words ("resume the
 * move to retry, or abort it"); the CLI names the command and its flags (src/cli/output.ts), and a
 * program can act on it without reading the message.
 *
 * resume, abort: carry on or undo the unfinished moves of `shards`. move: move `shards` to another
 * host. init: initialise the hosts first. adopt: adopt hand-built schemas. rebalance: run the
 * rebalance again. map-pull: update the config file's map from the fleet.
 */
export type NextAction = 'resume' | 'abort' | 'move' | 'init' | 'adopt' | 'rebalance' | 'map-pull';

export interface NextStep {
  readonly action: NextAction;
  readonly shards?: readonly number[];
}

/**
 * What finishes an unfinished move of these shards: resume or abort it; only abort when an abort of
 * it began and was cut off (part of it may be undone already).
 */
export function finishMove(shards: readonly number[], aborting: boolean): NextStep[] {
  return aborting ? [{ action: 'abort', shards }] : resumeOrAbort(shards);
}

/** Resume or abort the unfinished moves of these shards: the advice of most failed moves. */
export function resumeOrAbort(shards: readonly number[]): NextStep[] {
  return [
    { action: 'resume', shards },
    { action: 'abort', shards },
  ];
}

export class ShardctlError extends Error {
  readonly code: string;
  readonly exitCode: FailureExitCode;
  readonly details: readonly string[];
  readonly data: Record<string, unknown> | undefined;
  /** What to do next, in the order the message says it; empty when the message has no advice. */
  readonly next: readonly NextStep[];

  constructor(
    code: string,
    message: string,
    options: {
      exitCode: FailureExitCode;
      details?: readonly string[];
      data?: Record<string, unknown>;
      cause?: unknown;
      next?: readonly NextStep[];
    },
  ) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.name = new.target.name;
    this.code = code;
    this.exitCode = options.exitCode;
    this.details = options.details ?? [];
    this.data = options.data;
    this.next = options.next ?? [];
  }

  toJSON(): ErrorJson {
    return {
      code: this.code,
      message: this.message,
      exitCode: this.exitCode,
      ...(this.details.length > 0 ? { details: [...this.details] } : {}),
      ...(this.data ? { data: this.data } : {}),
      ...(this.next.length > 0
        ? { next: this.next.map((n) => ({ ...n, ...(n.shards ? { shards: [...n.shards] } : {}) })) }
        : {}),
    };
  }
}

/**
 * Bad input: a malformed or out-of-range argument. Exit 2, nothing written. When the library knows
 * which of its parameters was wrong it says so (`input`: 'shards', 'target', 'toVersion', ...,
 * with the `value` it got and the `reason`), and the CLI names the flag a person typed instead
 * (`argument <shards> "9-x": ...`, `option --to "pg9": ...`) when it prints the error.
 */
export class UsageError extends ShardctlError {
  readonly input: string | undefined;
  readonly value: unknown;
  readonly reason: string;

  constructor(reason: string, options: { input?: string; value?: unknown; data?: Record<string, unknown> } = {}) {
    const where =
      options.input === undefined
        ? ''
        : `${options.input}${options.value === undefined ? '' : ` ${showValue(options.value)}`}: `;
    super('USAGE', `${where}${reason}`, {
      exitCode: 2,
      ...(options.data || options.input
        ? {
            data: {
              ...(options.input ? { input: options.input, value: jsonValue(options.value) } : {}),
              ...options.data,
            },
          }
        : {}),
    });
    this.input = options.input;
    this.value = options.value;
    this.reason = reason;
  }
}

/**
 * A value as a message shows it: JSON where JSON says what it is (a string quoted, so '10' and 10
 * differ), else as JavaScript writes it (5n, NaN, Infinity, a function's type) rather than
 * JSON's null or a throw.
 */
function showValue(value: unknown): string {
  if (typeof value === 'bigint') return `${value}n`;
  if (typeof value === 'number' && !Number.isFinite(value)) return String(value);
  if (typeof value === 'function' || typeof value === 'symbol') return typeof value;
  try {
    return JSON.stringify(value) ?? String(value);
  } catch {
    return String(value);
  }
}

/** The value for an error's JSON data: a bigint as its decimal string, anything JSON cannot hold as showValue writes it. */
function jsonValue(value: unknown): unknown {
  if (typeof value === 'bigint') return value.toString();
  if (value === undefined || value === null || typeof value === 'string' || typeof value === 'boolean') return value;
  if (typeof value === 'number') return Number.isFinite(value) ? value : String(value);
  try {
    return JSON.parse(JSON.stringify(value)) as unknown;
  } catch {
    return showValue(value);
  }
}

/** One problem found in the config file, naming the field and the offending value. */
export interface ConfigIssue {
  /** Dotted path of the field, e.g. `hosts[1].shards`. */
  path: string;
  message: string;
}

/** The config file is invalid. Lists every problem at once. Exit 2, nothing written. */
export class ConfigError extends ShardctlError {
  readonly issues: readonly ConfigIssue[];

  constructor(file: string, issues: readonly ConfigIssue[]) {
    const lines = issues.map((issue) => (issue.path ? `${issue.path}: ${issue.message}` : issue.message));
    super(
      'CONFIG_INVALID',
      `${file}: ${plural(issues.length, 'problem')} in the config\n${lines.map((l) => `  - ${l}`).join('\n')}`,
      { exitCode: 2, details: lines, data: { file, issues: issues.map((i) => ({ ...i })) } },
    );
    this.issues = issues;
  }
}

/**
 * A failure tied to a host: the host, and where one is involved the shard and the migration, are
 * fields; `reason` is the failure alone. `message` (host and shard first) is composed from them
 * here, once, so no caller writes `host X:` into a text or strips it off again.
 */
export class HostError extends ShardctlError {
  readonly host: string;
  readonly shard: number | undefined;
  readonly migration: string | undefined;
  readonly reason: string;

  constructor(
    host: string,
    reason: string,
    options: {
      shard?: number;
      migration?: string;
      code?: string;
      cause?: unknown;
      data?: Record<string, unknown>;
      details?: readonly string[];
      next?: readonly NextStep[];
    } = {},
  ) {
    super(options.code ?? 'HOST_FAILED', `${hostLocation(host, options.shard, options.migration)}: ${reason}`, {
      exitCode: 1,
      cause: options.cause,
      ...(options.details ? { details: options.details } : {}),
      ...(options.next ? { next: options.next } : {}),
      data: {
        host,
        ...(options.shard === undefined ? {} : { shard: options.shard }),
        ...(options.migration === undefined ? {} : { migration: options.migration }),
        ...options.data,
      },
    });
    this.host = host;
    this.shard = options.shard;
    this.migration = options.migration;
    this.reason = reason;
  }

  /**
   * The same failure as one of `shard` (a host's error, met by a call on that shard), with its
   * code, cause, data, details and next steps; `reason` when the shard's says more than this one's.
   */
  forShard(shard: number, reason: string = this.reason): HostError {
    // The data's own location (host, shard, migration) is this error's; the new one writes its own.
    const { host: _host, shard: _shard, migration: _migration, ...data } = this.data ?? {};
    return new HostError(this.host, reason, {
      shard,
      ...(this.migration === undefined ? {} : { migration: this.migration }),
      code: this.code,
      cause: this.cause,
      ...(Object.keys(data).length > 0 ? { data } : {}),
      ...(this.details.length > 0 ? { details: this.details } : {}),
      ...(this.next.length > 0 ? { next: this.next } : {}),
    });
  }
}

/** `host pg1`, `host pg1, shard 17`, `host pg1, shard 17, migration 0002_likes`. */
export function hostLocation(host: string, shard?: number, migration?: string): string {
  return `host ${host}${shard === undefined ? '' : `, shard ${shard}`}${migration === undefined ? '' : `, migration ${migration}`}`;
}

/** The failure without its location, for a report that already names the host. */
export function failureReason(error: unknown, describe: (error: unknown) => string): string {
  return error instanceof HostError ? error.reason : error instanceof ShardctlError ? error.message : describe(error);
}

/** Something that must be fixed by the operator before the command can run; exit 1. */
export class RuntimeFailure extends ShardctlError {
  constructor(
    code: string,
    message: string,
    data?: Record<string, unknown>,
    details?: readonly string[],
    next?: readonly NextStep[],
  ) {
    super(code, message, {
      exitCode: 1,
      ...(data ? { data } : {}),
      ...(details ? { details } : {}),
      ...(next ? { next } : {}),
    });
  }
}

export function isShardctlError(error: unknown): error is ShardctlError {
  return error instanceof ShardctlError;
}

/**
 * The config file's map disagrees with where the fleet's hosts say the shards are (another
 * operator moved shards, or this copy of the file is old). Exit 2, nothing written: acting on a
 * stale map would create, migrate or move the wrong copies. `data.fix` says what repairs it.
 */
export class StaleMapError extends ShardctlError {
  constructor(file: string, lines: readonly string[], data: Record<string, unknown>) {
    super(
      'MAP_STALE',
      `the map in ${file} disagrees with the fleet; nothing was written:\n${lines.map((l) => `  - ${l}`).join('\n')}\n` +
        'Update the file from the fleet (pull the map), then run the command again.',
      { exitCode: 2, details: lines, data: { file, fix: 'map-pull', ...data }, next: [{ action: 'map-pull' }] },
    );
  }
}
