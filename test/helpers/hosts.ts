/**
 * For test files: a fresh database per file on each PostgreSQL host of the global setup, so files
 * run in parallel without seeing each other's schemas.
 */
import { randomBytes } from 'node:crypto';
import pg from 'pg';
import { afterAll, beforeAll, inject } from 'vitest';
import type { HostConfig } from '../../src/config/types.js';
import type { TestHostInfo } from './global-setup.js';

export type { TestHostInfo } from './global-setup.js';

export interface TestDatabases {
  /** The database name, the same on every host (t_<random>). */
  readonly name: string;
  /** Superuser URL of the new database on each host, in host order. Available once beforeAll ran. */
  readonly urls: string[];
  /** How the other hosts reach the new database on each host (logical replication). */
  readonly replicationUrls: string[];
  /** The hosts used, in order. */
  readonly hosts: TestHostInfo[];
}

/** The hosts the global setup provides. */
export function testHosts(): TestHostInfo[] {
  return inject('pgHosts');
}

/**
 * Registers a beforeAll that creates a uniquely named database on each of the first `count` hosts,
 * and an afterAll that drops it (WITH (FORCE): a failed test may leave sessions open).
 */
export function useTestDatabases(count = 2): TestDatabases {
  const name = `t_${randomBytes(6).toString('hex')}`;
  let ready: { urls: string[]; replicationUrls: string[]; hosts: TestHostInfo[] } | undefined;
  const created: TestHostInfo[] = [];

  beforeAll(async () => {
    const all = testHosts();
    if (all.length < count) {
      throw new Error(`the test needs ${count} PostgreSQL hosts; the global setup provides ${all.length}`);
    }
    const hosts = all.slice(0, count);
    for (const host of hosts) {
      await withClient(host.url, (client) => client.query(`create database "${name}"`));
      created.push(host);
    }
    ready = {
      hosts,
      urls: hosts.map((host) => urlWithDatabase(host.url, name)),
      replicationUrls: hosts.map((host) => urlWithDatabase(host.replicationUrl, name)),
    };
  });

  afterAll(async () => {
    for (const host of created) {
      await withClient(host.url, (client) => client.query(`drop database if exists "${name}" with (force)`));
    }
  });

  const get = (): NonNullable<typeof ready> => {
    if (!ready) throw new Error('useTestDatabases(): the databases exist only once beforeAll has run');
    return ready;
  };
  return {
    name,
    get urls() {
      return get().urls;
    },
    get replicationUrls() {
      return get().replicationUrls;
    },
    get hosts() {
      return get().hosts;
    },
  };
}

/** A connected client; the caller ends it. */
export async function adminClient(url: string): Promise<pg.Client> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  return client;
}

/** Runs fn with a connected client and always ends the client. */
export async function withClient<T>(url: string, fn: (client: pg.Client) => Promise<T>): Promise<T> {
  const client = await adminClient(url);
  try {
    return await fn(client);
  } finally {
    await client.end();
  }
}

/**
 * The last `count` ERROR entries of url's server log (its last 4 MB), each with the DETAIL/CONTEXT/STATEMENT lines
 * after it, for a failing test to print (what an apply worker or a walsender met is written only
 * there). Read through SQL as the tests' superuser (`pg_read_file`, the log in the data directory,
 * as the embedded hosts and dev hosts keep it); a message saying why when it cannot be read (a
 * container logs to its own output).
 */
export async function serverLogErrors(url: string, count = 20): Promise<string> {
  try {
    return await withClient(url, async (c) => {
      // Its last 4 MB, as bytes (a cut through a character must not fail the read): a shared host's
      // log of a whole run is much longer (a first line cut in two is no ERROR line and is skipped).
      const r = await c.query<{ log: Buffer }>(
        `select pg_read_binary_file('server.log', greatest(s.size - 4194304, 0), 4194304) as log from pg_stat_file('server.log') s`,
      );
      const lines = r.rows[0]!.log.toString('utf8').split('\n');
      const entries: string[] = [];
      for (let i = 0; i < lines.length; i++) {
        if (!/\b(ERROR|FATAL|PANIC):/.test(lines[i]!)) continue;
        let entry = lines[i]!;
        while (i + 1 < lines.length && /^\S+ \S+ \S+ \[\d+\] (DETAIL|CONTEXT|STATEMENT|HINT):|^\t/.test(lines[i + 1]!))
          entry += `\n${lines[++i]!}`;
        entries.push(entry.length > 1_500 ? `${entry.slice(0, 1_500)} …` : entry);
      }
      return entries.slice(-count).join('\n');
    });
  } catch (error) {
    return `(the server log could not be read: ${(error as Error).message})`;
  }
}

/**
 * How many sessions of url's server still run `query` after waiting up to timeoutMs for none to:
 * a query the code under test cancelled ends on the server a moment later.
 */
export async function stillRunningAfter(url: string, query: string, timeoutMs = 5_000): Promise<number> {
  const running = () =>
    withClient(url, async (c) =>
      Number(
        (
          await c.query<{ n: string }>(
            `select count(*) as n from pg_stat_activity where query = $1 and state = 'active' and pid <> pg_backend_pid()`,
            [query],
          )
        ).rows[0]!.n,
      ),
    );
  const deadline = performance.now() + timeoutMs;
  let n = await running();
  while (n > 0 && performance.now() < deadline) {
    await new Promise((r) => setTimeout(r, 50));
    n = await running();
  }
  return n;
}

/** The database a URL names (its path), decoded. */
export const databaseOf = (url: string): string => decodeURIComponent(new URL(url).pathname.slice(1));

/** The same URL as another role, with its password. */
export function asRole(url: string, role: string, password: string): string {
  const u = new URL(url);
  u.username = role;
  u.password = password;
  return u.toString();
}

/**
 * An operator role that is not a superuser, on each URL's server: it may log in, replicate, create
 * schemas in the URL's database and, from PostgreSQL 16, subscriptions (pg_create_subscription;
 * before 16 only a superuser may). The servers' majors, in the order of `urls`.
 */
export async function createOperatorRole(urls: readonly string[], role: string, password: string): Promise<number[]> {
  const majors: number[] = [];
  for (const url of urls)
    await withClient(url, async (c) => {
      await c.query(`CREATE ROLE ${role} LOGIN REPLICATION PASSWORD '${password}'`);
      await c.query(`GRANT CREATE ON DATABASE "${databaseOf(url)}" TO ${role}`);
      const major = (await c.query<{ v: number }>("select current_setting('server_version_num')::int / 10000 as v"))
        .rows[0]!.v;
      if (major >= 16) await c.query(`GRANT pg_create_subscription TO ${role}`);
      majors.push(major);
    });
  return majors;
}

/** The same server and credentials, another database. */
export function urlWithDatabase(url: string, database: string): string {
  const parsed = new URL(url);
  parsed.pathname = `/${encodeURIComponent(database)}`;
  return parsed.toString();
}

/** A host of a config with only its name and address set: what connectHost needs. */
export function bareHost(name: string, url: string): HostConfig {
  return {
    name,
    url,
    directUrl: '',
    replicationUrl: '',
    shardsSpec: '',
    shards: [],
    weight: 1,
    drain: false,
    timeoutMs: 5000,
  };
}

/** The error a query (or any promise) fails with; a test failure when it succeeds. */
export function errorOf(promise: Promise<unknown>): Promise<pg.DatabaseError> {
  return promise.then(
    () => {
      throw new Error('expected the query to fail');
    },
    (error: pg.DatabaseError) => error,
  );
}
