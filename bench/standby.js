/**
 * A throw-away primary and a streaming standby made from it by `pg_basebackup -R` (the Debian
 * binaries of `major`: the embedded ones ship no pg_basebackup), for the benchmarks that need a
 * host with a standby (failover, replica-reads). `stopPrimary` and `promote` are what a failover
 * manager does; `dispose` stops both and removes their data. `standbyPairSection` is the report
 * both benchmarks write.
 */
import { spawn } from 'node:child_process';
import { chmod, chown, mkdir, mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import pg from 'pg';
import {
  ensurePostgresOsUser,
  findFreePort,
  initCluster,
  startCluster,
  stopCluster,
} from '../dist/dev/local-postgres.js';
import { binDirFor, markdownTable, textTable } from './lib.js';

/**
 * Runs a binary as the server's OS user (PostgreSQL refuses root); resolves with its exit code.
 * @param {import('../dist/dev/local-postgres.js').OsAccount} account
 * @param {string} file
 * @param {string[]} args
 * @param {NodeJS.ProcessEnv} [env]
 * @returns {Promise<number>}
 */
function asPostgres(account, file, args, env = process.env) {
  return new Promise((resolve, reject) => {
    const child = spawn(file, args, { uid: account.uid, gid: account.gid, cwd: os.tmpdir(), env, stdio: 'ignore' });
    child.once('error', reject);
    child.once('close', (code) => resolve(code ?? -1));
  });
}

/**
 * Starts the pair and creates `database` on the primary (replicated to the standby).
 * @param {string} major
 * @param {string} name
 * @param {string} database
 */
export async function startPrimaryWithStandby(major, name, database) {
  const binDir = binDirFor(major);
  if (!binDir)
    throw new Error(`a standby needs PostgreSQL ${major} from Debian (pg_basebackup): the embedded binaries have none`);
  const account = await ensurePostgresOsUser();
  const root = await mkdtemp(path.join(os.tmpdir(), `shardctl-bench-${name}-`));
  await chmod(root, 0o755);
  const password = `pw${Math.random().toString(16).slice(2)}`;
  const primary = { dataDir: path.join(root, 'primary'), port: await findFreePort(), password, binDir };
  const standby = {
    ...primary,
    dataDir: path.join(root, 'standby'),
    port: await findFreePort(),
    settings: { hot_standby: 'on' },
  };
  const dispose = async () => {
    await Promise.allSettled([stopCluster(standby), stopCluster(primary)]);
    await rm(root, { recursive: true, force: true });
  };
  try {
    await initCluster(primary);
    await startCluster(primary);
    await mkdir(standby.dataDir, { mode: 0o700 });
    await chown(standby.dataDir, account.uid, account.gid);
    const backup = await asPostgres(
      account,
      path.join(binDir, 'pg_basebackup'),
      [
        '-h',
        '127.0.0.1',
        '-p',
        String(primary.port),
        '-U',
        'postgres',
        '-D',
        standby.dataDir,
        '-R',
        '-X',
        'stream',
        '-c',
        'fast',
      ],
      { ...process.env, PGPASSWORD: password },
    );
    if (backup !== 0) throw new Error(`pg_basebackup exited ${backup}`);
    await startCluster(standby);
    const admin = new pg.Client({
      connectionString: `postgres://postgres:${password}@127.0.0.1:${primary.port}/postgres`,
    });
    await admin.connect();
    await admin.query(`create database ${database}`);
    await admin.end();
  } catch (error) {
    await dispose();
    throw error;
  }
  const pgCtl = /** @param {string[]} args */ (...args) => asPostgres(account, path.join(binDir, 'pg_ctl'), args);
  return {
    primary,
    standby,
    /** The fleet's host: its URL lists the primary, then the standby. */
    host: {
      name: 'pg1',
      url: /** @param {string} db */ (db) =>
        `postgres://postgres:${password}@127.0.0.1:${primary.port},127.0.0.1:${standby.port}/${db}`,
    },
    nodeUrl: /** @param {{ port: number }} node @param {string} db */ (node, db) =>
      `postgres://postgres:${password}@127.0.0.1:${node.port}/${db}`,
    stopPrimary: async () => {
      const code = await pgCtl('stop', '-D', primary.dataDir, '-m', 'immediate', '-w');
      if (code !== 0) throw new Error(`pg_ctl stop exited ${code}`);
    },
    promote: async () => {
      const code = await pgCtl('promote', '-D', standby.dataDir, '-w');
      if (code !== 0) throw new Error(`pg_ctl promote exited ${code}`);
    },
    dispose,
  };
}

/**
 * The report of a benchmark run on a primary and its standby (failover, replica-reads): its text
 * table for the terminal and its markdown section per PostgreSQL major, one frame around the
 * benchmark's own rows and footer.
 * @template {{ major: string }} R
 * @param {{ name: string, shards: number, headers: string[], rows: (result: R) => string[][], footer: (result: R) => string }} report
 */
export function standbyPairSection(report) {
  return {
    /** @param {R} result */
    table: (result) =>
      `${report.name}, PostgreSQL ${result.major}, primary + streaming standby, ${report.shards} shards\n${textTable(report.headers, report.rows(result))}\n${report.footer(result)}`,
    /** @param {R[]} results */
    markdown: (results) =>
      results
        .map(
          (result) =>
            `PostgreSQL ${result.major}, a primary and a streaming standby (pg_basebackup -R), ${report.shards} shards, the host's URL listing both:\n\n${markdownTable(report.headers, report.rows(result))}\n\n${report.footer(result)}`,
        )
        .join('\n\n'),
  };
}
