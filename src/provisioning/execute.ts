import type pg from 'pg';
import { invalidIndexes } from '../fleet/catalog.js';
import { checkClientConnection, connectHost, describePgError } from '../fleet/connect.js';
import { CONTROL, DURABLE_FLUSH_SQL, sessionResetSql } from '../fleet/control.js';
import { registerWorker } from '../fleet/locks.js';
import { failureReason } from '../errors.js';
import { DEFAULT_LOCK_RETRIES, lockHoldersPhrase, lockRetryPauseMs, type LockHolder } from './lock-wait.js';
import type { HostPlan, JobStep, ShardJob } from './plan.js';
import { endQuietly, rollbackQuietly } from '../pg/quiet.js';
import { quoteIdent, quoteLiteral } from '../pg/quote.js';
import { isSqlState } from '../pg/sqlstate.js';
import { elapsed } from '../clock.js';

export interface ProgressEvent {
  readonly host: string;
  readonly done: number;
  readonly total: number;
  readonly failed: number;
}

export interface ShardFailure {
  readonly shard: number;
  /** The step that failed, e.g. `migration 0002_likes`. */
  readonly step: string;
  /** The failed migration's version, when the step was a migration. */
  readonly version?: number;
  readonly message: string;
}

/** A shard whose step met a busy table (lock_timeout) and was tried again. */
export interface LockWait {
  readonly shard: number;
  /** The step that waited, e.g. `migration 0004_views`. */
  readonly step: string;
  /** How many times it was tried again. */
  readonly retries: number;
  /** Whether it went through in the end (if not, the shard is among the failures). */
  readonly applied: boolean;
  /** The sessions holding locks in the shard's schema after each timeout (distinct, by pid). */
  readonly holders: readonly LockHolder[];
}

/**
 * Shared by every host of a run: once `max` shards have failed, no host starts another shard
 * (those already running finish). Null: no limit, every host finishes its list.
 */
export class FailureBudget {
  failed = 0;
  constructor(readonly max: number | null) {}

  get exhausted(): boolean {
    return this.max !== null && this.failed >= this.max;
  }
}

export interface HostOutcome {
  readonly host: string;
  readonly shardsCreated: number;
  readonly nextIdInstalled: number;
  readonly migrationsApplied: number;
  /** Shards whose every step succeeded in this run. */
  readonly shardsChanged: number;
  /** Shards that needed nothing. */
  readonly upToDate: number;
  readonly failures: readonly ShardFailure[];
  /** Shards that met a busy table and were tried again (applied in the end, or among the failures). */
  readonly lockWaits: readonly LockWait[];
  /** Shards not started because the run's failure limit (--max-failures) was reached. */
  readonly notStarted: number;
  /** The host itself failed (unreachable, connection lost); `behind` shards were not done. */
  readonly hostError: string | null;
  /** Shards left short of the target: the failed and the not started ones, plus those not reached after a host error. */
  readonly behind: number;
  readonly durationMs: number;
}

export interface ExecuteOptions {
  readonly concurrency: number;
  /** The config's lockTimeout, named in the message of a shard that could not get a lock. */
  readonly lockTimeout?: string;
  /** How many times a step that met lock_timeout is tried again (default DEFAULT_LOCK_RETRIES). */
  readonly lockRetries?: number;
  /** The pause before a retry; tests shorten it. */
  readonly lockRetryPauseMs?: (retry: number) => number;
  /** Shared between the hosts of a run (--max-failures). */
  readonly failureBudget?: FailureBudget;
  readonly onProgress?: (event: ProgressEvent) => void;
}

/**
 * Applies one host's plan: the control schema first, then the shard jobs over a small pool of
 * connections. A failing shard is reported and the others go on; a lost connection stops the
 * host and counts what was not done. No-transaction migrations run one shard at a time per host.
 */
