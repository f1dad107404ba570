/**
 * A host that stops answering without closing anything (a hung server, a black-holed route), played
 * by a TCP proxy in front of pg2 that swallows every byte from a chosen moment. With hostTimeout 2s
 * every command ends within a few seconds naming pg2, and pg1's work is done. Each test has a
 * timeout of its own, so a hang fails the test instead of stalling the suite.
 */
import { type ChildProcessByStdio, spawn } from 'node:child_process';
import type { Readable } from 'node:stream';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { init } from '../../src/commands/init.js';
import { ShardFanOutError, ShardRouter } from '../../src/index.js';
import { type Fleet, makeFleet, runCli } from '../helpers/fleet.js';
import { withClient, useTestDatabases } from '../helpers/hosts.js';
import { shardsAt, waitFor } from '../helpers/migrations.js';
import { removeCliSnapshot, spawnCli } from '../helpers/moves.js';
import { startTcpProxy, timed, type TcpProxy, useProxiedFleet } from '../helpers/tcp-proxy.js';

const BOUND_MS = 2000;
/** Silence noticed after one bound, the probe gives up after another, plus slack for a loaded machine. */
const WITHIN_MS = 3 * BOUND_MS + 4000;

describe('a host that stops answering', () => {
  const { db, proxy: proxyOf, fleet: fleetOf } = useProxiedFleet();
  let proxy: TcpProxy;
  let fleet: Fleet;
  beforeAll(() => {
    proxy = proxyOf();
    fleet = fleetOf();
  });

  it(
    'status: a host silent after the handshake is reported by name within the bound, the other host is read',
    { timeout: 30_000 },
    async () => {
      proxy.silence('after-handshake');
      const { value: run, ms } = await timed(() => runCli(['status', '--json', '-c', fleet.configFile]));
      expect(ms).toBeLessThan(WITHIN_MS);
      expect(run.code).not.toBe(0);
      const result = JSON.parse(run.stdout) as { hosts: { host: string; ok: boolean; error?: string }[] };
      expect(result.hosts.find((h) => h.host === 'pg1')).toMatchObject({ ok: true });
      const pg2 = result.hosts.find((h) => h.host === 'pg2');
      expect(pg2?.ok).toBe(false);
      expect(JSON.stringify(pg2)).toMatch(
        /stopped answering: no reply for 2 s and a new connection could not run SELECT 1 within 2 s \(SELECT 1 got no answer\)/,
      );
    },
  );

  it(
    'status: a host silent from the first byte (no handshake) fails to connect within the bound',
    { timeout: 30_000 },
    async () => {
      proxy.silence('all');
      const { value: run, ms } = await timed(() => runCli(['status', '-c', fleet.configFile]));
      expect(ms).toBeLessThan(BOUND_MS + 3000);
      expect(run.code).not.toBe(0);
      expect(run.stdout + run.stderr).toMatch(/pg2.*cannot connect: .*timeout/);
    },
  );

  it(
    'decode: a silent host is named and its shards are placed as the file says, without a long wait',
    { timeout: 30_000 },
    async () => {
      proxy.silence('all');
      // Shard 5 (pg2's), 1 s after the epoch, sequence 3.
      const id = ((1000n << 23n) | (5n << 10n) | 3n).toString();
      const { value: run, ms } = await timed(() => runCli(['decode', id, '-c', fleet.configFile]));
      expect(ms).toBeLessThan(BOUND_MS + 3000);
      expect(run.code, run.stderr).toBe(0);
      expect(run.stdout).toMatch(new RegExp(`^${id} .* shard 5 +sequence 3 +host pg2$`, 'm'));
      expect(run.stderr).toMatch(
        /decode: pg2 could not be read \(cannot connect: .*timeout.*\); its shards' hosts are as the file/,
      );
    },
  );

  it(
    "status --sizes and --load: a silent host is named and the exit is 1; the other host's figures are shown, its sum labelled as not the fleet's",
    { timeout: 60_000 },
    async () => {
      proxy.silence('all');
      for (const flag of ['--sizes', '--load']) {
        const { value: run, ms } = await timed(() => runCli(['status', flag, '-c', fleet.configFile]));
        expect(ms).toBeLessThan(BOUND_MS + 3000);
        expect(run.code, run.stderr).toBe(1);
        expect(run.stdout).toMatch(/^pg1 +4 /m);
        expect(run.stdout).toMatch(/^readable +4 /m);
        expect(run.stdout).not.toMatch(/^total/m);
        expect(run.stdout).toMatch(/^pg2: UNREACHABLE: cannot connect: .*timeout/m);
        expect(run.stderr).toMatch(/status: 1 host could not be read/);
        const json = await runCli(['status', flag, '--json', '-c', fleet.configFile]);
        expect(json.code).toBe(1);
        const data = JSON.parse(json.stdout) as {
          hosts: { host: string }[];
          shards: { shard: number }[];
          unreadable: { host: string; reason: string }[];
          exitCode: number;
        };
        expect(data.hosts.map((h) => h.host)).toEqual(['pg1']);
        expect(data.shards.map((s) => s.shard).sort()).toEqual([0, 1, 2, 3]);
        expect(data.unreadable).toEqual([{ host: 'pg2', reason: expect.stringMatching(/cannot connect/) as string }]);
        expect(data.exitCode).toBe(1);
      }
      // Rebalancing by size must not plan from part of the fleet: it refuses, naming the host.
      const rebalance = await runCli(['rebalance', '--by', 'size', '--dry-run', '-c', fleet.configFile]);
      expect(rebalance.code).toBe(1);
      expect(rebalance.stderr).toMatch(/pg2.*cannot connect/);
    },
  );

  it(
    'migrate: a host that goes silent mid-run is reported by name; the other host is migrated; a rerun finishes',
    { timeout: 60_000 },
    async () => {
      fleet.writeMigration(
        '0004_views.sql',
        'ALTER TABLE photos ADD COLUMN views bigint NOT NULL DEFAULT 0;\nSELECT pg_sleep(0.3);\n',
      );
      const started = performance.now();
      const running = runCli(['migrate', '-c', fleet.configFile]);
      await waitFor('pg2 to be part-way', async () => (await shardsAt(db.urls[1]!, 4)) >= 1, 20_000);
      proxy.silence('after-handshake');
      const silencedAt = performance.now();
      const run = await running;
      expect(performance.now() - silencedAt).toBeLessThan(WITHIN_MS + 1000);
      expect(run.code).toBe(1);
      expect(run.stderr).toMatch(/^pg1: 4 migrations applied/m);
      expect(run.stderr).toMatch(/^pg2: FAILED: (.* )?stopped answering: no reply for 2 s/m);
      expect(run.stderr).not.toMatch(/host pg2: stopped/);
      expect(await shardsAt(db.urls[0]!, 4)).toBe(4);
      expect(performance.now() - started).toBeLessThan(30_000);

      proxy.resume();
      const rerun = await runCli(['migrate', '-c', fleet.configFile]);
      expect(rerun.code, rerun.stderr).toBe(0);
      expect(await shardsAt(db.urls[1]!, 4)).toBe(4);
    },
  );

  it('move-shard --dry-run from a silent host fails within the bound naming it', { timeout: 30_000 }, async () => {
    proxy.silence('after-handshake');
    const { value: run, ms } = await timed(() =>
      runCli(['move-shard', '5', '--to', 'pg1', '--dry-run', '-c', fleet.configFile]),
    );
    expect(ms).toBeLessThan(WITHIN_MS);
    expect(run.code).toBe(1);
    expect(run.stderr).toMatch(/host pg2.*stopped answering/);
  });

  it(
    "exec: a host silent from the first byte costs one bound in all (opening the router reads the fleet; the run does not try pg2 again); its shards fail in one line; the other host's shards answer",
    { timeout: 60_000 },
    async () => {
      proxy.silence('all');
      // --write: one shard per transaction; --concurrency 1: pg2's four shards one after another,
      // each of which used to wait out the connect bound of its own (4 × 2 s and more); the run
      // itself then waited out a bound again after the router's reading of the fleet had.
      for (const args of [['--write', '--concurrency', '1'], ['--concurrency', '1'], []]) {
        const { value: run, ms } = await timed(() =>
          runCli(['exec', ...args, 'SELECT 1 AS one', '-c', fleet.configFile]),
        );
        expect(run.code, run.stderr).toBe(1);
        expect(ms, args.join(' ')).toBeLessThan(BOUND_MS + 1500);
        expect(run.stdout).toMatch(/\(4 rows\)/);
        expect(run.stderr).toMatch(/4 of 8 shards failed: shards 4-7/);
        const lines = run.stderr.split('\n').filter((line) => /^ {2}shards? \d/.test(line));
        // One line: the shards, the host once, the reason (no "host pg2, shard 5:" inside).
        expect(lines, run.stderr).toHaveLength(1);
        expect(lines[0]).toMatch(
          /^ {2}shards 4-7 on pg2: cannot connect: .*timeout.* \(not tried: the host could not be reached when the fleet was read just before\)$/,
        );
        expect(run.stderr).not.toMatch(/host pg2, shard \d/);
      }
    },
  );

  it(
    'router: a fan-out tries a host again once the reading of the fleet that found it down is older than the connect timeout; the first shard probed is on a live host',
    { timeout: 60_000 },
    async () => {
      proxy.silence('all');
      const connectTimeoutMs = 1500;
      const router = await ShardRouter.open(fleet.configFile, { connectTimeoutMs });
      try {
        expect(router.unreachableHosts().map((u) => u.name)).toEqual(['pg2']);
        // Just after the reading: pg2's shards fail at once, pg1's answer (shard 4, the first of
        // the run, is pg2's: the chunked run's probe goes to pg1's shard 0 instead).
        const quick = await timed(() =>
          router.queryEachShard('SELECT 1 AS one', { shards: [4, 5, 0, 1] }).catch((error: unknown) => error),
        );
        expect(quick.ms).toBeLessThan(connectTimeoutMs - 500);
        expect(quick.value).toMatchObject({
          failures: [{ shard: 4 }, { shard: 5 }],
          results: [{ shard: 0 }, { shard: 1 }],
        });
        // Later, pg2 is tried again (and answers, now that it does).
        await new Promise((resolve) => setTimeout(resolve, connectTimeoutMs + 100));
        proxy.resume();
        const later = await router.queryEachShard('SELECT 1 AS one', { shards: [4, 5, 0, 1] });
        expect(later.map((r) => r.shard)).toEqual([0, 1, 4, 5]);
      } finally {
        await router.close();
      }
    },
  );

  it(
    'router: a host that refused at once when the fleet was read (a server restarting) is tried again by the next fan-out, which it answers',
    { timeout: 60_000 },
    async () => {
      proxy.refuse();
      const connectTimeoutMs = 5000;
      const router = await ShardRouter.open(fleet.configFile, { connectTimeoutMs });
      try {
        expect(router.unreachableHosts().map((u) => u.name)).toEqual(['pg2']);
        // Back a moment later, well inside the connect timeout of the reading.
        proxy.resume();
        const rows = await router.queryEachShard('SELECT 1 AS one', { shards: [4, 5, 0, 1] });
        expect(rows.map((r) => r.shard)).toEqual([0, 1, 4, 5]);
      } finally {
        await router.close();
      }
    },
  );

  it(
    'router: a host that goes silent after the reading of the fleet fails its next chunk once; the shards after it say when (in this run, not at the reading)',
    { timeout: 60_000 },
    async () => {
      const router = await ShardRouter.open(fleet.configFile);
      try {
        expect(router.unreachableHosts()).toEqual([]);
        proxy.silence('all');
        // One connection, two shards per round trip: pg2's shards 4-7 in two chunks, one after the other.
        const { value: error, ms } = await timed(() =>
          router
            .queryEachShard('SELECT $1::int AS one', {
              params: [1],
              shards: [4, 5, 6, 7],
              readOnly: true,
              shardsPerQuery: 2,
              perHost: 1,
            })
            .catch((e: unknown) => e as ShardFanOutError),
        );
        expect(ms).toBeLessThan(BOUND_MS + 1500);
        const failures = (error as ShardFanOutError).failures;
        expect(failures.map((f) => f.shard)).toEqual([4, 5, 6, 7]);
        for (const f of failures.slice(2)) {
          expect(String((f.error as Error).message)).toMatch(
            /cannot connect: .*\(not tried: the host could not be reached earlier in this run\)$/,
          );
        }
      } finally {
        await router.close();
      }
    },
  );

  it(
    'router: a call on a silent host fails naming it and the shard; calls on the other host go on',
    { timeout: 30_000 },
    async () => {
      const router = await ShardRouter.open(fleet.configFile);
      try {
        expect((await router.withShard(5, (c) => c.query('SELECT 1 AS one'))).rows).toEqual([{ one: 1 }]);
        proxy.silence('after-handshake');
        const started = performance.now();
        await expect(router.withShard(5, (c) => c.query('SELECT 1 AS one'))).rejects.toThrow(
          /^host pg2, shard 5: stopped answering: no reply for 2 s/,
        );
        expect(performance.now() - started).toBeLessThan(WITHIN_MS);
        expect((await router.withShard(1, (c) => c.query('SELECT 1 AS one'))).rows).toEqual([{ one: 1 }]);
      } finally {
        await router.close();
      }
    },
  );

  it(
    'router with statementTimeoutMs: a silent host is probed once that timeout and a second have passed, not after the whole hostTimeout; a statement that runs longer (fn lifted the timeout) is found busy and waited for',
    { timeout: 30_000 },
    async () => {
      const router = await ShardRouter.open(fleet.configFile, { statementTimeoutMs: 300 });
      try {
        // Alive and busy: silent for 2.5 s, past the 1.3 s, and the probe finds it running.
        const slept = await router.withShard(5, async (c) => {
          await c.query('SET LOCAL statement_timeout = 0');
          return (await c.query<{ one: number }>('SELECT 1 AS one FROM pg_sleep(2.5)')).rows;
        });
        expect(slept).toEqual([{ one: 1 }]);
        proxy.silence('after-handshake');
        const started = performance.now();
        await expect(router.withShard(5, (c) => c.query('SELECT 1 AS one'))).rejects.toThrow(
          /^host pg2, shard 5: stopped answering: no reply for 1\.3 s and a new connection could not run SELECT 1 within 2 s/,
        );
        expect(performance.now() - started).toBeLessThan(WITHIN_MS);
        expect((await router.withShard(1, (c) => c.query('SELECT 1 AS one'))).rows).toEqual([{ one: 1 }]);
      } finally {
        await router.close();
      }
    },
  );

  it(
    'router from seeds: a seed that cannot be connected to is not tried again under its registry name (one connect timeout, not two)',
    { timeout: 60_000 },
    async () => {
      proxy.silence('all');
      const connectTimeoutMs = 3000;
      // pg2's registry address is the proxy's URL: the first seed's server.
      const { value: router, ms } = await timed(() =>
        ShardRouter.open({ seeds: [proxy.url, db.urls[0]!] }, { connectTimeoutMs }),
      );
      try {
        // Seeds read at once (one timeout); pg2 from the registry used to wait out another.
        expect(ms).toBeLessThan(2 * connectTimeoutMs - 500);
        expect(ms).toBeGreaterThanOrEqual(connectTimeoutMs - 100);
        const unreachable = router.unreachableHosts();
        expect(unreachable.map((u) => u.name).sort()).toEqual(['pg2', 'seed 1']);
        expect(unreachable.find((u) => u.name === 'pg2')?.reason).toMatch(/cannot connect: .*timeout/);
        expect((await router.withShard(1, (c) => c.query('SELECT 1 AS one'))).rows).toEqual([{ one: 1 }]);
        // pg2 is still in the map (the first seed's server and pg2 are the same host): its call says so.
        await expect(router.withShard(5, (c) => c.query('SELECT 1 AS one'))).rejects.toThrow(
          /^host pg2, shard 5: cannot connect/,
        );
      } finally {
        await router.close();
      }
    },
  );

  it(
    'router: a statement that runs longer than the bound on a live host is waited for',
    { timeout: 30_000 },
    async () => {
      const router = await ShardRouter.open(fleet.configFile);
      try {
        const { value, ms } = await timed(() => router.withShard(5, (c) => c.query('SELECT pg_sleep(5), 1 AS one')));
        expect(value.rows[0]).toMatchObject({ one: 1 });
        expect(ms).toBeGreaterThanOrEqual(5000);
      } finally {
        await router.close();
      }
    },
  );

  it(
    'move-shard: a target that goes silent mid-copy fails the move within the bound naming it; --abort then cleans up',
    { timeout: 90_000 },
    async () => {
      await withClient(db.urls[0]!, (client) =>
        client.query(
          `INSERT INTO insta0.photos (user_id, image_url) SELECT g, repeat('x', 200) || g FROM generate_series(1, 30000) g`,
        ),
      );
      // The copy sends some 6 MB to the target; the schema statements before it a few kB.
      proxy.silenceAfter(1_000_000);
      const { value: run, ms } = await timed(() =>
        runCli(['move-shard', '0', '--to', 'pg2', '--yes', '-c', fleet.configFile]),
      );
      expect(proxy.bytesUp, run.stderr).toBeGreaterThan(1_000_000);
      expect(ms).toBeLessThan(30_000);
      expect(run.code).toBe(1);
      expect(run.stderr).toMatch(/host pg2.*stopped answering: no reply for 2 s/);

      proxy.resume();
      const abort = await runCli(['move-shard', '0', '--abort', '--yes', '-c', fleet.configFile]);
      expect(abort.code, abort.stderr).toBe(0);
      const status = await runCli(['status', '-c', fleet.configFile]);
      expect(status.code, status.stdout + status.stderr).toBe(0);
    },
  );
});

