import diagnosticsChannel from 'node:diagnostics_channel';
import { performance } from 'node:perf_hooks';
import type pg from 'pg';
import type { ReplicaFallback } from './replicas.js';

/**
 * What the router does, for the application to see: one event per routed call on
 * `node:diagnostics_channel` (the mechanism Node's own undici publishes on, and OpenTelemetry's
 * instrumentations subscribe to), counters per host for router.stats(), and one warning for a call
 * that waits past a bound (ShardRouterOptions.slowCallMs).
 *
 * Nothing is timed or built per call unless someone subscribes to the channel or a bound is set
 * (`hasSubscribers` is read once per call); the counters behind stats() are a few integer
 * increments per call.
 */
export const CALL_CHANNEL = 'shardctl:router:call';
export const SLOW_CALL_CHANNEL = 'shardctl:router:slow-call';

const callChannel = diagnosticsChannel.channel(CALL_CHANNEL);
const slowChannel = diagnosticsChannel.channel(SLOW_CALL_CHANNEL);

/** What a call is waiting for at a given moment. */
export type CallWait =
  | 'a pooled connection'
  | 'the transaction (fn and its statements)'
  | 'the fence of a move'
  | 'the placement (reading the fleet)'
  | 'the new host to hold the shard'
  | "the host's primary to answer (a failover, a restart)";

/** A call's event on `shardctl:router:call`, published when the call ends. */
export interface RouterCallEvent {
  readonly shard: number;
  /**
   * A round trip of several shards of one host (read-only chunks of forEachShard, queryEachShard
   * and queryPage): all of them, `shard` the first. Absent for a call of one shard.
   */
  readonly shards?: readonly number[];
  /** The host it ended on (after following a move). */
  readonly host: string;
  readonly ok: boolean;
  /** Attempts made: 1 unless a move (or a stale map) made the router run fn again. */
  readonly attempts: number;
  /** performance.timeOrigin-based start (ms), and how long the call took. */
  readonly startTime: number;
  readonly durationMs: number;
  /** Time spent waiting for a pooled connection, over all attempts. */
  readonly poolWaitMs: number;
  /** Backoffs while the shard was fenced (a move between its fence and its switch), and their total. */
  readonly fenceWaits: number;
  readonly fenceWaitMs: number;
  /** Moves followed: from the host the map named to the host that holds the shard. */
  readonly follows: readonly { readonly from: string; readonly to: string }[];
  /** The errors that were retried (SC100, or a missing object on a host that no longer holds the shard). */
  readonly retried: readonly { readonly host: string; readonly code: string | undefined; readonly message: string }[];
  /** The error the caller got, when !ok. */
  readonly error?: unknown;
  /** A replica read (replica: true): 'standby' when it ran on one, else why it ran on the primary. */
  readonly replica?: 'standby' | ReplicaFallback;
}

/** A call waiting past ShardRouterOptions.slowCallMs, on `shardctl:router:slow-call` (and as one process warning). */
export interface SlowCallEvent {
  readonly shard: number;
  readonly host: string | undefined;
  readonly waitingFor: CallWait;
  readonly waitedMs: number;
}

/** Per host, for router.stats(). */
export interface HostStats {
  readonly host: string;
  /** The pool's connections now (open, and idle among them), and calls waiting for one. */
  readonly poolSize: number;
  readonly idle: number;
  readonly waiting: number;
  /** Calls that ended on this host since the router opened (a round trip of several shards counts once). */
  readonly calls: number;
  /** ... of them failed. */
  readonly errors: number;
  /** Moves followed away from this host. */
  readonly follows: number;
  /** Replica reads (replica: true) of this host's shards that ran on a standby (a chunk counts per shard). */
  readonly replicaReads: number;
  /** ... that ran on the primary instead, and why (src/router/replicas.ts). */
  readonly replicaFallbacks: number;
  readonly replicaFallbackReasons: Readonly<Partial<Record<ReplicaFallback, number>>>;
}

/** One call's record, made only when it is observed. */
export class CallTrace {
  private readonly start = performance.now();
  attempts = 0;
  private poolWait = 0;
  private fenceWaits = 0;
  private fenceWait = 0;
  private readonly follows: { from: string; to: string }[] = [];
  private readonly retried: { host: string; code: string | undefined; message: string }[] = [];
  host: string | undefined;
  private replicaOutcome: 'standby' | ReplicaFallback | undefined;
  private waitingFor: CallWait = 'the transaction (fn and its statements)';
  private since = this.start;
  private timer: NodeJS.Timeout | undefined;

  constructor(
    readonly shard: number,
    slowCallMs: number,
    private readonly shards?: readonly number[],
  ) {
    if (slowCallMs > 0) {
      this.timer = setTimeout(() => this.slow(), slowCallMs);
      this.timer.unref();
    }
  }

  attempt(host: string): void {
    this.attempts += 1;
    this.host = host;
  }

  waiting(what: CallWait, host?: string): number {
    this.waitingFor = what;
    if (host !== undefined) this.host = host;
    this.since = performance.now();
    return this.since;
  }