export async function executeHostPlan(
  coordinator: pg.Client,
  plan: HostPlan,
  options: ExecuteOptions,
): Promise<HostOutcome> {
  const started = performance.now();
  const host = plan.host;
  const failures: ShardFailure[] = [];
  const counters = { created: 0, nextId: 0, migrations: 0, changed: 0, done: 0 };
  const total = plan.jobs.length;
  const report = (): void =>
    options.onProgress?.({ host: host.name, done: counters.done, total, failed: failures.length });
  const lockWaits: LockWait[] = [];
  const budget = options.failureBudget ?? new FailureBudget(null);
  const context: JobContext = {
    noTransaction: new Mutex(),
    lockTimeout: options.lockTimeout ?? null,
    lockRetries: options.lockRetries ?? DEFAULT_LOCK_RETRIES,
    pauseMs: options.lockRetryPauseMs ?? lockRetryPauseMs,
    onLockWait: (wait) => lockWaits.push(wait),
  };
  let hostError: string | null = null;
  /** The next job to start; the jobs from here on were not started. */
  let next = 0;

  if (plan.controlSql) {
    try {
      await coordinator.query(plan.controlSql);
    } catch (error) {
      await rollbackAndReset(coordinator);
      return outcome(`cannot create the control schema: ${describePgError(error)}`);
    }
  }
  report();

  const session = plan.jobs.some((job) => job.steps.some((step) => step.alone));
  const worker = async (): Promise<void> => {
    let client: pg.Client | null = null;
    try {
      // A no-transaction migration sets its search_path and timeouts for the session, statement by
      // statement: it needs a server session of its own, which a transaction pooler does not give.
      client = await connectHost(session ? { ...host, url: host.directUrl } : host, {
        applicationName: 'shardctl worker',
      });
      await registerWorker(client, host.name);
      if (session) await checkClientConnection(client);
      // Each shard's transaction commits without a WAL flush (SET LOCAL in its SQL: nothing stays on
      // a pooled server connection); the run's last step makes them all durable at once.
      while (hostError === null && next < plan.jobs.length && !budget.exhausted) {
        const job = plan.jobs[next++]!;
        const result = await runJob(client, job, context);
        if (result.failure?.hostLevel) {
          hostError ??= `connection lost while on shard ${job.shard} (${result.failure.step}): ${result.failure.message}`;
          break;
        }
        counters.migrations += result.migrationsApplied;
        if (result.failure === null) {
          counters.created += job.creates ? 1 : 0;
          counters.nextId += job.reinstallsNextId ? 1 : 0;
          counters.changed += 1;
        } else {
          const { step, version, message } = result.failure;
          failures.push({ shard: job.shard, step, ...(version === undefined ? {} : { version }), message });
          budget.failed += 1;
        }
        counters.done += 1;
        report();
      }
    } catch (error) {
      hostError ??= failureReason(error, describePgError);
    } finally {
      if (client) await endQuietly(client);
    }
  };
  const poolSize = Math.min(options.concurrency, plan.jobs.length);
  await Promise.all(Array.from({ length: poolSize }, worker));
  if (counters.done > 0) {
    try {
      await coordinator.query(DURABLE_FLUSH_SQL);
    } catch (error) {
      await rollbackAndReset(coordinator);
      hostError ??= `the changes of this run could not be made durable (${describePgError(error)}); a crash of the server could undo some of them: run the command again`;
    }
  }
  return outcome(hostError);

  function outcome(error: string | null): HostOutcome {
    const notStarted = error === null ? total - next : 0;
    return {
      host: host.name,
      shardsCreated: counters.created,
      nextIdInstalled: counters.nextId,
      migrationsApplied: counters.migrations,
      shardsChanged: counters.changed,
      upToDate: plan.upToDate,
      // Workers finish in no fixed order; by shard, the report reads the same on every run.
      failures: failures.sort((a, b) => a.shard - b.shard),
      lockWaits: lockWaits.sort((a, b) => a.shard - b.shard),
      notStarted,
      hostError: error,
      behind: error === null ? failures.length + notStarted : total - counters.done + failures.length,
      durationMs: elapsed(started),
    };
  }
}

