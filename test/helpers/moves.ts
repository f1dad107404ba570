/**
 * For move tests: the built CLI in its own process (so a fault can SIGKILL it), and what the hosts
 * say about a shard, its move and the replication objects a move may leave behind.
 */
import { spawn } from 'node:child_process';
import { existsSync, readFileSync, readdirSync, statSync, writeFileSync } from 'node:fs';
import { join, relative } from 'node:path';
import type pg from 'pg';
import type { Fleet } from './fleet.js';
import { withClient } from './hosts.js';

const ROOT = join(import.meta.dirname, '..', '..');

export interface ProcessRun {
  readonly code: number | null;
  readonly signal: NodeJS.Signals | null;
  readonly stdout: string;
  readonly stderr: string;
}

/** `node bin/shardctl.js <args>` with its own environment additions; stdin is not a terminal. */
export function spawnCli(args: readonly string[], env: NodeJS.ProcessEnv = {}): Promise<ProcessRun> {
  assertMoveBuildIsFresh();
  const child = spawn(process.execPath, [join(ROOT, 'bin', 'shardctl.js'), ...args], {
    cwd: ROOT,
    env: { ...process.env, NO_COLOR: '1', ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stdout = '';
  let stderr = '';
  child.stdout.setEncoding('utf8').on('data', (chunk: string) => (stdout += chunk));
  child.stderr.setEncoding('utf8').on('data', (chunk: string) => (stderr += chunk));
  return new Promise((resolve, reject) => {
    child.once('error', reject);
    child.once('close', (code, signal) => resolve({ code, signal, stdout, stderr }));
  });
}

/** A child running stale JavaScript would test old code: refuse, naming the file (run npm run build). */
function assertMoveBuildIsFresh(): void {
  const sources = [
    ...readdirSync(join(ROOT, 'src', 'moves')).map((f) => join('moves', f)),
    join('cli', 'move-shard.ts'),
    join('cli', 'gc.ts'),
  ];
  const stale = sources.filter((file) => {
    const built = join(ROOT, 'dist', file.replace(/\.ts$/, '.js'));
    return !existsSync(built) || statSync(built).mtimeMs < statSync(join(ROOT, 'src', file)).mtimeMs;
  });
  if (stale.length > 0) {
    throw new Error(`dist/ is older than ${stale.map((f) => relative(ROOT, join(ROOT, 'src', f))).join(', ')}: run npm run build before these tests`);
  }
}

/**
 * Adds each host's replicationUrl to a fleet's config when it differs from its url (under Docker,
 * hosts reach each other by network alias, not by the address the tests use).
 */
export function useReplicationUrls(fleet: Fleet, urls: readonly string[], replicationUrls: readonly string[]): void {
  let text = readFileSync(fleet.configFile, 'utf8');
  urls.forEach((url, i) => {
    const replicationUrl = replicationUrls[i];
    if (replicationUrl && replicationUrl !== url) text = text.replace(`    url: ${url}\n`, `    url: ${url}\n    replicationUrl: ${replicationUrl}\n`);
  });
  writeFileSync(fleet.configFile, text);
}

/**
 * Publications, subscriptions and replication slots of the test database on these hosts (every
 * slot of the database, so a table-sync slot a dropped subscription forgot counts too).
 */
export async function replicationObjects(urls: readonly string[]): Promise<string[]> {
  const found: string[] = [];
  for (const url of urls) {
    await withClient(url, async (client) => {
      const r = await client.query<{ what: string }>(
        `select 'publication ' || pubname as what from pg_publication
         union all select 'subscription ' || subname from pg_subscription where subdbid = (select oid from pg_database where datname = current_database())
         union all select 'slot ' || slot_name from pg_replication_slots where database = current_database()`,
      );
      found.push(...r.rows.map((row) => `${new URL(url).port}: ${row.what}`));
    });
  }
  return found;
}

/**
 * Waits until no backend of a `shardctl move` run is left in the test database: a killed run's
 * sessions end a moment after the process, and with them its runner lock.
 */
export async function waitForMoveSessionsToEnd(urls: readonly string[], timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (const url of urls) {
    await withClient(url, async (client) => {
      for (;;) {
        const r = await client.query<{ n: string }>(
          `select count(*) as n from pg_stat_activity where datname = current_database() and application_name = 'shardctl move' and pid <> pg_backend_pid()`,
        );
        if (r.rows[0]!.n === '0') return;
        if (Date.now() > deadline) throw new Error(`sessions of a killed shardctl move still open on ${new URL(url).port} after ${timeoutMs} ms`);
        await new Promise((resolve) => setTimeout(resolve, 20));
      }
    });
  }
}

export async function schemaExists(client: pg.Client, schema: string): Promise<boolean> {
  const r = await client.query<{ e: boolean }>('select to_regnamespace($1) is not null as e', [schema]);
  return r.rows[0]!.e;
}

/** shardctl.shards on one host: the shard's state and schema, or null. */
export async function shardRow(client: pg.Client, shard: number): Promise<{ state: string; schema: string } | null> {
  const r = await client.query<{ state: string; schema_name: string }>('select state, schema_name from shardctl.shards where shard = $1', [shard]);
  const row = r.rows[0];
  return row ? { state: row.state, schema: row.schema_name } : null;
}

/** The newest move of a shard recorded on one host. */
export async function lastMove(client: pg.Client, shard: number): Promise<{ moveId: string; step: string; status: string } | null> {
  const r = await client.query<{ move_id: string; step: string; status: string }>(
    'select move_id, step, status from shardctl.moves where shard = $1 order by started_at desc, move_id desc limit 1',
    [shard],
  );
  const row = r.rows[0];
  return row ? { moveId: row.move_id, step: row.step, status: row.status } : null;
}

/**
 * Every row of every table of a schema, as one fingerprint per table: count and an md5 over the
 * rows in id order (UTC, so hosts with different time zones print timestamps alike).
 */
export async function schemaFingerprint(client: pg.Client, schema: string): Promise<Record<string, string>> {
  const tables = await client.query<{ relname: string }>(
    `select relname from pg_class where relnamespace = to_regnamespace($1) and relkind = 'r' order by relname`,
    [schema],
  );
  const out: Record<string, string> = {};
  await client.query(`set timezone = 'UTC'`);
  for (const { relname } of tables.rows) {
    const r = await client.query<{ n: string; md5: string | null }>(
      `select count(*) as n, md5(string_agg(t::text, E'\\n' order by t.id)) as md5 from "${schema}"."${relname}" t`,
    );
    out[relname] = `${r.rows[0]!.n} ${r.rows[0]!.md5 ?? '-'}`;
  }
  return out;
}
