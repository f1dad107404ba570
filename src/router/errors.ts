import { HostError, ShardctlError } from '../errors.js';
import { shardsPhrase } from '../config/ranges.js';
import { describePgError } from '../fleet/connect.js';
import { plural } from '../text.js';
import { isSqlState } from '../pg/sqlstate.js';

/** One shard of a fan-out that failed: where, and the error as thrown (pg errors keep their code). */
export interface FanOutFailure {
  readonly shard: number;
  /** The host it ran on last (after following a move). */
  readonly host: string;
  readonly error: unknown;
}

/** One shard of a fan-out that succeeded. */
export interface ShardResult<T> {
  readonly shard: number;
  readonly host: string;
  readonly value: T;
}

/**
 * A fan-out in which some shards failed: every shard ran, the successes are in `results` and the
 * failures in `failures`, both in shard order. The message names the failed shards, grouped by
 * error, so 1024 shards failing alike make one line.
 */
export class ShardFanOutError<T = unknown> extends ShardctlError {
  constructor(
    readonly results: readonly ShardResult<T>[],
    readonly failures: readonly FanOutFailure[],
    total: number,
  ) {
    const groups = groupFailures(failures);
    super(
      'SHARDS_FAILED',
      `${failures.length} of ${plural(total, 'shard')} failed: ${groups.map((g) => g.line).join('; ')}`,
      {
        exitCode: 1,
        details: groups.map((g) => g.line),
        data: {
          failed: failures.map((f) => f.shard),
          failures: failures.map((f) => ({
            shard: f.shard,
            host: f.host,
            code: sqlState(f.error),
            message: describeFailure(f.error),
          })),
        },
      },
    );
  }
}

/** Failures with the same host and message, as "shards 3-5,9 on pg1: <message>". */
export function groupFailures(
  failures: readonly FanOutFailure[],
): { shards: number[]; host: string; message: string; line: string }[] {
  const groups = new Map<string, { shards: number[]; host: string; message: string }>();
  for (const failure of failures) {
    // The line names the host: an error about that host says only what went wrong there.
    const error = failure.error;
    const message =
      error instanceof HostError && error.host === failure.host && error.migration === undefined
        ? error.reason
        : describeFailure(error);
    const key = `${failure.host}\u0000${message}`;
    const group = groups.get(key) ?? { shards: [], host: failure.host, message };
    group.shards.push(failure.shard);
    groups.set(key, group);
  }
  return [...groups.values()].map((g) => ({
    ...g,
    line: `${shardsPhrase(g.shards)} on ${g.host}: ${g.message}`,
  }));
}

export function describeFailure(error: unknown): string {
  return describePgError(error);
}

function sqlState(error: unknown): string | null {
  const code = (error as { code?: unknown } | null)?.code;
  return isSqlState(code) ? code : null;
}
