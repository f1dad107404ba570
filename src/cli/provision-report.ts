import type { ProgressEvent, ProvisionResult } from '../index.js';
import { lib } from './library.js';
import { type Output, plural, seconds } from './output.js';

/** Runs init, add-schema or migrate with progress on stderr, prints the result, returns the exit code. */
export async function runProvision(
  out: Output,
  verb: string,
  run: (onProgress: (event: ProgressEvent) => void) => Promise<ProvisionResult>,
): Promise<number> {
  const progress = hostProgress(out);
  try {
    const result = await run((event) => progress.update(event));
    progress.stop();
    return printProvisionResult(out, result, verb);
  } finally {
    progress.stop();
  }
}

/** How init, add-schema and migrate print their result; shared because they share the engine. */
export function printProvisionResult(out: Output, result: ProvisionResult, verb: string): number {
  if (result.dryRun) return printDryRun(out, result, verb);
  const created = result.hosts.reduce((n, h) => n + h.shardsCreated, 0);
  const applied = result.hosts.reduce((n, h) => n + h.migrationsApplied, 0);
  const upToDate = result.hosts.reduce((n, h) => n + h.upToDate, 0);
  const failed = result.hosts.reduce((n, h) => n + h.failures.length, 0);
  const notStarted = result.hosts.reduce((n, h) => n + h.notStarted, 0);
  const lockWaits = result.hosts.reduce((n, h) => n + h.lockWaits.length, 0);
  const down = result.hosts.filter((h) => h.hostError !== null);
  const behindOnDown = down.reduce((n, h) => n + h.behind - h.failures.length, 0);
  if (out.json) {
    out.data({
      command: verb,
      ok: result.ok,
      targetVersion: result.targetVersion,
      durationMs: result.durationMs,
      summary: {
        shardsCreated: created,
        migrationsApplied: applied,
        upToDate,
        failed,
        notStarted,
        lockWaits,
        behind: failed + notStarted + behindOnDown,
      },
      stage: result.stage,
      stoppedEarly: result.stoppedEarly,
      hosts: result.hosts,
    });
  }
  for (const host of result.hosts) {
    if (host.hostError) {
      const before =
        host.migrationsApplied > 0 ? ` (${plural(host.migrationsApplied, 'migration')} applied before that)` : '';
      out.info(`${host.host}: FAILED: ${host.hostError}; ${plural(host.behind, 'shard')} behind${before}`);
    } else {
      const parts = [
        ...(verb === 'migrate' && host.shardsCreated === 0 ? [] : [`${plural(host.shardsCreated, 'shard')} created`]),
        `${plural(host.migrationsApplied, 'migration')} applied`,
        `${host.upToDate} already current`,
      ];
      if (host.nextIdInstalled > 0) parts.push(`next_id updated on ${plural(host.nextIdInstalled, 'shard')}`);
      if (host.failures.length > 0) parts.push(`${host.failures.length} failed`);
      if (host.notStarted > 0) parts.push(`${host.notStarted} not started`);
      out.info(`${host.host}: ${parts.join(', ')} (${seconds(host.durationMs)})`);
    }
    for (const wait of host.lockWaits.slice(0, 20)) {
      const holders =
        wait.holders.length > 0 ? `; held by ${wait.holders.map(lib().describeLockHolder).join('; ')}` : '';
      out.info(
        `  host ${host.host}, shard ${wait.shard}: ${wait.step} met a busy table, tried again ${plural(wait.retries, 'time')}: ` +
          `${wait.applied ? 'applied' : 'gave up'}${holders}`,
      );
    }
    if (host.lockWaits.length > 20)
      out.info(`  … and ${host.lockWaits.length - 20} more shards that waited for a lock (--json lists all)`);
    const shown = host.failures.slice(0, 20);
    for (const failure of shown)
      out.info(`  host ${host.host}, shard ${failure.shard}: ${failure.step}: ${failure.message}`);
    if (host.failures.length > shown.length) out.info(`  … and ${host.failures.length - shown.length} more`);
  }
  const parts = [
    ...(verb === 'migrate' && created === 0 ? [] : [`${plural(created, 'shard')} created`]),
    `${plural(applied, 'migration')} applied`,
    `${plural(upToDate, 'shard')} already current`,
    `${failed} failed`,
    ...(notStarted > 0
      ? [`${plural(notStarted, 'shard')} not started (stopped after ${plural(failed, 'failure')}, --max-failures)`]
      : []),
    ...(lockWaits > 0 ? [`${plural(lockWaits, 'shard')} waited for a lock`] : []),
  ];
  if (down.length > 0) parts.push(`${plural(behindOnDown, 'shard')} behind on ${down.map((h) => h.host).join(', ')}`);
  const summary = `${verb}: ${parts.join(', ')}; ${plural(result.hosts.length, 'host')}, ${seconds(result.durationMs)}`;
  if (result.ok) out.success(summary);
  else out.info(`${summary} — fix the cause and run it again; what is done stays done`);
  if (result.stage) printNextStage(out, result, result.stage);
  return result.ok ? 0 : 1;
}

