/**
 * For move tests: the built CLI in its own process (so a fault can SIGKILL it), what the hosts say
 * about a shard, its move and the replication objects a move may leave behind, and throw-away
 * clusters for tests that restart a host or need other server settings.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import {
  chmodSync,
  cpSync,
  existsSync,
  mkdtempSync,
  readFileSync,
  readdirSync,
  rmSync,
  statSync,
  symlinkSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type pg from 'pg';
import { shardMovedTo, type ShardMap } from '../../src/config/shard-map.js';
import { afterAll, beforeAll, inject, onTestFinished } from 'vitest';
import {
  findFreePort,
  initCluster,
  startCluster,
  stopCluster,
  type LocalClusterOptions,
} from '../../src/dev/local-postgres.js';
import { adminClient, type TestDatabases, withClient } from './hosts.js';
import { type Fleet, makeFleet } from './fleet.js';
import { tempDir } from './temp.js';
import { postgresContainer } from './containers.js';
import { init } from '../../src/commands/init.js';
import type { ShardctlConfig } from '../../src/config/types.js';

const ROOT = join(import.meta.dirname, '..', '..');

export interface ProcessRun {
  readonly code: number | null;
  readonly signal: NodeJS.Signals | null;
  readonly stdout: string;
  readonly stderr: string;
}

/**
 * `node bin/shardctl.js <args>` with its own environment additions; stdin is not a terminal. It runs
 * a private copy of the build, taken once per test file, so a concurrent `npm run build` rewriting
 * dist/ cannot break a child halfway through loading it.
 */
export async function spawnCli(args: readonly string[], env: NodeJS.ProcessEnv = {}): Promise<ProcessRun> {
  const root = await cliSnapshot();
  return runNode([join(root, 'bin', 'shardctl.js'), ...args], env);
}

/** The CLI (as spawnCli) started, not awaited: its process, to kill, and its end. */
export async function startCli(
  args: readonly string[],
  env: NodeJS.ProcessEnv = {},
): Promise<{ child: ChildProcess; done: Promise<ProcessRun>; output: () => string }> {
  const root = await cliSnapshot();
  return startNode([join(root, 'bin', 'shardctl.js'), ...args], env);
}

/**
 * Whether the source's change log of `schema`.photos has a start marker: the copy's logs were set
 * up there (under load they may not be, within their 5 s), so a resumed copy can settle its chunks
 * from the log rather than by reading them.
 */
export async function logStarted(sourceUrl: string, schema: string): Promise<boolean> {
  return withClient(sourceUrl, async (c) => {
    const r = await c.query<{ n: number }>(
      `select count(*)::int as n from shardctl.move_deltas where sign = 2 and schema_name = $1 and table_name = 'photos'`,
      [schema],
    );
    return r.rows[0]!.n > 0;
  });
}

/** Removes the private copy of the build (call from afterAll). */
export async function removeCliSnapshot(): Promise<void> {
  const root = await snapshot?.catch(() => undefined);
  snapshot = undefined;
  if (root) rmSync(root, { recursive: true, force: true });
}

let snapshot: Promise<string> | undefined;

function cliSnapshot(): Promise<string> {
  snapshot ??= takeSnapshot();
  return snapshot;
}

async function takeSnapshot(): Promise<string> {
  assertMoveBuildIsFresh();
  for (let attempt = 1; ; attempt++) {
    // Also removed after the file when the file's afterAll(removeCliSnapshot) never ran.
    const dir = tempDir('shardctl-cli-');
    for (const entry of ['bin', 'dist', 'sql', 'package.json'])
      cpSync(join(ROOT, entry), join(dir, entry), { recursive: true });
    symlinkSync(join(ROOT, 'node_modules'), join(dir, 'node_modules'), 'dir');
    // Loading the CLI loads every module: a copy taken while tsc was writing fails here.
    const probe = await runNode([join(dir, 'bin', 'shardctl.js'), '--version']);
    if (probe.code === 0) return dir;
    rmSync(dir, { recursive: true, force: true });
    if (attempt === 5) throw new Error(`the built CLI does not load (run npm run build): ${probe.stderr}`);
    await new Promise((resolve) => setTimeout(resolve, 1000));
  }
}

