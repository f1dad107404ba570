import { readFileSync, writeFileSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { init } from '../../src/commands/init.js';
import { moveShard } from '../../src/commands/move-shard.js';
import { connectHost, connectedAddress } from '../../src/fleet/connect.js';
import { HostError } from '../../src/errors.js';
import { COMMIT_UNKNOWN } from '../../src/router/failover.js';
import { ShardRouter } from '../../src/router/router.js';
import { makeFleet, runCli } from '../helpers/fleet.js';
import { killedAfter } from '../helpers/faults.js';
import type { HostTopology } from '../../src/fleet/topology.js';
import { bareHost, useTestDatabases, withClient } from '../helpers/hosts.js';
import { waitFor } from '../helpers/migrations.js';
import { startReplicatedHost, type ReplicatedHost } from '../helpers/standby.js';

const PHOTOS_ONLY = {
  '0001_photos.sql': `CREATE SEQUENCE photos_id_seq;
CREATE TABLE photos (id bigint PRIMARY KEY DEFAULT next_id('photos_id_seq'), user_id bigint NOT NULL, image_url text NOT NULL);
ALTER SEQUENCE photos_id_seq OWNED BY photos.id;`,
};

interface WriterReport {
  acked: { shard: number; id: string }[];
  failures: { at: number; code: string; message: string }[];
  /** When each call succeeded. */
  successes: number[];
}

/** Writes through the router in a loop, one row per call, until stopped. */
function startWriter(router: ShardRouter): { stop: () => Promise<WriterReport> } {
  const report: WriterReport = { acked: [], failures: [], successes: [] };
  let running = true;
  const loop = (async () => {
    for (let key = 0n; running; key += 1n) {
      try {
        const row = await router.withKey(key, async (client, shard) => {
          const r = await client.query<{ id: string }>(
            `insert into photos (user_id, image_url) values ($1, 'x') returning id`,
            [key.toString()],
          );
          return { shard, id: r.rows[0]!.id };
        });
        report.acked.push(row);
        report.successes.push(Date.now());
      } catch (error) {
        report.failures.push({
          at: Date.now(),
          code: String((error as { code?: unknown }).code),
          message: (error as Error).message,
        });
        await new Promise((resolve) => setTimeout(resolve, 20));
      }
    }
  })();
  return {
    stop: async () => {
      running = false;
      await loop;
      return report;
    },
  };
}

async function missingRows(url: string, prefix: string, acked: WriterReport['acked']): Promise<number> {
  return withClient(url, async (c) => {
    let missing = 0;
    for (const shard of [...new Set(acked.map((a) => a.shard))]) {
      const ids = acked.filter((a) => a.shard === shard).map((a) => a.id);
      const r = await c.query<{ n: string }>(
        `select count(*) as n from "${prefix}${shard}".photos where id = any($1::bigint[])`,
        [ids],
      );
      missing += ids.length - Number(r.rows[0]!.n);
    }
    return missing;
  });
}

describe('a host with a streaming standby (PostgreSQL 15, pg_basebackup -R)', () => {
  let host: ReplicatedHost;

  beforeAll(async () => {
    // Synchronous replication: an acknowledged commit is on the standby, so none may go missing.
    host = await startReplicatedHost({ synchronous_standby_names: '*' });
    await withClient(host.primary.url, (c) => c.query('create database fleet'));
    await host.caughtUp();
  }, 120_000);

  afterAll(async () => {
    await host?.dispose();
  });

  it('connects the CLI to the address that is primary, whatever the order, and names every address when none is', async () => {
    const standbyFirst = `postgres://postgres:${host.password}@127.0.0.1:${host.standby.port},127.0.0.1:${host.primary.port}/fleet`;
    const client = await connectHost(bareHost('h1', standbyFirst));
    try {
      expect(connectedAddress(client)).toBe(`127.0.0.1:${host.primary.port}`);
      expect((await client.query('select pg_is_in_recovery() as r')).rows[0]).toEqual({ r: false });
    } finally {
      await client.end();
    }
    const standbyOnly = await connectHost(bareHost('h1', `${standbyFirst}?target_session_attrs=standby`));
    expect(connectedAddress(standbyOnly)).toBe(`127.0.0.1:${host.standby.port}`);
    await standbyOnly.end();
    const readWriteStandby = `postgres://postgres:${host.password}@127.0.0.1:${host.standby.port},127.0.0.1:1/fleet`;
    const error = await connectHost(bareHost('h1', readWriteStandby)).catch((e: unknown) => e as Error);
    expect((error as Error).message).toMatch(
      new RegExp(
        `host h1: cannot connect: no address is read-write: 127\\.0\\.0\\.1:${host.standby.port} is a standby \\(in recovery\\), not read-write; 127\\.0\\.0\\.1:1 cannot connect`,
      ),
    );
    expect((error as Error).message).not.toContain(host.password);
    // A router's call says the same once, with its shard (not the host's name twice).
    const config = await makeFleet({
      urls: [readWriteStandby],
      replicationUrls: [readWriteStandby],
      shards: 1,
      migrations: PHOTOS_ONLY,
    }).config();
    const router = ShardRouter.fromConfig(config, { connectTimeoutMs: 1000, failoverTimeoutMs: 500 });
    try {
      const routed = await router.withShard(0, (c) => c.query('select 1')).catch((e: unknown) => e as Error);
      expect(routed).toBeInstanceOf(HostError);
      expect((routed as Error).message).toMatch(
        new RegExp(
          `^host pg1, shard 0: cannot connect: no address is read-write: 127\\.0\\.0\\.1:${host.standby.port} is a standby`,
        ),
      );
      expect((routed as Error).message).not.toContain(host.password);
    } finally {
      await router.close();
    }
  });

  it('routers (from a file with a multi-host URL, and from one seed) write on through a failover with no reload()', async () => {
    const url = host.multiHostUrl('fleet');
    const fleet = makeFleet({
      urls: [url],
      replicationUrls: [url],
      shards: 4,
      schemaPrefix: 'fo',
      migrations: PHOTOS_ONLY,
    });
    expect((await init(await fleet.config())).ok).toBe(true);
    await host.caughtUp();
    const fromFile = await ShardRouter.open(fleet.configFile, { poolSize: 2, connectTimeoutMs: 2000 });
    const fromSeed = await ShardRouter.open({ seeds: [url] }, { poolSize: 2, connectTimeoutMs: 2000 });
    // A third that checks the map in the background every 100 ms throughout (its checks run on pools
    // whose primary goes away): it writes on as the others do.
    const refreshing = await ShardRouter.open(fleet.configFile, {
      poolSize: 2,
      connectTimeoutMs: 2000,
      mapRefreshMs: 100,
    });
    const routers = [fromFile, fromSeed, refreshing];
    const writers = routers.map((r) => startWriter(r));
    try {
      await new Promise((resolve) => setTimeout(resolve, 1000));
      // The primary fails, then the standby is promoted (as a failover manager does).
      host.stopPrimary('immediate');
      const promotedAt = Date.now();
      host.promote();
      await new Promise((resolve) => setTimeout(resolve, 3000));
      const reports = await Promise.all(writers.map((w) => w.stop()));
      for (const [i, report] of reports.entries()) {
        const firstAfter = report.successes.find((t) => t >= promotedAt);
        const missing = await missingRows(host.standby.url.replace(/\/postgres$/, '/fleet'), 'fo', report.acked);
        console.log(
          `${['file', 'seed', 'refreshing'][i]} router: ${report.acked.length} acknowledged, ${report.failures.length} failed (${[...new Set(report.failures.map((f) => f.code))].join(', ') || 'none'}), first write ${firstAfter === undefined ? 'never' : `${firstAfter - promotedAt} ms`} after promote began, ${missing} acknowledged rows missing`,
        );
        expect(firstAfter).toBeDefined();
        expect(firstAfter! - promotedAt).toBeLessThan(5000);
        expect(report.successes.filter((t) => t > promotedAt).length).toBeGreaterThan(10);
        // A call caught by the failover either ran again on the new primary or says it may have committed.
        for (const failure of report.failures) expect(failure.code).toBe(COMMIT_UNKNOWN);
        expect(missing).toBe(0);
      }
      // Its map still places every shard on the host, its calls on the new primary.
      for (let shard = 0; shard < 4; shard++) expect(refreshing.hostForShard(shard).name).toBe('pg1');
      const primary = await refreshing.withShard(0, (c) => c.query<{ r: boolean }>('select pg_is_in_recovery() as r'));
      expect(primary.rows).toEqual([{ r: false }]);
    } finally {
      await Promise.all(writers.map((w) => w.stop()));
      await Promise.all(routers.map((r) => r.close()));
    }
  }, 60_000);
});

describe('a move from a host whose url lists its standby first', () => {
  const db = useTestDatabases(1);
  let host: ReplicatedHost;

  beforeAll(async () => {
    host = await startReplicatedHost();
    await withClient(host.primary.url, (c) => c.query('create database mv'));
    await host.caughtUp();
  }, 120_000);

  afterAll(async () => {
    await host?.dispose();
  });

  it('copies from the primary (its replication connection goes to the address the session went to)', async () => {
    const url = `postgres://postgres:${host.password}@127.0.0.1:${host.standby.port},127.0.0.1:${host.primary.port}/mv`;
    const fleet = makeFleet({
      urls: [url, db.urls[0]!],
      // Written as the url: without target_session_attrs, the subscription's libpq would take the standby.
      replicationUrls: [url, undefined],
      shards: 2,
      split: ['0-1', ''],
      schemaPrefix: 'mv',
      migrations: PHOTOS_ONLY,
    });
    expect((await init(await fleet.config())).ok).toBe(true);
    await withClient(host.primary.url.replace(/\/postgres$/, '/mv'), (c) =>
      c.query(`insert into mv0.photos (user_id, image_url) select g, 'x' from generate_series(1, 500) g`),
    );
    const result = await moveShard(await fleet.config(), 0, 'pg2', { configFile: fleet.configFile });
    expect(result.outcome).toBe('moved');
    const moved = await withClient(
      db.urls[0]!,
      async (c) => (await c.query<{ n: string }>('select count(*) as n from mv0.photos')).rows[0]!.n,
    );
    expect(moved).toBe('500');
  }, 60_000);
});

describe('ShardRouter: a call whose connection is lost', () => {
  const db = useTestDatabases(1);

  async function openFleet(prefix: string): Promise<ShardRouter> {
    const fleet = makeFleet({ urls: db.urls, shards: 2, schemaPrefix: prefix, migrations: PHOTOS_ONLY });
    expect((await init(await fleet.config())).ok).toBe(true);
    return ShardRouter.open(fleet.configFile, { failoverTimeoutMs: 3000 });
  }

  it('before COMMIT is run again (nothing committed), and once COMMIT was sent fails with COMMIT_UNKNOWN, not retried', async () => {
    const router = await openFleet('cl');
    try {
      // The server ends the session (57P01) in the middle of the first attempt only.
      let runs = 0;
      const id = await router.withShard(0, async (client) => {
        runs += 1;
        await client.query(`insert into photos (user_id, image_url) values ($1, 'x')`, [runs]);
        if (runs === 1) await client.query('select pg_terminate_backend(pg_backend_pid())');
        return (await client.query<{ n: string }>('select count(*) as n from photos')).rows[0]!.n;
      });
      expect(runs).toBe(2);
      expect(id).toBe('1');
      // A deferred constraint trigger ends the session while COMMIT runs: the outcome is unknown to the router.
      await withClient(db.urls[0]!, (c) =>
        c.query(`create function cl1.die() returns trigger language plpgsql as $$ begin perform pg_terminate_backend(pg_backend_pid()); return null; end $$;
          create constraint trigger die after insert on cl1.photos deferrable initially deferred for each row execute function cl1.die();`),
      );
      let commits = 0;
      const error = await router
        .withShard(1, async (client) => {
          commits += 1;
          await client.query(`insert into photos (user_id, image_url) values (1, 'x')`);
          await client.query('select 1');
        })
        .catch((e: unknown) => e);
      expect(commits).toBe(1);
      expect((error as { code?: string }).code).toBe(COMMIT_UNKNOWN);
      expect((error as Error).message).toMatch(
        /host pg1, shard 1: the connection was lost after COMMIT was sent; whether it committed is not known/,
      );
      // A one-statement call goes without a block here (a connection straight to the server): the
      // Sync commits it, and the message says what was sent.
      const alone = await router
        .withShard(1, (client) => client.query(`insert into photos (user_id, image_url) values ($1, 'x')`, [2]))
        .catch((e: unknown) => e);
      expect((alone as { code?: string }).code).toBe(COMMIT_UNKNOWN);
      expect((alone as Error).message).toMatch(
        /host pg1, shard 1: the connection was lost after the statement \(which commits on its own, without a block\) was sent; whether it committed is not known/,
      );
    } finally {
      await router.close();
    }
  });
});

describe('operators through a failover: status, map show, map set-address', () => {
  const db = useTestDatabases(1);
  let host: ReplicatedHost;

  beforeAll(async () => {
    host = await startReplicatedHost();
    await withClient(host.primary.url, (c) =>
      c.query('create database fleet').then(() => c.query('create database other')),
    );
    await host.caughtUp();
  }, 120_000);

  afterAll(async () => {
    await host?.dispose();
  });

  it('shows the primary and its standbys, and after a failover records the new primary during an unfinished move, refusing a standby or another fleet', async () => {
    const at = (port: number, database: string) => `postgres://postgres:${host.password}@127.0.0.1:${port}/${database}`;
    const oldPrimary = at(host.primary.port, 'fleet');
    const standby = at(host.standby.port, 'fleet');
    const fleet = makeFleet({
      urls: [db.urls[0]!, oldPrimary],
      replicationUrls: [undefined, oldPrimary],
      shards: 4,
      schemaPrefix: 'op',
      migrations: PHOTOS_ONLY,
    });
    expect((await init(await fleet.config())).ok).toBe(true);
    const other = makeFleet({
      urls: [at(host.primary.port, 'other')],
      shards: 1,
      schemaPrefix: 'ot',
      migrations: PHOTOS_ONLY,
    });
    expect((await init(await other.config())).ok).toBe(true);
    await host.caughtUp();
    // A logical walsender on the primary (another database's subscription, as a move's is) is no standby.
    await withClient(at(host.primary.port, 'other'), (c) => c.query('CREATE PUBLICATION topo_p'));
    await withClient(db.urls[0]!, (c) =>
      c.query(
        `CREATE SUBSCRIPTION topo_s CONNECTION 'host=127.0.0.1 port=${host.primary.port} user=postgres password=${host.password} dbname=other' PUBLICATION topo_p`,
      ),
    );
    await waitFor('the subscription streaming from the primary', async () =>
      withClient(oldPrimary, async (c) => {
        const r = await c.query(
          `SELECT 1 FROM pg_stat_replication r JOIN pg_replication_slots s ON s.active_pid = r.pid WHERE s.slot_name = 'topo_s'`,
        );
        return (r.rowCount ?? 0) > 0;
      }),
    );

    const before = JSON.parse((await runCli(['status', '--json', '-c', fleet.configFile])).stdout) as {
      hosts: { host: string; topology: HostTopology | null }[];
    };
    const pg2 = before.hosts.find((h) => h.host === 'pg2')!;
    expect(pg2.topology?.primary).toBe(`127.0.0.1:${host.primary.port}`);
    expect(pg2.topology?.inRecovery).toBe(false);
    expect(pg2.topology?.standbys).toHaveLength(1);
    expect(pg2.topology?.standbys[0]).toMatchObject({ state: 'streaming', sync: 'async' });
    await withClient(db.urls[0]!, (c) => c.query('DROP SUBSCRIPTION topo_s'));
    const shown = await runCli(['map', 'show', '-c', fleet.configFile]);
    expect(shown.stdout).toMatch(
      new RegExp(
        `pg2: .*\\n  primary at 127\\.0\\.0\\.1:${host.primary.port}; standbys: walreceiver at 127\\.0\\.0\\.1:\\d+ \\(streaming, async, lag`,
      ),
    );

    // Refused before the failover: the standby is not a primary; a server of another fleet is not pg2.
    const notPrimary = await runCli(['map', 'set-address', 'pg2', standby, '-c', fleet.configFile]);
    expect(notPrimary.code).toBe(2);
    expect(notPrimary.stderr).toContain('is a standby (in recovery), not read-write; nothing was changed');
    expect(notPrimary.stderr).not.toContain(host.password);
    const otherFleet = await runCli([
      'map',
      'set-address',
      'pg2',
      at(host.primary.port, 'other'),
      '-c',
      fleet.configFile,
    ]);
    expect(otherFleet.code).toBe(2);
    expect(otherFleet.stderr).toMatch(
      /the server there belongs to fleet [0-9a-f-]+, not [0-9a-f-]+ \(this file's hosts'\); nothing was changed/,
    );
    const wrongHost = await runCli(['map', 'set-address', 'pg2', db.urls[0]!, '-c', fleet.configFile]);
    expect(wrongHost.code).toBe(2);
    expect(wrongHost.stderr).toContain('the server there records itself as host pg1, not pg2');
    // Checked as read-write (the primary answers), but recorded as given: a router from seeds would
    // connect as it asks, to the standby listed first. Refused.
    for (const attrs of ['any', 'standby', 'prefer-standby', 'read-only']) {
      const asksStandby = await runCli([
        'map',
        'set-address',
        'pg2',
        `postgres://postgres:${host.password}@127.0.0.1:${host.standby.port},127.0.0.1:${host.primary.port}/fleet?target_session_attrs=${attrs}`,
        '-c',
        fleet.configFile,
      ]);
      expect(asksStandby.code).toBe(2);
      expect(asksStandby.stderr).toContain(`asks for target_session_attrs=${attrs}`);
      expect(asksStandby.stderr).not.toContain(host.password);
    }
    const registry = () =>
      withClient(
        db.urls[0]!,
        async (c) =>
          (await c.query<{ address: string }>(`select address from shardctl.hosts where name = 'pg2'`)).rows[0]!
            .address,
      );
    expect(await registry()).toBe(`postgres://127.0.0.1:${host.primary.port}/fleet`);

    // An unfinished move onto pg2, then pg2 fails over.
    await killedAfter(fleet, 0, 'synced');
    await host.caughtUp();
    host.stopPrimary('immediate');
    host.promote();

    const down = await runCli(['status', '-c', fleet.configFile]);
    expect(down.code).toBe(1);
    expect(down.stdout).toMatch(/pg2: UNREACHABLE/);
    const set = await runCli(['map', 'set-address', 'pg2', standby, '-c', fleet.configFile]);
    expect(set.code, set.stderr).toBe(0);
    expect(set.stdout).toContain(
      `pg2: primary at 127.0.0.1:${host.standby.port}; registry address postgres://127.0.0.1:${host.primary.port}/fleet → postgres://127.0.0.1:${host.standby.port}/fleet`,
    );
    expect(set.stdout).toContain('updated the registry of pg2, pg1');
    expect(await registry()).toBe(`postgres://127.0.0.1:${host.standby.port}/fleet`);
    const after = await runCli(['map', 'show', '-c', fleet.configFile]);
    expect(after.stdout).toContain(
      `the registry says postgres://127.0.0.1:${host.standby.port}/fleet, the file postgres://127.0.0.1:${host.primary.port}/fleet (after a failover: shardctl map set-address pg2)`,
    );

    // A router from the file written before the failover reaches pg2's new primary through the registry.
    const router = await ShardRouter.open(fleet.configFile, { connectTimeoutMs: 2000 });
    try {
      const shard = await router.withShard(3, async (client, s) => {
        await client.query(`insert into photos (user_id, image_url) values (3, 'x')`);
        return s;
      });
      expect(shard).toBe(3);
    } finally {
      await router.close();
    }

    // The operator points the file at the new primary and undoes the move.
    writeFileSync(fleet.configFile, readFileSync(fleet.configFile, 'utf8').replaceAll(oldPrimary, standby));
    const abort = await runCli(['move-shard', '0', '--abort', '--yes', '-c', fleet.configFile]);
    expect(abort.code, abort.stderr).toBe(0);
  }, 120_000);
});

describe('ShardRouter: a call that loses its connection every time', () => {
  const db = useTestDatabases(1);

  it("gives up after failoverTimeoutMs when every run loses its connection, with the server's error", async () => {
    const fleet = makeFleet({ urls: db.urls, shards: 1, schemaPrefix: 'gu', migrations: PHOTOS_ONLY });
    expect((await init(await fleet.config())).ok).toBe(true);
    const router = await ShardRouter.open(fleet.configFile, { failoverTimeoutMs: 3000 });
    try {
      let runs = 0;
      const started = Date.now();
      const error = await router
        .withShard(0, async (client) => {
          runs += 1;
          await client.query('select pg_terminate_backend(pg_backend_pid())');
        })
        .catch((e: unknown) => e);
      expect((error as { code?: string }).code).toBe('57P01');
      // Said with the host and the shard (the driver's error alone names neither), the server's as its cause.
      expect(error).toBeInstanceOf(HostError);
      expect(error).toMatchObject({ host: 'pg1', shard: 0 });
      expect((error as Error).message).toMatch(
        /^host pg1, shard 0: .*terminating connection due to administrator command/,
      );
      expect(((error as Error).cause as { code?: string }).code).toBe('57P01');
      expect(runs).toBeGreaterThan(1);
      expect(Date.now() - started).toBeLessThan(3000 + 2000);
    } finally {
      await router.close();
    }
  });
});

describe('a switchover: the old primary restarted as a standby of the new one (PostgreSQL 15)', () => {
  let host: ReplicatedHost;

  beforeAll(async () => {
    host = await startReplicatedHost();
    await withClient(host.primary.url, (c) => c.query('create database so'));
    await host.caughtUp();
  }, 120_000);

  afterAll(async () => {
    await host?.dispose();
  });

  it('a write refused as read-only (25006) by the old primary, where the pool connected again, runs again on the new primary, not failed', async () => {
    const url = host.multiHostUrl('so');
    const fleet = makeFleet({
      urls: [url],
      replicationUrls: [url],
      shards: 2,
      schemaPrefix: 'so',
      migrations: PHOTOS_ONLY,
    });
    expect((await init(await fleet.config())).ok).toBe(true);
    const router = await ShardRouter.open(fleet.configFile, { poolSize: 1, connectTimeoutMs: 2000 });
    // Each run of fn: where it ran (standby or primary), then the insert's SQLSTATE or 'ok'.
    const runs: string[] = [];
    const insert = (key: bigint) =>
      router.withKey(key, async (client) => {
        const where = await client.query<{ r: boolean }>('select pg_is_in_recovery() as r');
        runs.push(where.rows[0]!.r ? 'standby' : 'primary');
        try {
          const r = await client.query<{ id: string }>(
            `insert into photos (user_id, image_url) values ($1, 'x') returning id`,
            [key.toString()],
          );
          runs.push('ok');
          return r.rows[0]!.id;
        } catch (error) {
          runs.push(String((error as { code?: unknown }).code));
          throw error;
        }
      });
    try {
      const before = await insert(1n);
      await host.caughtUp();
      // The switchover: the old primary shut down cleanly (its pooled sessions ended with it), the
      // standby promoted, the old primary started again as its standby: the pool's next connection
      // goes to the old primary's address as before and is accepted there, read-only.
      host.stopPrimary('fast');
      host.promote();
      await host.rejoinAsStandby();
      const oldPrimary = host.primary.url.replace(/\/postgres$/, '/so');
      expect(
        await withClient(
          oldPrimary,
          async (c) => (await c.query<{ r: boolean }>('select pg_is_in_recovery() as r')).rows[0]!.r,
        ),
      ).toBe(true);
      runs.length = 0;
      const after = await insert(2n);
      // The connection the pool opened again at the old primary's address is refused there (a
      // standby now), so fn runs once, on the new primary.
      expect(runs).toEqual(['primary', 'ok']);
      // Both rows on the new primary, once each; the next call goes there at once.
      const newPrimary = host.standby.url.replace(/\/postgres$/, '/so');
      const ids = await withClient(newPrimary, async (c) =>
        (
          await c.query<{ id: string }>(`select id::text from so0.photos union all select id::text from so1.photos`)
        ).rows.map((r) => r.id),
      );
      expect(ids.sort()).toEqual([before, after].sort());
      runs.length = 0;
      await insert(3n);
      expect(runs).toEqual(['primary', 'ok']);
    } finally {
      await router.close();
    }
  }, 120_000);
});

describe('map set-address while the old primary still takes writes', () => {
  const db = useTestDatabases(1);
  let host: ReplicatedHost;

  beforeAll(async () => {
    host = await startReplicatedHost();
    await withClient(host.primary.url, (c) => c.query('create database fleet'));
    await host.caughtUp();
  }, 120_000);

  afterAll(async () => {
    await host?.dispose();
  });

  it("refuses a URL of several addresses one of which answers as another host, or refuses the host's credentials: a router that found it first would run the host's calls there", async () => {
    // One database name and one role on two servers: pg1 on the test host's server, pg2 on the
    // replicated host's primary.
    const name = `sa_${process.pid}`;
    const role = `sa_op_${process.pid}`;
    const secret = `Sa-${process.pid}-pw`;
    const on = (url: string, database: string, user?: string) => {
      const u = new URL(url);
      u.pathname = `/${database}`;
      if (user) [u.username, u.password] = [user, secret];
      return u.toString();
    };
    for (const admin of [on(db.urls[0]!, 'postgres'), host.primary.url])
      await withClient(admin, async (c) => {
        await c.query(`create database ${name}`);
        await c.query(`create role ${role} login superuser password '${secret}'`);
      });
    const pg1 = on(db.urls[0]!, name, role);
    const pg2 = on(`postgres://x@127.0.0.1:${host.primary.port}/`, name, role);
    const fleet = makeFleet({
      urls: [pg1, pg2],
      replicationUrls: [undefined, pg2],
      shards: 2,
      schemaPrefix: 'sa',
      migrations: PHOTOS_ONLY,
    });
    expect((await init(await fleet.config())).ok).toBe(true);
    const pg1Address = new URL(pg1).host;
    const pattern = (why: string) =>
      new RegExp(`its address ${pg1Address.replaceAll('.', '\\.')} answers.*${why}.*; nothing was changed`);
    // The other address is pg1's server: refused.
    const both = `postgres://${role}:${secret}@127.0.0.1:${host.primary.port},${pg1Address}/${name}`;
    const asOther = await runCli(['map', 'set-address', 'pg2', both, '-c', fleet.configFile]);
    expect(asOther.code, asOther.stdout + asOther.stderr).toBe(2);
    expect(asOther.stderr).toMatch(pattern('as host pg1 of fleet [0-9a-f-]+, not pg2'));
    // A server there that refuses pg2's credentials is not pg2's either.
    const wrongUser = both.replace(`${role}:${secret}`, `postgres:${host.password}`);
    const refused = await runCli(['map', 'set-address', 'pg2', wrongUser, '-c', fleet.configFile]);
    expect(refused.code, refused.stdout + refused.stderr).toBe(2);
    expect(refused.stderr).toMatch(pattern("but not as pg2's server \\(.*28P01"));
    for (const run of [asOther, refused])
      expect(run.stdout + run.stderr).not.toMatch(new RegExp(`${secret}|${host.password}`));
  });

  it('records the new primary and says, exit 1, that the old address is a second writable primary of the host; once it is stopped, exit 0', async () => {
    const at = (port: number) => `postgres://postgres:${host.password}@127.0.0.1:${port}/fleet`;
    const fleet = makeFleet({
      urls: [db.urls[0]!, at(host.primary.port)],
      replicationUrls: [undefined, at(host.primary.port)],
      shards: 4,
      schemaPrefix: 'sb',
      migrations: PHOTOS_ONLY,
    });
    expect((await init(await fleet.config())).ok).toBe(true);
    await host.caughtUp();
    // The standby is promoted, and the old primary is left running (no fencing of it).
    host.promote();

    const set = await runCli(['map', 'set-address', 'pg2', at(host.standby.port), '--json', '-c', fleet.configFile]);
    expect(set.code, set.stderr).toBe(1);
    const result = JSON.parse(set.stdout) as { stillWritable: string[]; updated: string[]; address: string };
    expect(result).toMatchObject({
      address: `postgres://127.0.0.1:${host.standby.port}/fleet`,
      stillWritable: [`127.0.0.1:${host.primary.port}`],
    });
    expect(result.updated).toContain('pg1');
    const text = await runCli(['map', 'set-address', 'pg2', at(host.standby.port), '-c', fleet.configFile]);
    expect(text.code).toBe(1);
    expect(text.stdout).toContain(
      `pg2: TWO PRIMARIES: the old address 127.0.0.1:${host.primary.port} still answers as a writable primary of pg2`,
    );
    expect(text.stdout + text.stderr).not.toContain(host.password);

    host.stopPrimary('fast');
    const again = await runCli(['map', 'set-address', 'pg2', at(host.standby.port), '--json', '-c', fleet.configFile]);
    expect(again.code, again.stderr).toBe(0);
    expect(JSON.parse(again.stdout)).toMatchObject({ stillWritable: [] });
  }, 120_000);
});

describe('reads after a switchover: the old primary, now a standby, stopped replaying (PostgreSQL 15)', () => {
  let host: ReplicatedHost;

  beforeAll(async () => {
    host = await startReplicatedHost();
    await withClient(host.primary.url, (c) => c.query('create database sr'));
    await host.caughtUp();
  }, 120_000);

  afterAll(async () => {
    await host?.dispose();
  });

  it('a readOnly call, and a replica read the stale standby refuses, run on the new primary, never on the old one', async () => {
    const url = host.multiHostUrl('sr');
    const fleet = makeFleet({
      urls: [url],
      replicationUrls: [url],
      shards: 2,
      schemaPrefix: 'sr',
      migrations: PHOTOS_ONLY,
    });
    expect((await init(await fleet.config())).ok).toBe(true);
    const router = await ShardRouter.open(fleet.configFile, { poolSize: 2, connectTimeoutMs: 2000 });
    const shard = router.shardForKey(1n);
    const read = (options: { replica?: boolean; maxLagMs?: number }) =>
      router.withKey(
        1n,
        async (client) =>
          (
            await client.query<{ port: number; rows: number }>(
              'select inet_server_port() as port, (select count(*) from photos)::int as rows',
            )
          ).rows[0]!,
        { readOnly: true, ...options },
      );
    try {
      await router.withKey(1n, (client) => client.query(`insert into photos (user_id, image_url) values (1, 'a')`));
      await host.caughtUp();
      // The switchover while the router is idle: the pool's connections end with the old primary.
      host.stopPrimary('fast');
      host.promote();
      await host.rejoinAsStandby();
      const oldPrimary = host.primary.url.replace(/\/postgres$/, '/sr');
      const newPrimary = host.standby.url.replace(/\/postgres$/, '/sr');
      // The old primary, a standby now, stops replaying; a write reaches the new primary.
      await withClient(oldPrimary, (c) => c.query('select pg_wal_replay_pause()'));
      const written = await withClient(newPrimary, async (c) => {
        await c.query(`insert into sr${shard}.photos (user_id, image_url) values (1, 'b')`);
        return (await c.query<{ lsn: string }>('select pg_current_wal_lsn()::text as lsn')).rows[0]!.lsn;
      });
      // Until the paused standby has received that write, it cannot know it is behind (received =
      // replayed is not lag); the read below is about one that has received and not replayed it.
      await waitFor('the paused standby to receive the write', () =>
        withClient(
          oldPrimary,
          async (c) =>
            (await c.query<{ ok: boolean }>('select pg_last_wal_receive_lsn() >= $1::pg_lsn as ok', [written])).rows[0]!
              .ok,
        ),
      );
      expect(await read({})).toEqual({ port: host.standby.port, rows: 2 });
      // Refused by the paused standby (lagging), the read goes to the primary: the new one.
      expect(await read({ replica: true, maxLagMs: 0 })).toEqual({ port: host.standby.port, rows: 2 });
    } finally {
      await router.close();
    }
  }, 120_000);
});