  poolWaited(since: number): void {
    this.poolWait += performance.now() - since;
    this.waiting('the transaction (fn and its statements)');
  }

  fenceWaited(since: number): void {
    this.fenceWaits += 1;
    this.fenceWait += performance.now() - since;
  }

  followed(from: string, to: string): void {
    this.follows.push({ from, to });
  }

  replica(outcome: 'standby' | ReplicaFallback): void {
    this.replicaOutcome = outcome;
  }

  retry(host: string, error: unknown): void {
    const code = (error as { code?: unknown } | null)?.code;
    this.retried.push({
      host,
      code: typeof code === 'string' ? code : undefined,
      message: error instanceof Error ? error.message : String(error),
    });
  }

  end(host: string, error?: { error: unknown }): void {
    if (this.timer) clearTimeout(this.timer);
    if (!callChannel.hasSubscribers) return;
    const event: RouterCallEvent = {
      shard: this.shard,
      ...(this.shards ? { shards: this.shards } : {}),
      host,
      ok: !error,
      attempts: this.attempts,
      startTime: performance.timeOrigin + this.start,
      durationMs: performance.now() - this.start,
      poolWaitMs: this.poolWait,
      fenceWaits: this.fenceWaits,
      fenceWaitMs: this.fenceWait,
      follows: this.follows,
      retried: this.retried,
      ...(error ? { error: error.error } : {}),
      ...(this.replicaOutcome !== undefined ? { replica: this.replicaOutcome } : {}),
    };
    callChannel.publish(event);
  }

  /** The call gave way to others that publish their own (a round trip run again shard by shard): nothing to publish. */
  dropped(): void {
    if (this.timer) clearTimeout(this.timer);
  }

  private slow(): void {
    this.timer = undefined;
    const event: SlowCallEvent = {
      shard: this.shard,
      host: this.host,
      waitingFor: this.waitingFor,
      waitedMs: Math.round(performance.now() - this.start),
    };
    if (slowChannel.hasSubscribers) slowChannel.publish(event);
    const onHost = event.host !== undefined ? ` on host ${event.host}` : '';
    const what = this.shards
      ? `a round trip of ${this.shards.length} shards (${this.shards[0]}, …)`
      : `a call on shard ${event.shard}`;
    process.emitWarning(
      `shardctl: ${what}${onHost} has taken ${event.waitedMs} ms; it is waiting for ${event.waitingFor} (for ${Math.round(performance.now() - this.since)} ms)`,
      { code: 'SHARDCTL_SLOW_CALL' },
    );
  }
}

/** The router's counters per host, and the factory of traces. */
interface Counters {
  calls: number;
  errors: number;
  follows: number;
  replicaReads: number;
  replicaFallbacks: number;
  replicaFallbackReasons: Partial<Record<ReplicaFallback, number>>;
}

export class RouterDiagnostics {
  private readonly counters = new Map<string, Counters>();

  constructor(private readonly slowCallMs: number) {}

  /** A trace for a call about to start (`roundTrip`: all the shards of a round trip of several), or undefined when nobody would see it. */
  begin(shard: number, roundTrip?: readonly number[]): CallTrace | undefined {
    return callChannel.hasSubscribers || this.slowCallMs > 0
      ? new CallTrace(shard, this.slowCallMs, roundTrip && [...roundTrip])
      : undefined;
  }

  /** A trace for a round trip of several shards of one host, or undefined when nobody would see it. */
  beginRoundTrip(shards: readonly number[]): CallTrace | undefined {
    return this.begin(shards[0]!, shards);
  }

  ended(host: string, ok: boolean, count = 1): void {
    const c = this.host(host);
    c.calls += count;
    if (!ok) c.errors += count;
  }

  followed(from: string): void {
    this.host(from).follows += 1;
  }

  replicaRead(host: string, count = 1): void {
    this.host(host).replicaReads += count;
  }

  replicaFallback(host: string, reason: ReplicaFallback, count = 1): void {
    const c = this.host(host);
    c.replicaFallbacks += count;
    c.replicaFallbackReasons[reason] = (c.replicaFallbackReasons[reason] ?? 0) + count;
  }

  stats(pools: ReadonlyMap<string, pg.Pool>, hosts: readonly string[]): HostStats[] {
    const names = [...new Set([...hosts, ...pools.keys(), ...this.counters.keys()])];
    return names.map((host) => {
      const pool = pools.get(host);
      const c = this.counters.get(host) ?? emptyCounters();
      return {
        host,
        poolSize: pool?.totalCount ?? 0,
        idle: pool?.idleCount ?? 0,
        waiting: pool?.waitingCount ?? 0,
        ...c,
        replicaFallbackReasons: { ...c.replicaFallbackReasons },
      };
    });
  }

  private host(name: string): Counters {
    let c = this.counters.get(name);
    if (!c) {
      c = emptyCounters();
      this.counters.set(name, c);
    }
    return c;
  }
}

function emptyCounters(): Counters {
  return { calls: 0, errors: 0, follows: 0, replicaReads: 0, replicaFallbacks: 0, replicaFallbackReasons: {} };
}