interface JobContext {
  /** Held while a no-transaction migration runs on one of the host's shards. */
  readonly noTransaction: Mutex;
  readonly lockTimeout: string | null;
  readonly lockRetries: number;
  readonly pauseMs: (retry: number) => number;
  readonly onLockWait: (wait: LockWait) => void;
}

interface StepFailure {
  readonly step: string;
  readonly version?: number;
  readonly message: string;
  /** The connection or server is gone: nothing more can be done on this host. */
  readonly hostLevel: boolean;
  /** The step gave up waiting for a lock (SQLSTATE 55P03): it may be tried again. */
  readonly lockTimeout: boolean;
}

interface JobResult {
  /** Migrations whose record committed in this run. */
  readonly migrationsApplied: number;
  readonly failure: StepFailure | null;
}

/**
 * Units of a job: consecutive transactional steps are sent as one round trip (the per-shard
 * overhead is what shardctl adds on top of the DDL itself); a no-transaction migration's
 * statements go one by one. A step with no record to prove it ran (install next_id, re-creating a
 * hand-dropped shard whose stale rows exist already) goes alone, so that after a failure the
 * records tell exactly how far a batch got.
 */
interface Unit {
  readonly kind: 'batch' | 'no-transaction';
  readonly steps: JobStep[];
}

function jobUnits(steps: readonly JobStep[]): Unit[] {
  const units: Unit[] = [];
  let batch: JobStep[] = [];
  const flush = (): void => {
    if (batch.length > 0) units.push({ kind: 'batch', steps: batch });
    batch = [];
  };
  for (const step of steps) {
    if (step.alone) {
      flush();
      const last = units.at(-1);
      if (last?.kind === 'no-transaction' && last.steps[0]!.version === step.version) last.steps.push(step);
      else units.push({ kind: 'no-transaction', steps: [step] });
    } else if (!isProvable(step)) {
      flush();
      units.push({ kind: 'batch', steps: [step] });
    } else {
      batch.push(step);
    }
  }
  flush();
  return units;
}

function isProvable(step: JobStep): boolean {
  return step.version !== undefined || step.recordsShard === true;
}

/**
 * A job's units in order. A unit that meets lock_timeout is tried again, after a pause, up to
 * lockRetries times: a batch from its first step that did not commit, a no-transaction
 * migration from its first statement (such files are re-runnable by contract). Every wait is
 * reported with who held the lock, whether it went through in the end or not.
 */
async function runJob(client: pg.Client, job: ShardJob, context: JobContext): Promise<JobResult> {
  let applied = 0;
  for (const unit of jobUnits(job.steps)) {
    let steps = unit.steps;
    let retries = 0;
    let waited = '';
    const holders = new Map<number, LockHolder>();
    for (;;) {
      let failure: StepFailure | null;
      if (unit.kind === 'no-transaction') {
        const invalidBefore = job.schema === null ? new Set<string>() : await invalidIndexNames(client, job.schema);
        failure = await context.noTransaction.run(() => runNoTransaction(client, steps, context));
        if (!failure) applied += 1;
        // A CREATE INDEX CONCURRENTLY that met the busy table left its index behind, invalid; IF NOT
        // EXISTS would skip it on the retry, and the record be refused. The ones this attempt made
        // are dropped before the retry (a failure to drop them leaves that refusal, which names them).
        else if (failure.lockTimeout && retries < context.lockRetries && job.schema !== null)
          await dropNewInvalidIndexes(client, job.schema, invalidBefore, context.lockTimeout ?? '5s');
      } else {
        const result = await runBatch(client, job.shard, steps, context);
        applied += result.committed.filter((s) => s.version !== undefined).length;
        steps = steps.slice(result.committed.length);
        failure = result.failure;
      }
      if (failure === null || !failure.lockTimeout) {
        if (retries > 0) {
          context.onLockWait({
            shard: job.shard,
            step: waited,
            retries,
            applied: failure === null,
            holders: [...holders.values()],
          });
        }
        if (failure) return { migrationsApplied: applied, failure };
        break;
      }
      waited = failure.step;
      const found = await lockHoldersPhrase(client, job.schema);
      for (const holder of found.holders) holders.set(holder.pid, holder);
      if (retries >= context.lockRetries) {
        if (retries > 0)
          context.onLockWait({
            shard: job.shard,
            step: failure.step,
            retries,
            applied: false,
            holders: [...holders.values()],
          });
        const tried = retries === 0 ? 'not tried again (lock retries 0)' : `tried ${retries + 1} times`;
        return {
          migrationsApplied: applied,
          failure: { ...failure, message: `${failure.message.replace('{holders}', found.phrase)}; ${tried}` },
        };
      }
      await new Promise((resolve) => setTimeout(resolve, context.pauseMs(retries)));
      retries += 1;
    }
  }
  return { migrationsApplied: applied, failure: null };
}

