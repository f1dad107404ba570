import { hostForShard } from '../config/types.js';
import { HostError } from '../errors.js';
import { isHostDown } from './failover.js';
import { ShardFanOutError, type FanOutFailure, type ShardResult } from './errors.js';
import { Limit } from './limit.js';
import type { Chunking, ForEachShardOptions, RouterInternals } from './types.js';

/** What the fan-out needs of the router. */
export type FanOutPaths = Pick<
  RouterInternals,
  'config' | 'settings' | 'checkShard' | 'hostForShard' | 'foundDown' | 'beginRoundTrip'
>;

/**
 * The fan-out behind forEachShard, queryEachShard and queryPage: `runShard` on each shard of
 * `options.shards` (default every shard), at most `perHost` at once on a host and `concurrency`
 * at once overall; every shard runs even when others fail, and the results come in shard order
 * (a ShardFanOutError holds both results and failures). With `chunks`, several shards of one host
 * go in one round trip: the first shard alone first tells how many results the text gives per
 * shard (unless that is known), then each host's shards split evenly over its workers, and a
 * chunk that fails (or whose results do not have that shape) runs again shard by shard, so the
 * failing shard is named and the others' results kept.
 *
 * A host that cannot be reached (no connection within the connect timeout, after the router's own
 * search for a new primary) fails the rest of its shards at once, each saying so, rather than each
 * waiting out the same timeout: a run over a host that went silent takes one timeout, not one per
 * wave of shards. So does a host the router's reading of the fleet could not connect to just
 * before the run (less than the connect timeout ago: a command that opens a router and runs at
 * once), unless the run may read standbys.
 */
