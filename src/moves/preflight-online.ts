import { inflect } from '../text.js';
import type { PreflightCheck } from './preflight-check.js';

/**
 * The checks only an online move needs (logical replication from the source): PostgreSQL 15 or
 * later on both hosts, wal_level=logical, a free slot and WAL sender, a free logical replication
 * worker on the target, and every table of the batch
 * with a replica identity and logged. Pure: the preflight reads, this judges.
 */
export function onlineChecks(
  versions: readonly [{ num: number; text: string }, { num: number; text: string }],
  sourceName: string,
  targetName: string,
  settings: { wal_level: string; free_slots: number; free_senders: number },
  tables: readonly { name: string; identity: boolean; logged: boolean }[],
  /** The target's logical replication workers running and its slots for them (LOGICAL_WORKERS_SQL). */
  workers: { workers: number; slots: number },
): PreflightCheck[] {
  const checks: PreflightCheck[] = [];
  const add = (name: string, ok: boolean, message: string): void => {
    checks.push({ name, ok, message });
  };
  const ok = versions.every((v) => v.num >= 150000);
  add(
    'versions',
    ok,
    `PostgreSQL ${versions[0].text} on ${sourceName}, ${versions[1].text} on ${targetName}` +
      (ok ? '' : '; online mode needs 15 or later on both (use --mode offline)'),
  );
  add(
    'wal_level',
    settings.wal_level === 'logical',
    settings.wal_level === 'logical'
      ? `wal_level=logical on ${sourceName}`
      : `wal_level=${settings.wal_level} on ${sourceName}; set wal_level=logical and restart it, or use --mode offline`,
  );
  add(
    'replication slots',
    settings.free_slots > 0 && settings.free_senders > 0,
    `${settings.free_slots} free replication slots and ${settings.free_senders} free WAL senders on ${sourceName}` +
      (settings.free_slots > 0 && settings.free_senders > 0 ? '' : '; raise max_replication_slots / max_wal_senders'),
  );
  // The move's subscription needs one worker on the target: without a free slot it waits, after the
  // copy, until another subscription of that server ends.
  const free = Math.max(0, workers.slots - workers.workers);
  add(
    'replication workers',
    free > 0,
    `${free} of ${workers.slots} logical replication workers free on ${targetName}` +
      (free > 0
        ? ''
        : workers.slots === 0
          ? `; the move's subscription could never run there: raise max_logical_replication_workers (and max_worker_processes) on ${targetName} and restart it, or use --mode offline`
          : `; the move's subscription would wait for one: raise max_logical_replication_workers (and max_worker_processes) on ${targetName} and restart it, or let its other subscriptions end first`),
  );
  const noIdentity = tables.filter((t) => !t.identity).map((t) => t.name);
  add(
    'replica identity',
    noIdentity.length === 0,
    noIdentity.length === 0
      ? 'every table of the batch has a replica identity'
      : `${tableList(noIdentity)} ${inflect(noIdentity.length, 'has', 'have')} no replica identity; add a primary key or ALTER TABLE … REPLICA IDENTITY FULL, or use --mode offline`,
  );
  // Logical replication does not carry unlogged tables: their writes after the copy would be lost.
  const unlogged = tables.filter((t) => !t.logged).map((t) => t.name);
  add(
    'logged tables',
    unlogged.length === 0,
    unlogged.length === 0
      ? 'every table of the batch is logged (replicated)'
      : `${tableList(unlogged)} ${inflect(unlogged.length, 'is', 'are')} UNLOGGED, which logical replication does not carry; ALTER TABLE … SET LOGGED, or use --mode offline (which copies them with writes fenced)`,
  );
  return checks;
}

function tableList(names: readonly string[]): string {
  const shown = names.slice(0, 5).join(', ');
  return `${inflect(names.length, 'table')} ${shown}${names.length > 5 ? ` and ${names.length - 5} more` : ''}`;
}
