/**
 * For migrate tests: what the control schema recorded, polling, and the built CLI run as a child
 * process (so it can be killed, or hold the runner lock while another run starts).
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { existsSync, readdirSync, statSync } from 'node:fs';
import { join, relative } from 'node:path';
import { withClient } from './hosts.js';

const ROOT = join(import.meta.dirname, '..', '..');

/** shard → applied versions (ascending), from shardctl.migrations on one host. */
export async function recordedVersions(url: string): Promise<Map<number, number[]>> {
  return withClient(url, async (client) => {
    const result = await client.query<{ shard: number; version: number }>(
      'select shard, version from shardctl.migrations order by shard, version',
    );
    const map = new Map<number, number[]>();
    for (const row of result.rows) {
      let versions = map.get(row.shard);
      if (!versions) map.set(row.shard, (versions = []));
      versions.push(row.version);
    }
    return map;
  });
}

/** How many shards on a host have this version recorded. */
export async function shardsAt(url: string, version: number): Promise<number> {
  return withClient(url, async (client) => {
    const result = await client.query<{ n: string }>(
      'select count(*) as n from shardctl.migrations where version = $1',
      [version],
    );
    return Number(result.rows[0]!.n);
  });
}

/** The shards of a host with exactly these versions recorded, or a description of those that differ. */
export async function shardsNotAt(
  url: string,
  shards: readonly number[],
  versions: readonly number[],
): Promise<string[]> {
  const recorded = await recordedVersions(url);
  const want = versions.join(',');
  return shards.flatMap((shard) => {
    const have = (recorded.get(shard) ?? []).join(',');
    return have === want ? [] : [`shard ${shard}: [${have}]`];
  });
}

export async function waitFor(
  what: string,
  check: () => Promise<boolean>,
  timeoutMs = 30_000,
  intervalMs = 10,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (await check().catch(() => false)) return;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, intervalMs));
  }
}

export function range(first: number, last: number): number[] {
  return Array.from({ length: last - first + 1 }, (_, i) => first + i);
}

export interface ChildRun {
  readonly child: ChildProcess;
  /** Resolves when the process has exited, with what it printed. */
  readonly exited: Promise<{ code: number | null; signal: NodeJS.Signals | null; stdout: string; stderr: string }>;
}

/** `node bin/shardctl.js <args>`: the built CLI (npm run build) in its own process. */
export function spawnCli(args: readonly string[]): ChildRun {
  assertBuildIsFresh();
  const child = spawn(process.execPath, [join(ROOT, 'bin', 'shardctl.js'), ...args], {
    cwd: ROOT,
    env: { ...process.env, NO_COLOR: '1' },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stdout = '';
  let stderr = '';
  child.stdout!.setEncoding('utf8').on('data', (chunk: string) => (stdout += chunk));
  child.stderr!.setEncoding('utf8').on('data', (chunk: string) => (stderr += chunk));
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null; stdout: string; stderr: string }>(
    (resolve, reject) => {
      child.once('error', reject);
      child.once('close', (code, signal) => resolve({ code, signal, stdout, stderr }));
    },
  );
  return { child, exited };
}

/** A child process running stale JavaScript would test old code: refuse, naming the file. */
function assertBuildIsFresh(): void {
  const stale: string[] = [];
  const walk = (dir: string): void => {
    for (const entry of readdirSync(dir, { withFileTypes: true })) {
      const path = join(dir, entry.name);
      if (entry.isDirectory()) walk(path);
      else if (entry.name.endsWith('.ts')) {
        const built = join(ROOT, 'dist', relative(join(ROOT, 'src'), path)).replace(/\.ts$/, '.js');
        if (!existsSync(built) || statSync(built).mtimeMs < statSync(path).mtimeMs) stale.push(relative(ROOT, path));
      }
    }
  };
  walk(join(ROOT, 'src'));
  if (stale.length > 0) {
    throw new Error(
      `dist/ is older than ${stale.slice(0, 3).join(', ')}${stale.length > 3 ? ', …' : ''}: run npm run build before these tests`,
    );
  }
}
