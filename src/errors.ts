/**
 * Typed errors: each carries a stable code, the exit code the CLI should use, a human message and
 * structured data, so the same failure prints well for a person and serialises under --json.
 * Every message passes through redact() before it leaves the process (see src/pg/redact.ts).
 */

/** 1: failed at run time; 2: bad usage or config, nothing written; 3: a check found a problem. */
export type FailureExitCode = 1 | 2 | 3;

export interface ErrorJson {
  code: string;
  message: string;
  exitCode: FailureExitCode;
  details?: string[];
  data?: Record<string, unknown>;
}

export class ShardctlError extends Error {
  readonly code: string;
  readonly exitCode: FailureExitCode;
  readonly details: readonly string[];
  readonly data: Record<string, unknown> | undefined;

  constructor(
    code: string,
    message: string,
    options: {
      exitCode: FailureExitCode;
      details?: readonly string[];
      data?: Record<string, unknown>;
      cause?: unknown;
    },
  ) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.name = new.target.name;
    this.code = code;
    this.exitCode = options.exitCode;
    this.details = options.details ?? [];
    this.data = options.data;
  }

  toJSON(): ErrorJson {
    return {
      code: this.code,
      message: this.message,
      exitCode: this.exitCode,
      ...(this.details.length > 0 ? { details: [...this.details] } : {}),
      ...(this.data ? { data: this.data } : {}),
    };
  }
}

/** Bad command-line usage: unknown command or option, malformed argument. Exit 2, nothing written. */
export class UsageError extends ShardctlError {
  constructor(message: string, data?: Record<string, unknown>) {
    super('USAGE', message, { exitCode: 2, ...(data ? { data } : {}) });
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
      `${file}: ${issues.length} problem${issues.length === 1 ? '' : 's'} in the config\n${lines.map((l) => `  - ${l}`).join('\n')}`,
      { exitCode: 2, details: lines, data: { file, issues: issues.map((i) => ({ ...i })) } },
    );
    this.issues = issues;
  }
}

/** A failure while talking to a host. Names the host and, where one is involved, the shard. */
export class HostError extends ShardctlError {
  readonly host: string;
  readonly shard: number | undefined;

  constructor(
    host: string,
    message: string,
    options: { shard?: number; code?: string; cause?: unknown; data?: Record<string, unknown> } = {},
  ) {
    const where = options.shard === undefined ? `host ${host}` : `host ${host}, shard ${options.shard}`;
    super(options.code ?? 'HOST_FAILED', `${where}: ${message}`, {
      exitCode: 1,
      cause: options.cause,
      data: { host, ...(options.shard === undefined ? {} : { shard: options.shard }), ...options.data },
    });
    this.host = host;
    this.shard = options.shard;
  }
}

/** Something that must be fixed by the operator before the command can run; exit 1. */
export class RuntimeFailure extends ShardctlError {
  constructor(code: string, message: string, data?: Record<string, unknown>, details?: readonly string[]) {
    super(code, message, { exitCode: 1, ...(data ? { data } : {}), ...(details ? { details } : {}) });
  }
}

export function isShardctlError(error: unknown): error is ShardctlError {
  return error instanceof ShardctlError;
}
