import type { ProvisionResult } from '../provisioning/run.js';
import { redactUrl } from '../pg/redact.js';
import { type Output, plural, seconds } from './output.js';

/** How init, add-schema and migrate print their result; shared because they share the engine. */
export function printProvisionResult(out: Output, result: ProvisionResult, verb: string): number {
  if (result.dryRun) return printDryRun(out, result, verb);
  if (out.json) {
    out.data({
      command: verb,
      ok: result.ok,
      targetVersion: result.targetVersion,
      durationMs: result.durationMs,
      hosts: result.hosts,
    });
  }
  for (const host of result.hosts) {
    if (host.hostError) {
      out.info(`${host.host}: FAILED: ${host.hostError}; ${plural(host.behind, 'shard')} behind`);
      continue;
    }
    const parts = [
      `${plural(host.shardsCreated, 'shard')} created`,
      `${plural(host.migrationsApplied, 'migration')} applied`,
      `${host.upToDate} already current`,
    ];
    if (host.nextIdInstalled > 0) parts.push(`next_id updated on ${plural(host.nextIdInstalled, 'shard')}`);
    if (host.failures.length > 0) parts.push(`${host.failures.length} failed`);
    out.info(`${host.host}: ${parts.join(', ')} (${seconds(host.durationMs)})`);
    const shown = host.failures.slice(0, 20);
    for (const failure of shown) out.info(`  host ${host.host}, shard ${failure.shard}: ${failure.step}: ${failure.message}`);
    if (host.failures.length > shown.length) out.info(`  … and ${host.failures.length - shown.length} more`);
  }
  const created = result.hosts.reduce((n, h) => n + h.shardsCreated, 0);
  const applied = result.hosts.reduce((n, h) => n + h.migrationsApplied, 0);
  const failed = result.hosts.reduce((n, h) => n + h.behind, 0);
  const summary = `${verb}: ${plural(created, 'shard')} created, ${plural(applied, 'migration')} applied on ${plural(result.hosts.length, 'host')} in ${seconds(result.durationMs)}`;
  if (result.ok) out.success(summary);
  else out.info(`${summary}; ${plural(failed, 'shard')} failed or behind — fix the cause and run it again`);
  return result.ok ? 0 : 1;
}

function printDryRun(out: Output, result: ProvisionResult, verb: string): number {
  if (out.json) {
    out.data({
      command: verb,
      dryRun: true,
      targetVersion: result.targetVersion,
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
        out.line(`-- shard ${job.shard}: ${job.steps.map((s) => s.label).join(', ')}`);
        for (const step of job.steps) out.line(step.sql);
      }
    }
  }
  const jobs = result.plan.hosts.reduce((n, h) => n + h.jobs.length, 0);
  out.info(`${verb} --dry-run: ${plural(jobs, 'shard')} would change on ${plural(result.plan.hosts.length, 'host')}; nothing was written`);
  return 0;
}
