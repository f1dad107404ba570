/**
 * A throw-away fleet for a test: a temp folder (removed after the test file) with a shardctl.yaml over the test databases and a
 * migrations folder, plus an in-process CLI runner that captures stdout, stderr and the exit code.
 */
import { cpSync, mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { PassThrough } from 'node:stream';
import { inject } from 'vitest';
import { main } from '../../src/cli/main.js';
import { loadConfig } from '../../src/config/load.js';
import type { ShardctlConfig } from '../../src/config/types.js';
import { urlWithDatabase } from './hosts.js';
import { tempDir } from './temp.js';

/**
 * The tests' own copy of the example migrations (photos, likes, comments). Never the checkout's
 * migrations/: a user's `shardctl migration new` there must not change what the tests see.
 */
export const FIXTURE_MIGRATIONS = join(import.meta.dirname, '..', 'fixtures', 'migrations');

export interface FleetOptions {
  /** Admin URLs of the test databases, one per host. */
  urls: readonly string[];
  /**
   * How the other hosts reach each one (a host's `replicationUrl:` line, written when it differs from
   * its url). Default: for a database on a host of the global setup, that host's replicationUrl
   * (under Docker, its network alias); otherwise the url itself.
   */
  replicationUrls?: readonly (string | undefined)[];
  shards: number;
  /** Shard list per host; default: equal contiguous ranges. */
  split?: readonly string[];
  schemaPrefix?: string;
  /** Migration files by name; default: the fixture migrations (photos, likes, comments). */
  migrations?: Record<string, string>;
  /** Extra top-level YAML lines, e.g. `lockTimeout: 500ms`. */
  extra?: string;
  idLayout?: { epoch?: string; shardBits?: number; sequenceBits?: number };
}

export interface Fleet {
  readonly dir: string;
  readonly configFile: string;
  readonly migrationsDir: string;
  config(): Promise<ShardctlConfig>;
  writeMigration(name: string, sql: string): void;
}

export function makeFleet(options: FleetOptions): Fleet {
  const dir = tempDir('shardctl-fleet-');
  const migrationsDir = join(dir, 'migrations');
  if (options.migrations) {
    mkdirSync(migrationsDir);
    for (const [name, sql] of Object.entries(options.migrations)) writeFileSync(join(migrationsDir, name), sql);
  } else {
    cpSync(FIXTURE_MIGRATIONS, migrationsDir, { recursive: true });
  }
  const split = options.split ?? equalSplit(options.shards, options.urls.length);
  const layout = options.idLayout
    ? [
        'idLayout:',
        ...(options.idLayout.epoch ? [`  epoch: "${options.idLayout.epoch}"`] : []),
        ...(options.idLayout.shardBits ? [`  shardBits: ${options.idLayout.shardBits}`] : []),
        ...(options.idLayout.sequenceBits ? [`  sequenceBits: ${options.idLayout.sequenceBits}`] : []),
      ]
    : [];
  const yaml = [
    `schemaPrefix: ${options.schemaPrefix ?? 'insta'}`,
    `shards: ${options.shards}`,
    ...layout,
    'migrations: ./migrations',
    ...(options.extra ? [options.extra] : []),
    'hosts:',
    ...options.urls.flatMap((url, i) => {
      const replicationUrl = options.replicationUrls?.[i] ?? sharedHostReplicationUrl(url);
      return [
        `  - name: pg${i + 1}`,
        `    url: ${url}`,
        ...(replicationUrl && replicationUrl !== url ? [`    replicationUrl: ${replicationUrl}`] : []),
        `    shards: "${split[i]}"`,
      ];
    }),
    '',
  ].join('\n');
  const configFile = join(dir, 'shardctl.yaml');
  writeFileSync(configFile, yaml);
  return {
    dir,
    configFile,
    migrationsDir,
    config: () => loadConfig(configFile),
    writeMigration: (name, sql) => writeFileSync(join(migrationsDir, name), sql),
  };
}

/** The replicationUrl of a database on one of the global setup's hosts, or undefined for any other server. */
export function sharedHostReplicationUrl(url: string): string | undefined {
  const target = new URL(url);
  const host = inject('pgHosts').find((candidate) => new URL(candidate.url).host === target.host);
  return host ? urlWithDatabase(host.replicationUrl, decodeURIComponent(target.pathname.slice(1))) : undefined;
}

export function equalSplit(shards: number, hosts: number): string[] {
  const per = Math.ceil(shards / hosts);
  return Array.from({ length: hosts }, (_, i) => `${i * per}-${Math.min(shards, (i + 1) * per) - 1}`);
}

export interface CliRun {
  readonly code: number;
  readonly stdout: string;
  readonly stderr: string;
}

/** Runs the CLI in-process, as `shardctl <args>`, with its own streams and environment. */
export async function runCli(
  args: readonly string[],
  options: { cwd?: string; env?: NodeJS.ProcessEnv } = {},
): Promise<CliRun> {
  const stdout = new PassThrough();
  const stderr = new PassThrough();
  let out = '';
  let err = '';
  stdout.on('data', (chunk: Buffer) => (out += chunk.toString()));
  stderr.on('data', (chunk: Buffer) => (err += chunk.toString()));
  const code = await main(
    ['node', 'shardctl', ...args],
    { stdout, stderr, env: { ...process.env, NO_COLOR: '1', ...options.env } },
    options.cwd ?? process.cwd(),
  );
  return { code, stdout: out, stderr: err };
}
