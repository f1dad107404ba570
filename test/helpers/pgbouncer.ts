/**
 * A real PgBouncer (Debian's package; test/pgbouncer/install.sh installs it) in transaction mode in
 * front of one test host, started by a test and stopped by it: the pooler production fleets of this
 * scheme put in front of their hosts. Every database name is passed through to the host; the
 * host's password is kept in PgBouncer's auth file, so clients connect with the same URL but the
 * pooler's port. Runs as the OS user postgres when the tests run as root (PgBouncer refuses root).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { chmod, chown, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { createConnection } from 'node:net';
import os from 'node:os';
import path from 'node:path';
import pg from 'pg';
import { findFreePort } from '../../src/dev/local-postgres.js';

export interface PgBouncer {
  /** `url` (a host's URL) with the pooler's host and port instead. */
  url(url: string): string;
  /** Server connections per database and user (default_pool_size). */
  readonly poolSize: number;
  /** The pooler's process (benchmarks read its CPU time). */
  readonly pid: number | undefined;
  stop(): Promise<void>;
}

export interface PgBouncerOptions {
  /** default_pool_size; default 4. */
  poolSize?: number;
  /** Startup parameters PgBouncer drops instead of refusing (ignore_startup_parameters). */
  ignoreStartupParameters?: readonly string[];
}

/** Debian's place (not on a normal user's PATH), then PATH (Homebrew, other distributions). */
const BINARY = [
  '/usr/sbin/pgbouncer',
  ...(process.env['PATH'] ?? '')
    .split(':')
    .filter(Boolean)
    .map((dir) => path.join(dir, 'pgbouncer')),
].find((file) => existsSync(file));

export async function startPgBouncer(hostUrl: string, options: PgBouncerOptions = {}): Promise<PgBouncer> {
  if (!BINARY) throw new Error('pgbouncer is not installed: run test/pgbouncer/install.sh (npm test does)');
  const target = new URL(hostUrl);
  const user = decodeURIComponent(target.username);
  const password = decodeURIComponent(target.password);
  const poolSize = options.poolSize ?? 4;
  const dir = await mkdtemp(path.join(os.tmpdir(), 'shardctl-pgbouncer-'));
  const port = await findFreePort();
  const asRoot = process.getuid?.() === 0;
  const ini = path.join(dir, 'pgbouncer.ini');
  const quote = (text: string) => `"${text.replaceAll('"', '""')}"`;
  await writeFile(path.join(dir, 'userlist.txt'), `${quote(user)} ${quote(password)}\n`);
  await writeFile(
    ini,
    [
      '[databases]',
      `* = host=${target.hostname} port=${target.port || 5432}`,
      '[pgbouncer]',
      'listen_addr = 127.0.0.1',
      `listen_port = ${port}`,
      `unix_socket_dir = ${dir}`,
      'auth_type = scram-sha-256',
      `auth_file = ${path.join(dir, 'userlist.txt')}`,
      'pool_mode = transaction',
      `default_pool_size = ${poolSize}`,
      'max_client_conn = 500',
      'max_db_connections = 0',
      'server_reset_query =',
      ...(options.ignoreStartupParameters?.length
        ? [`ignore_startup_parameters = ${options.ignoreStartupParameters.join(',')}`]
        : []),
      `logfile = ${path.join(dir, 'pgbouncer.log')}`,
      `pidfile = ${path.join(dir, 'pgbouncer.pid')}`,
      '',
    ].join('\n'),
  );
  if (asRoot) {
    const { uid, gid } = postgresUser();
    for (const file of [dir, ini, path.join(dir, 'userlist.txt')]) await chown(file, uid, gid);
    await chmod(dir, 0o700);
  }
  const child: ChildProcess = spawn(BINARY, [ini], {
    stdio: ['ignore', 'ignore', 'pipe'],
    ...(asRoot ? postgresUser() : {}),
  });
  let stderr = '';
  child.stderr?.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  const deadline = Date.now() + 10_000;
  while (!(await accepts(port))) {
    if (child.exitCode !== null || Date.now() > deadline) {
      child.kill('SIGKILL');
      await rm(dir, { recursive: true, force: true });
      throw new Error(`pgbouncer did not start: ${stderr.trim() || `exit ${child.exitCode}`}`);
    }
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  return {
    poolSize,
    pid: child.pid,
    url(url: string) {
      const via = new URL(url);
      via.hostname = '127.0.0.1';
      via.port = String(port);
      return via.toString();
    },
    async stop() {
      child.kill('SIGINT');
      await Promise.race([exited, new Promise((resolve) => setTimeout(resolve, 5000))]);
      if (child.exitCode === null) child.kill('SIGKILL');
      await rm(dir, { recursive: true, force: true });
    },
  };
}

function postgresUser(): { uid: number; gid: number } {
  const line = readFileSync('/etc/passwd', 'utf8')
    .split('\n')
    .find((l) => l.startsWith('postgres:'));
  if (!line) throw new Error('no OS user postgres to run pgbouncer as (it refuses to run as root)');
  const [, , uid, gid] = line.split(':');
  return { uid: Number(uid), gid: Number(gid) };
}

function accepts(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = createConnection({ host: '127.0.0.1', port });
    socket.once('connect', () => {
      socket.destroy();
      resolve(true);
    });
    socket.once('error', () => resolve(false));
  });
}

/**
 * `work` on every server connection of the pooler's pool at once (poolSize transactions held open
 * together each get one of their own); its values.
 */
export async function onEveryServerConnection<T>(
  url: string,
  poolSize: number,
  work: (client: pg.Client) => Promise<T>,
): Promise<T[]> {
  const clients = await Promise.all(
    Array.from({ length: poolSize }, async () => {
      const client = new pg.Client({ connectionString: url });
      await client.connect();
      await client.query('BEGIN');
      return client;
    }),
  );
  try {
    return await Promise.all(clients.map(work));
  } finally {
    await Promise.all(clients.map((c) => c.query('COMMIT').then(() => c.end())));
  }
}

/** Prepared statements left on the server connections of the pooler's pool for `url`, together. */
export const statementsLeft = async (url: string, poolSize: number): Promise<number> =>
  (
    await onEveryServerConnection(
      url,
      poolSize,
      async (c) => (await c.query<{ n: number }>('SELECT count(*)::int AS n FROM pg_prepared_statements')).rows[0]!.n,
    )
  ).reduce((a, b) => a + b, 0);