/** `shardctl move-shard 0 --to pg2 --yes …` as a child process of this build, its output read as it comes. */
async function startMove(args: readonly string[]): Promise<ChildProcessByStdio<null, Readable, Readable>> {
  // Refuses a build older than the sources, so the child below runs this code.
  expect((await spawnCli(['--version'])).code).toBe(0);
  return spawn(
    process.execPath,
    [join(import.meta.dirname, '..', '..', 'bin', 'shardctl.js'), 'move-shard', '0', '--to', 'pg2', '--yes', ...args],
    { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, NO_COLOR: '1' } },
  );
}

describe("a move's process", () => {
  const db = useTestDatabases(2);
  afterAll(() => removeCliSnapshot());

  it('exits as soon as it has printed its result (no timer left behind)', { timeout: 60_000 }, async () => {
    const fleet = makeFleet({ urls: db.urls, replicationUrls: db.replicationUrls, shards: 2 });
    expect((await init(await fleet.config())).ok).toBe(true);
    const child = await startMove(['-c', fleet.configFile]);
    let output = '';
    let resultAt: number | undefined;
    for (const stream of [child.stdout, child.stderr]) {
      stream.setEncoding('utf8').on('data', (chunk: string) => {
        output += chunk;
        if (resultAt === undefined && /shard 0 moved from pg1 to pg2/.test(output)) resultAt = performance.now();
      });
    }
    const code = await new Promise<number | null>((resolve) => child.once('close', resolve));
    const exitedAt = performance.now();
    expect(code, output).toBe(0);
    expect(resultAt, output).toBeDefined();
    // The slot watcher's 2 s look-round used to keep the process alive for up to 2 s after this.
    expect(exitedAt - resultAt!).toBeLessThan(700);
  });
});

