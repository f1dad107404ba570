/**
 * A host with a streaming standby, for failover tests: a throw-away primary (Debian's PostgreSQL 15
 * binaries, which include pg_basebackup; the embedded packages do not), a standby made from it by
 * `pg_basebackup -R`, and what an operator does in a failover: promote the standby, stop the old
 * primary (`-m immediate`: a crash, nothing flushed or said to clients).
 */
import { spawnSync } from 'node:child_process';
import { chownSync, existsSync, mkdirSync } from 'node:fs';
import { dirname, join } from 'node:path';
import {
  ensurePostgresOsUser,
  findFreePort,
  startCluster,
  type LocalClusterOptions,
} from '../../src/dev/local-postgres.js';
import { startOwnClusters } from './moves.js';
import { withClient } from './hosts.js';

/** Debian's PostgreSQL 15 (apt install postgresql-15): the tests' only binaries with pg_basebackup. */
export const DEBIAN_PG15_BIN = '/usr/lib/postgresql/15/bin';

export interface Node {
  readonly options: LocalClusterOptions;
  /** Superuser URL of its postgres database. */
  readonly url: string;
  readonly port: number;
}

export interface ReplicatedHost {
  readonly primary: Node;
  readonly standby: Node;
  readonly password: string;
  /** The libpq URL of both, primary first, for `database`. */
  multiHostUrl(database: string, params?: string): string;
  /** pg_ctl promote -w on the standby; resolves once it accepts writes. */
  promote(): void;
  /** pg_ctl stop on the primary, -m immediate by default. */
  stopPrimary(mode?: 'immediate' | 'fast'): void;
  /** Waits until the standby has replayed everything the primary has written so far. */
  caughtUp(): Promise<void>;
  dispose(): Promise<void>;
}

/** `settings` go to the primary only (e.g. synchronous_standby_names). */
export async function startReplicatedHost(settings: Record<string, string> = {}): Promise<ReplicatedHost> {
  if (!existsSync(join(DEBIAN_PG15_BIN, 'pg_basebackup')))
    throw new Error(`the failover tests need pg_basebackup in ${DEBIAN_PG15_BIN} (apt-get install postgresql-15)`);
  const started = await startOwnClusters([
    { binDir: DEBIAN_PG15_BIN, settings: { ...settings, wal_keep_size: '256MB' } },
  ]);
  const primaryCluster = started.clusters[0]!;
  const password = primaryCluster.options.password;
  const standbyPort = await findFreePort();
  const standbyOptions: LocalClusterOptions = {
    ...primaryCluster.options,
    dataDir: join(dirname(primaryCluster.options.dataDir), 'standby'),
    port: standbyPort,
    settings: { hot_standby: 'on', wal_keep_size: '256MB' },
  };
  const account = await ensurePostgresOsUser();
  const asPostgres = { uid: account.uid, gid: account.gid };
  const pgCtl = (dataDir: string, ...args: string[]): void => {
    const result = spawnSync(join(DEBIAN_PG15_BIN, 'pg_ctl'), [...args, '-D', dataDir, '-w', '-t', '60'], {
      ...asPostgres,
      cwd: '/tmp',
      encoding: 'utf8',
    });
    if (result.status !== 0) throw new Error(`pg_ctl ${args.join(' ')} failed: ${result.stderr}${result.stdout}`);
  };
  try {
    // The root folder is root's; the standby's data directory is the server user's, private.
    mkdirSync(standbyOptions.dataDir, { mode: 0o700 });
    chownSync(standbyOptions.dataDir, account.uid, account.gid);
    const backup = spawnSync(
      join(DEBIAN_PG15_BIN, 'pg_basebackup'),
      [
        '-h',
        '127.0.0.1',
        '-p',
        String(primaryCluster.options.port),
        '-U',
        'postgres',
        '-D',
        standbyOptions.dataDir,
        '-R',
        '-X',
        'stream',
        '-c',
        'fast',
      ],
      { ...asPostgres, cwd: '/tmp', encoding: 'utf8', env: { ...process.env, PGPASSWORD: password } },
    );
    if (backup.status !== 0) throw new Error(`pg_basebackup failed: ${backup.stderr}`);
    await startCluster(standbyOptions);
  } catch (error) {
    await started.dispose();
    throw error;
  }
  const node = (options: LocalClusterOptions): Node => ({
    options,
    port: options.port,
    url: `postgres://postgres:${password}@127.0.0.1:${options.port}/postgres`,
  });
  const primary = node(primaryCluster.options);
  const standby = node(standbyOptions);
  return {
    primary,
    standby,
    password,
    multiHostUrl: (database, params) =>
      `postgres://postgres:${password}@127.0.0.1:${primary.port},127.0.0.1:${standby.port}/${database}${params ? `?${params}` : ''}`,
    promote: () => pgCtl(standbyOptions.dataDir, 'promote'),
    stopPrimary: (mode = 'immediate') => pgCtl(primaryCluster.options.dataDir, 'stop', '-m', mode),
    caughtUp: async () => {
      const lsn = await withClient(
        primary.url,
        async (c) => (await c.query<{ l: string }>('select pg_current_wal_lsn()::text as l')).rows[0]!.l,
      );
      for (let i = 0; i < 300; i += 1) {
        const done = await withClient(
          standby.url,
          async (c) =>
            (await c.query<{ ok: boolean }>('select pg_last_wal_replay_lsn() >= $1::pg_lsn as ok', [lsn])).rows[0]!.ok,
        );
        if (done) return;
        await new Promise((resolve) => setTimeout(resolve, 50));
      }
      throw new Error(`the standby did not replay up to ${lsn} within 15 s`);
    },
    dispose: async () => {
      // The standby first: a stopped primary would leave its walreceiver retrying meanwhile.
      try {
        pgCtl(standbyOptions.dataDir, 'stop', '-m', 'immediate');
      } catch {
        // not running
      }
      await started.dispose();
    },
  };
}