export async function fanOut<T>(
  paths: FanOutPaths,
  runShard: (shard: number) => Promise<{ value: T; host: string }>,
  options: ForEachShardOptions,
  chunks?: Chunking<T>,
): Promise<ShardResult<T>[]> {
  const shards = [...new Set(options.shards ?? Array.from({ length: paths.config().shards }, (_, i) => i))].sort(
    (a, b) => a - b,
  );
  for (const shard of shards) paths.checkShard(shard);
  const perHost = Math.min(options.perHost ?? paths.settings.poolSize, paths.settings.poolSize);
  const overall = new Limit(options.concurrency ?? paths.settings.poolSize * paths.config().hosts.length);
  if (!Number.isSafeInteger(perHost) || perHost < 1)
    throw new RangeError(`perHost ${perHost} must be a positive integer`);

  const outcomes = new Map<number, { ok: true; result: ShardResult<T> } | { ok: false; failure: FanOutFailure }>();
  let done = 0;
  const record = (
    shard: number,
    outcome: { ok: true; result: ShardResult<T> } | { ok: false; failure: FanOutFailure },
  ): void => {
    outcomes.set(shard, outcome);
    done += 1;
    options.onShardDone?.({
      shard,
      host: outcome.ok ? outcome.result.host : outcome.failure.host,
      ok: outcome.ok,
      done,
      total: shards.length,
    });
  };
  // Hosts found unreachable in this run (or by the reading of the fleet just before it), with the
  // error that said so and when it was met (said by each shard not tried).
  const unreachable = new Map<string, { error: HostError; when: string }>();
  if (!options.replica) {
    for (const host of new Set(shards.map((s) => paths.hostForShard(s).name))) {
      const error = paths.foundDown(host);
      if (error) unreachable.set(host, { error, when: 'when the fleet was read just before' });
    }
  }
  const noteDown = (hostName: string, error: unknown, shard?: number): void => {
    if (isHostDown(error) && !unreachable.has(hostName))
      unreachable.set(hostName, {
        error: error as HostError,
        when: shard === undefined ? 'earlier in this run' : `for shard ${shard} earlier in this run`,
      });
  };
  /** A shard of a host found unreachable: failed without trying, saying why. */
  const skipped = (shard: number, hostName: string): boolean => {
    const down = unreachable.get(hostName);
    if (!down) return false;
    const error = down.error.forShard(
      shard,
      `${down.error.reason} (not tried: the host could not be reached ${down.when})`,
    );
    record(shard, { ok: false, failure: { shard, host: hostName, error } });
    return true;
  };
  const runOne = async (shard: number, hostName: string): Promise<void> => {
    if (skipped(shard, paths.hostForShard(shard).name)) return;
    try {
      const r = await runShard(shard);
      record(shard, { ok: true, result: { shard, host: r.host, value: r.value } });
    } catch (error) {
      const host = hostForShard(paths.config(), shard)?.name ?? hostName;
      noteDown(host, error, shard);
      record(shard, { ok: false, failure: { shard, host, error } });
    }
  };

  // Chunked runs: the first shard alone tells how many results the text gives per shard.
  let statements: number | undefined;
  let rest = shards;
  if (chunks?.statements !== undefined) statements = chunks.statements;
  else if (chunks && shards.length > 1) {
    // Probed on a host not already known to be down (its shards fail below, without trying).
    const first = shards.find((s) => !unreachable.has(paths.hostForShard(s).name));
    if (first !== undefined) {
      rest = shards.filter((s) => s !== first);
      await overall.run(async () => {
        try {
          const r = await chunks.probe(first);
          statements = r.statements;
          record(first, { ok: true, result: { shard: first, host: r.host, value: r.value } });
        } catch (error) {
          const host = hostForShard(paths.config(), first)?.name ?? '';
          noteDown(host, error, first);
          record(first, { ok: false, failure: { shard: first, host, error } });
        }
      });
    }
  }

  const byHost = new Map<string, number[]>();
  for (const shard of rest) {
    const host = paths.hostForShard(shard).name;
    const queue = byHost.get(host);
    if (queue) queue.push(shard);
    else byHost.set(host, [shard]);
  }
  // Per host, `perHost` workers take that host's shards in order (a chunk at a time when
  // chunking, the host's shards split evenly over its workers); each also holds a slot of the
  // overall limit while it runs.
  await Promise.all(
    [...byHost.entries()].flatMap(([hostName, queue]) => {
      const workers = Math.min(perHost, queue.length);
      const size =
        chunks && statements !== undefined
          ? Math.max(1, Math.min(chunks.maxShards, Math.ceil(queue.length / workers)))
          : 1;
      let next = 0;
      const worker = async (): Promise<void> => {
        while (next < queue.length) {
          const chunk = queue.slice(next, next + size);
          next += chunk.length;
          await overall.run(async () => {
            if (chunk.length === 1 || !chunks || statements === undefined) {
              for (const shard of chunk) await runOne(shard, hostName);
              return;
            }
            const host = paths.hostForShard(chunk[0]!);
            // A reload (a move) may have sent some of them elsewhere: only a chunk on one host runs whole.
            // A failed chunk is not lost: its shards run one by one below, each reporting its own error
            // (at once, when the chunk found its host unreachable).
            let down: HostError | undefined;
            const whole = chunk.every((s) => paths.hostForShard(s) === host) && !unreachable.has(host.name);
            // The round trip's event (diagnostics.ts): published when it succeeded or found its host
            // down; when it is run again shard by shard, those calls publish their own.
            const trace = whole ? paths.beginRoundTrip(chunk) : undefined;
            trace?.attempt(host.name);
            const values = whole
              ? await chunks.runChunk(host, chunk, statements, trace).catch((error: unknown) => {
                  if (isHostDown(error)) down = error as HostError;
                  return undefined;
                })
              : undefined;
            if (values) trace?.end(host.name);
            else if (down) trace?.end(host.name, { error: down });
            else trace?.dropped();
            if (down) {
              // Tried as a chunk, and the host could not be reached: each of its shards says so.
              noteDown(host.name, down);
              for (const shard of chunk)
                record(shard, { ok: false, failure: { shard, host: host.name, error: down.forShard(shard) } });
              return;
            }
            if (values) {
              chunk.forEach((shard, i) =>
                record(shard, { ok: true, result: { shard, host: host.name, value: values[i]! } }),
              );
              return;
            }
            // The chunk failed (or its results were not what one shard gives): shard by shard.
            for (const shard of chunk) await runOne(shard, hostName);
          });
        }
      };
      return Array.from({ length: workers }, worker);
    }),
  );
  const results: ShardResult<T>[] = [];
  const failures: FanOutFailure[] = [];
  for (const shard of shards) {
    const outcome = outcomes.get(shard)!;
    if (outcome.ok) results.push(outcome.result);
    else failures.push(outcome.failure);
  }
  if (failures.length > 0) throw new ShardFanOutError(results, failures, shards.length);
  return results;
}