describe('a target that stops answering while a wave is fenced', () => {
  const db = useTestDatabases(2);
  let proxy: TcpProxy | undefined;
  afterAll(async () => {
    await proxy?.close();
    await removeCliSnapshot();
  });

  it(
    'is cut off about 2 s past the fence limit: the source is writable again long before the silence would be noticed, the move stops naming pg2, and --resume finishes',
    { timeout: 90_000 },
    async () => {
      const proxied = await startTcpProxy(db.urls[1]!);
      proxy = proxied;
      // pg1: shards 0-3, direct; pg2: 4-7 through the proxy, whose silence is noticed only after
      // hostTimeout (10 s, the default) and a probe of as long.
      const fleet = makeFleet({
        urls: [db.urls[0]!, proxied.url],
        replicationUrls: [undefined, db.replicationUrls[1]],
        shards: 8,
      });
      expect((await init(await fleet.config())).ok).toBe(true);
      await withClient(db.urls[0]!, (client) =>
        client.query(
          `INSERT INTO insta0.photos (user_id, image_url) SELECT g, 'u' || g FROM generate_series(1, 500) g`,
        ),
      );
      // The target's apply worker stalls on the fence marker (a trigger of the test's, which fires in
      // the apply worker too): the cut-over is still waiting on pg2 when the proxy goes silent.
      await withClient(db.urls[1]!, (client) =>
        client.query(`
          CREATE FUNCTION shardctl.test_stall() RETURNS trigger LANGUAGE plpgsql AS $$
          BEGIN IF NEW.kind LIKE 'fenced-%' THEN PERFORM pg_sleep(6); END IF; RETURN NEW; END $$;
          CREATE TRIGGER test_stall BEFORE INSERT ON shardctl.move_markers FOR EACH ROW EXECUTE FUNCTION shardctl.test_stall();
          ALTER TABLE shardctl.move_markers ENABLE ALWAYS TRIGGER test_stall;`),
      );
      const child = await startMove(['--max-fenced', '1s', '-c', fleet.configFile]);
      let output = '';
      let fencedAt: number | undefined;
      for (const stream of [child.stdout, child.stderr]) {
        stream.setEncoding('utf8').on('data', (chunk: string) => {
          output += chunk;
          if (fencedAt === undefined && /^done: fenced/m.test(output)) {
            fencedAt = performance.now();
            proxy!.silence();
          }
        });
      }
      const exited = new Promise<number | null>((resolve) => child.once('close', resolve));
      // The application's writes on pg1, from the fence on: refused (SC100) until the wave is released.
      let writableAt: number | undefined;
      let code: number | null;
      try {
        await withClient(db.urls[0]!, async (client) => {
          let done = false;
          void exited.then(() => (done = true));
          const until = performance.now() + 60_000;
          while ((!done || writableAt === undefined) && performance.now() < until) {
            if (fencedAt !== undefined && writableAt === undefined) {
              try {
                await client.query(`INSERT INTO insta0.photos (user_id, image_url) VALUES (0, 'after')`);
                writableAt = performance.now();
              } catch (error) {
                expect((error as { code?: string }).code).toBe('SC100');
              }
            }
            if (done && fencedAt === undefined) break;
            await new Promise((resolve) => setTimeout(resolve, 50));
          }
        });
        code = await exited;
      } finally {
        // A failed expectation above must not leave the move running, holding its locks.
        child.kill('SIGKILL');
      }
      expect(code, output).toBe(1);
      expect(fencedAt, output).toBeDefined();
      expect(writableAt, output).toBeDefined();
      // The fence limit (1 s), the cut-off's slack (1 s of silence, then a probe of 1 s), and a
      // margin for a loaded machine: far below the 10 s of silence and the 10 s probe the host would
      // otherwise be waited for (24 s without the cut-off).
      expect(writableAt! - fencedAt!, output).toBeLessThan(6000);
      expect(output).toMatch(
        /host pg2.*did not answer within the fence limit \(1\.0 s\) while shard 0 refused writes/s,
      );
      expect(output).toMatch(/writable again on pg1/);

      proxy.resume();
      await withClient(db.urls[1]!, (client) =>
        client.query('DROP TRIGGER test_stall ON shardctl.move_markers; DROP FUNCTION shardctl.test_stall()'),
      );
      const resumed = await runCli(['move-shard', '0', '--resume', '--yes', '--json', '-c', fleet.configFile]);
      expect(resumed.code, resumed.stderr).toBe(0);
      // Its report counts the stopped run's write block too.
      expect((JSON.parse(resumed.stdout) as { writeBlockedMs: number }).writeBlockedMs).toBeGreaterThanOrEqual(1000);
      const rows = await withClient(db.urls[1]!, (client) =>
        client.query<{ n: number }>('SELECT count(*)::int AS n FROM insta0.photos'),
      );
      expect(rows.rows[0]!.n).toBe(501);
    },
  );
});
