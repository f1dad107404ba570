import type pg from 'pg';
import { connectHost, CONTROL_SCHEMA, describePgError } from '../pg/connect.js';
import type { HostPlan, JobStep, ShardJob } from './plan.js';

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
  readonly message: string;
}

export interface HostOutcome {
  readonly host: string;
  readonly shardsCreated: number;
  readonly nextIdInstalled: number;
  readonly migrationsApplied: number;
  /** Shards that needed nothing. */
  readonly upToDate: number;
  readonly failures: readonly ShardFailure[];
  /** The host itself failed (unreachable, connection lost); `behind` shards were not done. */
  readonly hostError: string | null;
  readonly behind: number;
  readonly durationMs: number;
}

export interface ExecuteOptions {
  readonly concurrency: number;
  readonly onProgress?: (event: ProgressEvent) => void;
}

/**
 * Applies one host's plan: the control schema first, then the shard jobs over a small pool of
 * connections. A failing shard is reported and the others go on; a lost connection stops the
 * host and counts what was not done.
 */
export async function executeHostPlan(coordinator: pg.Client, plan: HostPlan, options: ExecuteOptions): Promise<HostOutcome> {
  const started = performance.now();
  const host = plan.host;
  const failures: ShardFailure[] = [];
  const counters = { created: 0, nextId: 0, migrations: 0, done: 0 };
  const total = plan.jobs.length;
  const report = (): void => options.onProgress?.({ host: host.name, done: counters.done, total, failed: failures.length });
  let hostError: string | null = null;

  if (plan.controlSql) {
    try {
      await coordinator.query(plan.controlSql);
    } catch (error) {
      await rollbackQuietly(coordinator);
      return outcome(`cannot create the control schema: ${describePgError(error)}`);
    }
  }
  report();

  let next = 0;
  const worker = async (): Promise<void> => {
    let client: pg.Client | null = null;
    try {
      client = await connectHost(host, { applicationName: 'shardctl worker' });
      while (hostError === null && next < plan.jobs.length) {
        const job = plan.jobs[next++]!;
        const failure = await runJob(client, job);
        if (failure === null) {
          counters.created += job.creates ? 1 : 0;
          counters.nextId += job.reinstallsNextId ? 1 : 0;
          counters.migrations += job.migrations.length;
        } else if (failure.hostLevel) {
          hostError ??= `connection lost at shard ${job.shard}: ${failure.message}`;
          break;
        } else {
          counters.migrations += failure.migrationsApplied;
          failures.push({ shard: job.shard, step: failure.step, message: failure.message });
        }
        counters.done += 1;
        report();
      }
    } catch (error) {
      hostError ??= describePgError(error);
    } finally {
      await client?.end().catch(() => undefined);
    }
  };
  const poolSize = Math.max(1, Math.min(options.concurrency, plan.jobs.length));
  await Promise.all(Array.from({ length: poolSize }, worker));
  return outcome(hostError);

  function outcome(error: string | null): HostOutcome {
    return {
      host: host.name,
      shardsCreated: counters.created,
      nextIdInstalled: counters.nextId,
      migrationsApplied: counters.migrations,
      upToDate: plan.upToDate,
      failures,
      hostError: error,
      behind: error === null ? failures.length : total - counters.done + failures.length,
      durationMs: Math.round(performance.now() - started),
    };
  }
}

interface JobFailure {
  readonly step: string;
  readonly message: string;
  readonly hostLevel: boolean;
  readonly migrationsApplied: number;
}

/**
 * Runs a job's steps, batching consecutive transactional steps into one round trip (the
 * per-shard overhead is what shardctl adds on top of the DDL itself). On failure, the control
 * records tell which step of the batch failed: every earlier step committed its record.
 */
async function runJob(client: pg.Client, job: ShardJob): Promise<JobFailure | null> {
  const batches = batchSteps(job.steps);
  let applied = 0;
  for (const batch of batches) {
    try {
      await client.query(batch.map((s) => s.sql).join('\n'));
      applied += new Set(batch.filter((s) => s.version !== undefined).map((s) => s.version)).size;
    } catch (error) {
      const message = describePgError(error);
      if (isConnectionError(error)) return { step: batch[0]!.label, message, hostLevel: true, migrationsApplied: applied };
      await rollbackQuietly(client);
      const { step, committed } = await locateFailedStep(client, job.shard, batch).catch(() => ({ step: batch[0]!.label, committed: 0 }));
      return { step, message, hostLevel: false, migrationsApplied: applied + committed };
    }
  }
  return null;
}

/** Transactional steps are concatenated; a no-transaction migration's statements go alone. */
function batchSteps(steps: readonly JobStep[]): JobStep[][] {
  const batches: JobStep[][] = [];
  let current: JobStep[] = [];
  for (const step of steps) {
    if (step.alone) {
      if (current.length > 0) batches.push(current);
      batches.push([step]);
      current = [];
    } else {
      current.push(step);
    }
  }
  if (current.length > 0) batches.push(current);
  return batches;
}

async function locateFailedStep(client: pg.Client, shard: number, batch: readonly JobStep[]): Promise<{ step: string; committed: number }> {
  if (batch.length === 1) return { step: batch[0]!.label, committed: 0 };
  const result = await client.query<{ version: number }>(`SELECT version FROM ${CONTROL_SCHEMA}.migrations WHERE shard = $1`, [shard]);
  const recorded = new Set(result.rows.map((r) => r.version));
  const shardRecorded = await client.query(`SELECT 1 FROM ${CONTROL_SCHEMA}.shards WHERE shard = $1`, [shard]);
  let committed = 0;
  for (const step of batch) {
    if (step.version === undefined) {
      if (shardRecorded.rowCount === 0) return { step: step.label, committed };
      continue;
    }
    if (!recorded.has(step.version)) return { step: step.label, committed };
    committed += 1;
  }
  return { step: batch.at(-1)!.label, committed };
}

/** Errors that mean the connection or server is gone, as opposed to a statement failing. */
export function isConnectionError(error: unknown): boolean {
  const code = (error as { code?: unknown } | null)?.code;
  if (typeof code !== 'string') return true;
  if (/^[0-9A-Z]{5}$/.test(code)) return code.startsWith('08') || code === '57P01' || code === '57P02' || code === '57P03';
  return true; // ECONNRESET, ECONNREFUSED, EPIPE, ...
}

async function rollbackQuietly(client: pg.Client): Promise<void> {
  await client.query('ROLLBACK').catch(() => undefined);
  // A failed no-transaction migration leaves its session settings behind.
  await client.query('RESET search_path; RESET lock_timeout').catch(() => undefined);
}