async function runNoTransaction(
  client: pg.Client,
  steps: readonly JobStep[],
  context: JobContext,
): Promise<StepFailure | null> {
  for (const step of steps) {
    try {
      await client.query(step.sql);
    } catch (error) {
      if (!isConnectionError(error)) await rollbackAndReset(client);
      return stepFailure(step, error, context);
    }
  }
  return null;
}

interface BatchResult {
  readonly committed: readonly JobStep[];
  readonly failure: StepFailure | null;
}

/**
 * Sends transactional steps as one string. Each step is a whole transaction, so after an error
 * the steps before the failed one have committed (their records say so) and the rest did not run.
 * One exception: PostgreSQL parses the whole string before running any of it, so a syntax error
 * stops even the steps before the broken one. The error's position tells which step is broken;
 * the steps before it are then sent again on their own.
 */
async function runBatch(
  client: pg.Client,
  shard: number,
  steps: readonly JobStep[],
  context: JobContext,
): Promise<BatchResult> {
  try {
    await client.query(steps.map((s) => s.sql).join('\n'));
    return { committed: steps, failure: null };
  } catch (error) {
    if (isConnectionError(error)) return { committed: [], failure: stepFailure(steps[0]!, error, context) };
    await rollbackAndReset(client);
    if (steps.length === 1) return { committed: [], failure: stepFailure(steps[0]!, error, context) };
    let done: number;
    try {
      done = await committedPrefix(client, shard, steps);
    } catch (readError) {
      return {
        committed: [],
        failure: stepFailure(steps[0]!, isConnectionError(readError) ? readError : error, context),
      };
    }
    const broken = stepAtPosition(steps, error);
    if (broken !== null && broken > done) {
      const before = await runBatch(client, shard, steps.slice(done, broken), context);
      const committed = [...steps.slice(0, done), ...before.committed];
      return { committed, failure: before.failure ?? stepFailure(steps[broken]!, error, context) };
    }
    return { committed: steps.slice(0, done), failure: stepFailure(steps[done] ?? steps.at(-1)!, error, context) };
  }
}

/** How many leading steps of a failed batch committed, from the control records they write. */
async function committedPrefix(client: pg.Client, shard: number, steps: readonly JobStep[]): Promise<number> {
  const result = await client.query<{ version: number | null }>(
    `SELECT version FROM ${CONTROL}.migrations WHERE shard = $1
     UNION ALL SELECT NULL FROM ${CONTROL}.shards WHERE shard = $1`,
    [shard],
  );
  const recorded = new Set(result.rows.map((r) => r.version));
  let done = 0;
  for (const step of steps) {
    const proven =
      step.version !== undefined ? recorded.has(step.version) : step.recordsShard === true && recorded.has(null);
    if (!proven) break;
    done += 1;
  }
  return done;
}