/** After a canary or another stage: what was covered and how to go on (only the CLI names flags). */
function printNextStage(out: Output, result: ProvisionResult, stage: NonNullable<ProvisionResult['stage']>): void {
  const { formatShardList } = lib();
  const hosts = result.plan.hosts.filter((h) => h.jobs.length > 0).map((h) => h.host.name);
  const earlier =
    stage.reached && stage.reached.length > 0
      ? `, and ${plural(stage.reached.length, 'shard')} (${formatShardList(stage.reached)}) that had it from an earlier run`
      : '';
  const covered = `${stage.canary ? 'canary' : 'stage'}: ${plural(stage.shards.length, 'shard')}${stage.shards.length > 0 ? ` (${formatShardList(stage.shards)}` + `${hosts.length > 0 ? ` on ${hosts.join(', ')}` : ''})` : ''}${earlier}`;
  if (stage.pendingElsewhere === 0) {
    out.info(`${covered}; no other shard has anything pending`);
    return;
  }
  out.info(
    `${covered}; ${plural(stage.pendingElsewhere, 'other shard')} still ${lib().inflect(stage.pendingElsewhere, 'has', 'have')} work pending`,
  );
  if (result.ok)
    out.info(
      '  check the stage (shardctl status), then go on with one host (shardctl migrate --hosts NAME) or every shard (shardctl migrate)',
    );
}

/**
 * Progress per host on stderr: bars on a terminal; elsewhere (CI logs, pipes) a line per host at
 * each quarter and at the end, so a log shows which host is slow or stuck.
 */
export function hostProgress(out: Output): { update(event: ProgressEvent): void; stop(): void } {
  if (out.streams.stderr.isTTY && !out.json) return out.progress();
  const printed = new Map<string, number>();
  return {
    update(event) {
      if (event.total === 0) return;
      const quarter = Math.floor((event.done / event.total) * 4);
      if (printed.get(event.host) === quarter) return;
      printed.set(event.host, quarter);
      const failed = event.failed > 0 ? ` (${event.failed} failed)` : '';
      out.info(`${event.host}: ${event.done}/${event.total} shards${failed}`);
    },
    stop() {},
  };
}

function printDryRun(out: Output, result: ProvisionResult, verb: string): number {
  const { redactUrl } = lib();
  if (out.json) {
    out.data({
      command: verb,
      dryRun: true,
      targetVersion: result.targetVersion,
      ok: result.ok,
      unreadHosts: result.hosts.map((h) => ({ host: h.host, error: h.hostError })),
      hosts: result.plan.hosts.map((h) => ({
        host: h.host.name,
        controlSql: h.controlSql,
        upToDate: h.upToDate,
        jobs: h.jobs.map((j) => ({ shard: j.shard, steps: j.steps.map((s) => ({ label: s.label, sql: s.sql })) })),
      })),
    });
  } else {
    for (const h of result.plan.hosts) {
      out.line(`-- shardctl ${verb} --dry-run: host ${h.host.name} (${redactUrl(h.host.url)})`);
      if (h.controlSql) out.line(h.controlSql);
      for (const job of h.jobs) {
        out.line(`-- shard ${job.shard}: ${[...new Set(job.steps.map((s) => s.label))].join(', ')}`);
        for (const step of job.steps) out.line(step.sql);
      }
    }
  }
  const jobs = result.plan.hosts.reduce((n, h) => n + h.jobs.length, 0);
  const unread = result.hosts.map((h) => h.host);
  out.info(
    `${verb} --dry-run: ${plural(jobs, 'shard')} would change on ${plural(result.plan.hosts.length, 'host')}` +
      `${
        unread.length > 0
          ? `; ${unread.join(', ')} could not be read (${plural(
              result.hosts.reduce((n, h) => n + h.behind, 0),
              'shard',
            )} not planned)`
          : ''
      }; nothing was written`,
  );
  return result.ok ? 0 : 1;
}