function runNode(args: readonly string[], env: NodeJS.ProcessEnv = {}): Promise<ProcessRun> {
  return startNode(args, env).done;
}

function startNode(
  args: readonly string[],
  env: NodeJS.ProcessEnv = {},
): { child: ChildProcess; done: Promise<ProcessRun>; output: () => string } {
  const child = spawn(process.execPath, args, {
    cwd: ROOT,
    env: { ...process.env, NO_COLOR: '1', ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stdout = '';
  let stderr = '';
  child.stdout.setEncoding('utf8').on('data', (chunk: string) => (stdout += chunk));
  child.stderr.setEncoding('utf8').on('data', (chunk: string) => (stderr += chunk));
  const done = new Promise<ProcessRun>((resolve, reject) => {
    child.once('error', reject);
    child.once('close', (code, signal) => resolve({ code, signal, stdout, stderr }));
  });
  return { child, done, output: () => `${stdout}${stderr}` };
}

/** A child running stale JavaScript would test old code: refuse, naming the file (run npm run build). */
function assertMoveBuildIsFresh(): void {
  const sources = [
    // Every module of moves/ and its folders (moves/sql/), file by file: a folder's own mtime says nothing of its files.
    ...readdirSync(join(ROOT, 'src', 'moves'), { recursive: true, encoding: 'utf8' })
      .filter((f) => f.endsWith('.ts'))
      .map((f) => join('moves', f)),
    join('cli', 'move-shard.ts'),
    join('cli', 'gc.ts'),
  ];
  const stale = sources.filter((file) => {
    const built = join(ROOT, 'dist', file.replace(/\.ts$/, '.js'));
    return !existsSync(built) || statSync(built).mtimeMs < statSync(join(ROOT, 'src', file)).mtimeMs;
  });
  if (stale.length > 0) {
    throw new Error(
      `dist/ is older than ${stale.map((f) => join('src', f)).join(', ')}: run npm run build before these tests`,
    );
  }
}

/**
 * Publications, subscriptions and replication slots of the test database on these hosts (every
 * slot of the database, so a table-sync slot a dropped subscription forgot counts too).
 */
export async function replicationObjects(urls: readonly string[]): Promise<string[]> {
  const found: string[] = [];
  for (const url of urls) {
    await withClient(url, async (client) => {
      const r = await client.query<{ what: string }>(
        `select 'publication ' || pubname as what from pg_publication
         union all select 'subscription ' || subname from pg_subscription where subdbid = (select oid from pg_database where datname = current_database())
         union all select 'slot ' || slot_name from pg_replication_slots where database = current_database()`,
      );
      found.push(...r.rows.map((row) => `${new URL(url).port}: ${row.what}`));
    });
  }
  return found;
}

/**
 * Waits until no backend of a `shardctl move` run is left in the test database: a killed run's
 * sessions end a moment after the process, and with them its runner lock.
 */
export async function waitForMoveSessionsToEnd(urls: readonly string[], timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (const url of urls) {
    await withClient(url, async (client) => {
      for (;;) {
        const r = await client.query<{ n: string }>(
          `select count(*) as n from pg_stat_activity where datname = current_database() and application_name = 'shardctl move' and pid <> pg_backend_pid()`,
        );
        if (r.rows[0]!.n === '0') return;
        if (Date.now() > deadline)
          throw new Error(
            `sessions of a killed shardctl move still open on ${new URL(url).port} after ${timeoutMs} ms`,
          );
        await new Promise((resolve) => setTimeout(resolve, 20));
      }
    });
  }
}

/**
 * `statements` as a session that gets past an incoming copy's guard (src/moves/sql/incoming.ts),
 * which refuses every other write to it: what a test needs to change the target behind a move's
 * back (a superuser under the replica role would get past it the same way).
 */
export function pastIncomingGuard(statements: string): string {
  return `set shardctl.building = 'on'; ${statements}`;
}

export async function schemaExists(client: pg.Client, schema: string): Promise<boolean> {
  const r = await client.query<{ e: boolean }>('select to_regnamespace($1) is not null as e', [schema]);
  return r.rows[0]!.e;
}

/** shardctl.shards on one host: the shard's state and schema, or null. */
export async function shardRow(client: pg.Client, shard: number): Promise<{ state: string; schema: string } | null> {
  const r = await client.query<{ state: string; schema_name: string }>(
    'select state, schema_name from shardctl.shards where shard = $1',
    [shard],
  );
  const row = r.rows[0];
  return row ? { state: row.state, schema: row.schema_name } : null;
}

/** The newest move of a shard recorded on one host. */
export async function lastMove(
  client: pg.Client,
  shard: number,
): Promise<{ moveId: string; step: string; status: string } | null> {
  const r = await client.query<{ move_id: string; step: string; status: string }>(
    'select move_id, step, status from shardctl.moves where shard = $1 order by started_at desc, move_id desc limit 1',
    [shard],
  );
  const row = r.rows[0];
  return row ? { moveId: row.move_id, step: row.step, status: row.status } : null;
}

/**
 * Every row of every table of a schema, as one fingerprint per table: count and an md5 over the
 * rows in order (UTC, so hosts with different time zones print timestamps alike).
 */
export async function schemaFingerprint(client: pg.Client, schema: string): Promise<Record<string, string>> {
  const tables = await client.query<{ relname: string }>(
    `select relname from pg_class where relnamespace = to_regnamespace($1) and relkind = 'r' order by relname`,
    [schema],
  );
  const out: Record<string, string> = {};
  await client.query(`set timezone = 'UTC'`);
  for (const { relname } of tables.rows) {
    const r = await client.query<{ n: string; md5: string | null }>(
      `select count(*) as n, md5(string_agg(t::text, E'\\n' order by t::text)) as md5 from "${schema}"."${relname}" t`,
    );
    out[relname] = `${r.rows[0]!.n} ${r.rows[0]!.md5 ?? '-'}`;
  }
  return out;
}

export interface OwnCluster {
  readonly options: LocalClusterOptions;
  /** Superuser URL of its postgres database. */
  readonly url: string;
}

/**
 * Throw-away clusters for tests that restart a host or need other server settings (the shared hosts
 * of the global setup are never stopped). dispose() stops them and removes their data.
 */
export async function startOwnClusters(
  specs: readonly { binDir?: string; settings?: Record<string, string | number> }[],
): Promise<{ clusters: OwnCluster[]; dispose: () => Promise<void> }> {
  const root = mkdtempSync(join(tmpdir(), 'shardctl-move-test-'));
  // The server runs as the OS user postgres when we are root: it must reach the data directories.
  chmodSync(root, 0o755);
  const password = randomBytes(12).toString('hex');
  const clusters: OwnCluster[] = [];
  for (const [i, spec] of specs.entries()) {
    const options: LocalClusterOptions = {
      dataDir: join(root, `pg${i + 1}`),
      port: await findFreePort(),
      password,
      // Default: the binaries of the run (under the matrix, its major).
      binDir: spec.binDir ?? inject('pgBinDir'),
      ...(spec.settings ? { settings: spec.settings } : {}),
    };
    clusters.push({ options, url: `postgres://postgres:${password}@127.0.0.1:${options.port}/postgres` });
  }
  const dispose = async (): Promise<void> => {
    await Promise.allSettled(clusters.map((c) => stopCluster(c.options)));
    rmSync(root, { recursive: true, force: true });
  };
  try {
    await Promise.all(
      clusters.map(async (c) => {
        await initCluster(c.options);
        await startCluster(c.options);
      }),
    );
  } catch (error) {
    await dispose();
    throw error;
  }
  return { clusters, dispose };
}

export interface OwnHost {
  /** Superuser URL of its postgres database, from the tests. */
  readonly url: string;
  /** How the shared hosts of the global setup reach it. */
  readonly replicationUrl: string;
}

/**
 * One more host with other server settings, reachable by the shared hosts: under testcontainers a
 * container of the same image on their Docker network (a local cluster could not be reached from
 * inside a container), otherwise a throw-away local cluster.
 */
export async function startOwnHost(
  settings: Record<string, string>,
): Promise<{ host: OwnHost; dispose: () => Promise<void> }> {
  const docker = inject('pgDocker');
  if (!docker) {
    const { clusters, dispose } = await startOwnClusters([{ settings }]);
    return { host: { url: clusters[0]!.url, replicationUrl: clusters[0]!.url }, dispose };
  }
  // Test workers may have started before the global setup chose it.
  if (docker.hostOverride !== null) process.env.TESTCONTAINERS_HOST_OVERRIDE ??= docker.hostOverride;
  const alias = `own-${randomBytes(4).toString('hex')}`;
  const password = randomBytes(12).toString('hex');
  const container = await (
    await postgresContainer(docker.image)
  )
    .withNetworkMode(docker.network)
    .withNetworkAliases(alias)
    .withUsername('postgres')
    .withPassword(password)
    .withDatabase('postgres')
    .withLabels({ 'org.shardctl.test': 'true' })
    .withCommand(['postgres', ...Object.entries(settings).flatMap(([name, value]) => ['-c', `${name}=${value}`])])
    .start();
  return {
    host: {
      url: container.getConnectionUri(),
      replicationUrl: `postgres://postgres:${password}@${alias}:5432/postgres`,
    },
    dispose: async () => {
      await container.stop();
    },
  };
}

/**
 * What a move could change, on every host and in the config file: schemas, shardctl's rows about
 * shards and moves, replication objects. Equal before and after means nothing was changed.
 */
export async function fleetState(urls: readonly string[], configFile: string): Promise<unknown> {
  const hosts = [];
  for (const url of urls) {
    hosts.push(
      await withClient(url, async (client) => ({
        schemas: (
          await client.query(`select nspname from pg_namespace where nspname !~ '^(pg_|information_schema)' order by 1`)
        ).rows,
        shards: (await client.query(`select shard, schema_name, state from shardctl.shards order by shard`)).rows,
        moves: (await client.query(`select * from shardctl.moves order by move_id`)).rows,
        markers: (await client.query(`select * from shardctl.move_markers order by move_id, kind`)).rows,
      })),
    );
  }
  return { hosts, replication: await replicationObjects(urls), config: readFileSync(configFile, 'utf8') };
}

/**
 * An application writing to one shard while it moves: one statement string after another (by
 * default a photos insert returning its id), on a connection per host, routed by `map` and following
 * the move on SQLSTATE SC100 (reload the map, retry after 5 ms). A statement string may be a whole
 * transaction (`begin; …; commit`); a failed one is rolled back before the next. Call it within a
 * test: the writer is stopped when the test ends, also when it failed.
 */
export function startShardWriter(
  map: ShardMap,
  shard: number,
  statement: (i: number) => string = () =>
    `insert into insta${shard}.photos (user_id, image_url) values (${shard}, 'w') returning id`,
) {
  /** Ids returned by single statements, with the host that acknowledged them and the statement's number. */
  const acknowledged: { id: bigint; host: string; i: number }[] = [];
  const clients = new Map<string, pg.Client>();
  let writes = 0;
  let fenceErrors = 0;
  let stop = false;
  let stopped: Promise<void> | undefined;
  const loop = (async () => {
    for (let i = 1; !stop; i++) {
      const host = map.hostForShard(shard);
      let client = clients.get(host.name);
      if (!client) {
        client = await adminClient(host.url);
        // A failed test drops its databases WITH (FORCE): the writer's connection must not crash the run.
        client.on('error', () => undefined);
        clients.set(host.name, client);
      }
      try {
        const result = (await client.query<{ id?: string }>(statement(i))) as
          pg.QueryResult<{ id?: string }> | pg.QueryResult<{ id?: string }>[];
        writes += 1;
        const id = Array.isArray(result) ? undefined : result.rows[0]?.id;
        if (id !== undefined) acknowledged.push({ id: BigInt(id), host: host.name, i });
      } catch (error) {
        await client.query('rollback').catch(() => undefined);
        if (!shardMovedTo(error)) throw error;
        fenceErrors += 1;
        await map.reload();
        await new Promise((resolve) => setTimeout(resolve, 5));
      }
    }
  })();
  const writer = {
    acknowledged,
    get writes() {
      return writes;
    },
    get fenceErrors() {
      return fenceErrors;
    },
    /** Stops the writer once; called again (a test's own end, then its cleanup) it waits for the same stop. */
    stop() {
      stopped ??= (async () => {
        stop = true;
        try {
          await loop;
        } finally {
          for (const c of clients.values()) await c.end();
        }
      })();
      return stopped;
    },
  };
  // A test that fails before its own stop leaves no writer behind to write into the next test's fleet.
  onTestFinished(() => writer.stop().catch(() => undefined));
  return writer;
}

/**
 * `rows` photos rows in `shard` on the host at `url`, each image_url `width` characters of 'p' and
 * its number, then ANALYZE (a chunked copy cuts its chunks at the key's statistics).
 */
export async function insertPhotos(url: string, shard: number, rows: number, width: number): Promise<void> {
  await withClient(url, (c) =>
    c.query(
      `insert into insta${shard}.photos (user_id, image_url) select g, repeat('p', ${width}) || g from generate_series(1, ${rows}) g;
       analyze insta${shard}.photos`,
    ),
  );
}

/** A chunk of a resumable copy, as the target records it (shardctl.move_chunks). */
export interface ChunkRecord {
  readonly chunk: number;
  readonly copied: boolean;
  /** A run began its copy (its snapshot recorded). */
  readonly attempted: boolean;
  readonly rows: string | null;
  readonly key_column: string;
  readonly lo: string | null;
}

/** The chunk records of `table` (as the move names it: `"schema"."table"`) on the host at `url`, in chunk order. */
export async function chunkRecords(url: string, table: string): Promise<ChunkRecord[]> {
  return withClient(url, async (c) => {
    const r = await c.query<ChunkRecord>(
      `select chunk, copied, snapshot is not null as attempted, rows::text as rows, key_column, lo::text as lo
         from shardctl.move_chunks where table_name = $1 order by chunk`,
      [table],
    );
    return r.rows;
  });
}

/**
 * The fleet most move tests start from: 4 shards, 0-1 on the first host and 2-3 on the second,
 * initialised, with `rows` photos rows seeded into `shard` (on the first host).
 */
export async function seededFleet(
  urls: readonly string[],
  shard: number,
  rows: number,
): Promise<{ fleet: Fleet; config: ShardctlConfig }> {
  const fleet = makeFleet({ urls, shards: 4, split: ['0-1', '2-3'] });
  const config = await fleet.config();
  const initialised = await init(config);
  if (!initialised.ok) throw new Error(`init of the test fleet failed: ${JSON.stringify(initialised)}`);
  await withClient(urls[0]!, (c) =>
    c.query(
      `insert into insta${shard}.photos (user_id, image_url) select g, 'seed' from generate_series(1, ${rows}) g`,
    ),
  );
  return { fleet, config };
}

/**
 * For a describe block: a fleet of `shards` over the two hosts of `db` (split as given), initialised
 * before the tests, with a superuser connection to each host (source pg1, target pg2) closed after
 * the block.
 */
export function useTwoHostFleet(
  db: TestDatabases,
  layout: { shards: number; split: [string, string] },
): { readonly fleet: () => Fleet; readonly source: () => pg.Client; readonly target: () => pg.Client } {
  let fleet: Fleet | undefined;
  let source: pg.Client | undefined;
  let target: pg.Client | undefined;
  beforeAll(async () => {
    fleet = makeFleet({ urls: db.urls, shards: layout.shards, split: layout.split });
    const result = await init(await fleet.config());
    if (!result.ok) throw new Error('init of the two-host fleet failed');
    source = await adminClient(db.urls[0]!);
    target = await adminClient(db.urls[1]!);
  });
  afterAll(async () => {
    await source?.end();
    await target?.end();
  });
  return { fleet: () => fleet!, source: () => source!, target: () => target! };
}