/** The step whose text holds the error's position (1-based, in characters of the whole string). */
function stepAtPosition(steps: readonly JobStep[], error: unknown): number | null {
  const position = Number((error as { position?: unknown }).position);
  if (!Number.isInteger(position) || position < 1) return null;
  let end = 0;
  for (let i = 0; i < steps.length; i++) {
    end += codePoints(steps[i]!.sql) + 1; // + the newline that joins the steps
    if (position <= end) return i;
  }
  return null;
}

function codePoints(text: string): number {
  let n = 0;
  for (const _ of text) n += 1;
  return n;
}

function stepFailure(step: JobStep, error: unknown, context: JobContext): StepFailure {
  const hostLevel = isConnectionError(error);
  const lockTimeout = !hostLevel && (error as { code?: unknown }).code === '55P03';
  let message = describePgError(error);
  if (lockTimeout) {
    // {holders} is filled in by runJob, which looks them up once the transaction is rolled back.
    const timeout = step.lockTimeout
      ? `lock_timeout ${step.lockTimeout} (the file's marker)`
      : `lockTimeout${context.lockTimeout ? ` ${context.lockTimeout}` : ''}`;
    message =
      `could not lock a table within ${timeout} ({holders}): this shard was skipped, the others went on; ` +
      `run migrate again when the lock is released — ${message}`;
  }
  return {
    step: step.label,
    ...(step.version === undefined ? {} : { version: step.version }),
    message,
    hostLevel,
    lockTimeout,
  };
}

/** Errors that mean the connection or server is gone, as opposed to a statement failing. */
export function isConnectionError(error: unknown): boolean {
  const code = (error as { code?: unknown } | null)?.code;
  if (typeof code !== 'string') return true;
  if (isSqlState(code)) return code.startsWith('08') || code === '57P01' || code === '57P02' || code === '57P03';
  return true; // ECONNRESET, ECONNREFUSED, EPIPE, ...
}

async function rollbackAndReset(client: pg.Client): Promise<void> {
  await rollbackQuietly(client);
  // A failed no-transaction migration leaves its session settings behind (and whatever its
  // functions set: sessionResetSql). Ignored like the ROLLBACK: failing, it means a broken
  // connection, which the next statement on it reports.
  await client.query(sessionResetSql()).catch(() => undefined);
}

/** One holder at a time, in arrival order. */
class Mutex {
  private tail: Promise<void> = Promise.resolve();

  async run<T>(fn: () => Promise<T>): Promise<T> {
    const previous = this.tail;
    let release!: () => void;
    this.tail = new Promise<void>((resolve) => (release = resolve));
    await previous;
    try {
      return await fn();
    } finally {
      release();
    }
  }
}

/** The names of the invalid indexes of `schema` (catalog.ts invalidIndexes); none when they cannot be read. */
async function invalidIndexNames(client: pg.Client, schema: string): Promise<Set<string>> {
  const found = await invalidIndexes(client, { schema }).catch(() => []);
  return new Set(found.map((i) => i.name));
}

/**
 * Drops the invalid indexes of `schema` that were not in `before`, waiting at most `lockTimeout` for
 * the table's lock (held for a moment: an invalid index is dropped at once). Not concurrently:
 * DROP INDEX CONCURRENTLY waits for the same old transactions the build gave up on.
 */
async function dropNewInvalidIndexes(
  client: pg.Client,
  schema: string,
  before: ReadonlySet<string>,
  lockTimeout: string,
): Promise<void> {
  for (const name of await invalidIndexNames(client, schema)) {
    if (before.has(name)) continue;
    await client
      .query(
        `SET lock_timeout = ${quoteLiteral(lockTimeout)}; DROP INDEX IF EXISTS ${quoteIdent(schema)}.${quoteIdent(name)}`,
      )
      .catch(() => undefined);
    await client.query('RESET lock_timeout').catch(() => undefined);
  }
}
