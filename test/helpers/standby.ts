/**
 * A host with a streaming standby, for failover tests: a throw-away primary, a standby made from it
 * (`pg_basebackup -R` where the binaries have it, as Debian's PostgreSQL 15 does; else the low-level
 * backup API, for the embedded packages' initdb/pg_ctl/postgres), and what an operator does in a
 * failover: promote the standby, stop the old primary (`-m immediate`: a crash, nothing flushed or
 * said to clients).
 */
import { spawnSync } from 'node:child_process';
import {
  chownSync,
  copyFileSync,
  existsSync,
  lstatSync,
  mkdirSync,
  readdirSync,
  readlinkSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { dirname, join } from 'node:path';
import {
  ensurePostgresOsUser,
  findFreePort,
  runnableBinDir,
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
  /** The primary's physical slot the standby streams from (low-level backups only; null with pg_basebackup -R). */
  readonly standbySlot: string | null;
  /** pg_ctl promote -w on the standby; resolves once it accepts writes. */
  promote(): void;
  /** pg_ctl stop on the primary, -m immediate by default. */
  stopPrimary(mode?: 'immediate' | 'fast'): void;
  /**
   * The second half of a switchover: the old primary, stopped with `-m fast` (its shutdown
   * checkpoint streamed to the standby) after the standby was promoted, started again as a standby
   * of the new primary (standby.signal, primary_conninfo; it follows the new timeline, no rewind).
   * Resolves once it accepts connections, in recovery.
   */
  rejoinAsStandby(): Promise<void>;
  /** Waits until the standby has replayed everything the primary has written so far. */
  caughtUp(): Promise<void>;
  dispose(): Promise<void>;
}

export interface ReplicatedHostOptions {
  /**
   * The server binaries (default Debian's PostgreSQL 15). Without pg_basebackup there (the embedded
   * packages have only initdb, pg_ctl and postgres) the standby is made with the low-level backup API.
   */
  readonly binDir?: string;
  /** Settings of the standby, on top of hot_standby (e.g. sync_replication_slots). */
  readonly standbySettings?: Record<string, string>;
}

/** `settings` go to the primary only (e.g. synchronous_standby_names). */
export async function startReplicatedHost(
  settings: Record<string, string> = {},
  hostOptions: ReplicatedHostOptions = {},
): Promise<ReplicatedHost> {
  const binDir = hostOptions.binDir ?? DEBIAN_PG15_BIN;
  const lowLevel = !existsSync(join(binDir, 'pg_basebackup'));
  if (binDir === DEBIAN_PG15_BIN && lowLevel)
    throw new Error(`the failover tests need pg_basebackup in ${DEBIAN_PG15_BIN} (apt-get install postgresql-15)`);
  const started = await startOwnClusters([{ binDir, settings: { ...settings, wal_keep_size: '256MB' } }]);
  const primaryCluster = started.clusters[0]!;
  const password = primaryCluster.options.password;
  const standbyPort = await findFreePort();
  const standbyDataDir = join(dirname(primaryCluster.options.dataDir), 'standby');
  const standbyOptions: LocalClusterOptions = {
    ...primaryCluster.options,
    dataDir: standbyDataDir,
    port: standbyPort,
    settings: {
      hot_standby: 'on',
      wal_keep_size: '256MB',
      ...(lowLevel
        ? {
            primary_conninfo: `host=127.0.0.1 port=${primaryCluster.options.port} user=postgres password=${password} dbname=postgres application_name=standby1`,
            primary_slot_name: STANDBY_SLOT,
          }
        : {}),
      ...hostOptions.standbySettings,
    },
  };
  const account = await ensurePostgresOsUser();
  const asPostgres = { uid: account.uid, gid: account.gid };
  // Run as the server's OS user: the binaries where it can reach them (a copy when the checkout is
  // under a private folder such as /root).
  const toolsDir = await runnableBinDir(binDir);
  const pgCtl = (dataDir: string, ...args: string[]): void => {
    const result = spawnSync(join(toolsDir, 'pg_ctl'), [...args, '-D', dataDir, '-w', '-t', '60'], {
      ...asPostgres,
      cwd: '/tmp',
      encoding: 'utf8',
    });
    if (result.status !== 0)
      throw new Error(
        `pg_ctl ${args.join(' ')} failed: ${result.error?.message ?? `${result.stderr}${result.stdout}`}`,
      );
  };
  try {
    if (lowLevel) await copyWithBackupApi(primaryCluster.url, primaryCluster.options.dataDir, standbyDataDir, account);
    else {
      // The root folder is root's; the standby's data directory is the server user's, private.
      mkdirSync(standbyOptions.dataDir, { mode: 0o700 });
      chownSync(standbyOptions.dataDir, account.uid, account.gid);
      const backup = spawnSync(
        join(toolsDir, 'pg_basebackup'),
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
    }
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
    standbySlot: lowLevel ? STANDBY_SLOT : null,
    stopPrimary: (mode = 'immediate') => pgCtl(primaryCluster.options.dataDir, 'stop', '-m', mode),
    rejoinAsStandby: async () => {
      const signal = join(primaryCluster.options.dataDir, 'standby.signal');
      writeFileSync(signal, '', { mode: 0o600 });
      chownSync(signal, account.uid, account.gid);
      await startCluster({
        ...primaryCluster.options,
        settings: {
          ...primaryCluster.options.settings,
          hot_standby: 'on',
          primary_conninfo: `host=127.0.0.1 port=${standbyPort} user=postgres password=${password} application_name=old_primary`,
        },
      });
    },
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

/** The primary's physical slot for a standby made with the low-level backup API. */
const STANDBY_SLOT = 'standby1';

/** What a base backup leaves out (the server recreates them), by name in the data directory's top level. */
const EMPTIED = new Set([
  'pg_wal',
  'pg_replslot',
  'pg_stat_tmp',
  'pg_dynshmem',
  'pg_notify',
  'pg_serial',
  'pg_snapshots',
  'pg_subtrans',
]);
const SKIPPED = new Set(['postmaster.pid', 'postmaster.opts', 'backup_label', 'tablespace_map', 'standby.signal']);

/**
 * A standby's data directory made from a running primary without pg_basebackup: a physical slot
 * (so the primary keeps the WAL from the backup's start), pg_backup_start in a session kept open,
 * the files copied (a file that vanishes meanwhile is skipped: the WAL replay recreates what it
 * needs), pg_backup_stop, its label written as backup_label, then standby.signal.
 */
async function copyWithBackupApi(
  primaryUrl: string,
  from: string,
  to: string,
  account: { uid: number; gid: number },
): Promise<void> {
  await withClient(primaryUrl, async (c) => {
    await c.query(`select pg_create_physical_replication_slot($1, true)`, [STANDBY_SLOT]);
    await c.query(`select pg_backup_start('shardctl standby', true)`);
    copyTree(from, to, true);
    const stop = await c.query<{ labelfile: string; spcmapfile: string | null }>(
      'select labelfile, spcmapfile from pg_backup_stop()',
    );
    writeFileSync(join(to, 'backup_label'), stop.rows[0]!.labelfile, { mode: 0o600 });
    if (stop.rows[0]!.spcmapfile) writeFileSync(join(to, 'tablespace_map'), stop.rows[0]!.spcmapfile, { mode: 0o600 });
  });
  writeFileSync(join(to, 'standby.signal'), '', { mode: 0o600 });
  chownTree(to, account);
}

function copyTree(from: string, to: string, top: boolean): void {
  mkdirSync(to, { mode: 0o700, recursive: true });
  for (const name of readdirSync(from)) {
    if (top && SKIPPED.has(name)) continue;
    if (name.startsWith('.s.PGSQL.')) continue;
    const source = join(from, name);
    const target = join(to, name);
    try {
      const stat = lstatSync(source);
      if (stat.isDirectory()) {
        if (top && EMPTIED.has(name)) mkdirSync(target, { mode: 0o700 });
        else copyTree(source, target, false);
      } else if (stat.isSymbolicLink()) symlinkSync(readlinkSync(source), target);
      else if (stat.isFile()) copyFileSync(source, target);
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== 'ENOENT') throw error;
    }
  }
  if (top) mkdirSync(join(to, 'pg_wal', 'archive_status'), { recursive: true, mode: 0o700 });
}

function chownTree(dir: string, account: { uid: number; gid: number }): void {
  chownSync(dir, account.uid, account.gid);
  for (const name of readdirSync(dir)) {
    const path = join(dir, name);
    const stat = lstatSync(path);
    if (stat.isSymbolicLink()) continue;
    if (stat.isDirectory()) chownTree(path, account);
    else chownSync(path, account.uid, account.gid);
  }
}
