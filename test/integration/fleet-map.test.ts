/**
 * The map lives in the fleet: application processes holding an old copy of the file (or only a
 * seed URL) follow every move, operators holding an old copy are refused, and `map pull` repairs
 * the file. Three hosts: pg1 and pg3 are two databases on the first server, pg2 on the second.
 */
import { copyFileSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { init, loadConfig, ShardRouter } from '../../src/index.js';
import { HostError } from '../../src/errors.js';
import { makeFleet, runCli } from '../helpers/fleet.js';
import { useTestDatabases, withClient } from '../helpers/hosts.js';
import { startTcpProxy, type TcpProxy } from '../helpers/tcp-proxy.js';
import { startApp, waitForCalls } from '../helpers/app.js';

function threeHosts() {
  const pair = useTestDatabases(2);
  const third = useTestDatabases(1);
  return (): string[] => [pair.urls[0]!, pair.urls[1]!, third.urls[0]!];
}

const proxies: TcpProxy[] = [];
afterAll(async () => {
  for (const p of proxies) await p.close();
});

describe('applications with an old copy of the map, or only a seed URL', () => {
  const urls = threeHosts();

  it('follow a shard to a second host and to a third the copy does not list, through gc: no call fails, every row arrives once', async () => {
    // The operator's file starts with pg1 and pg2; the application's copy is taken now.
    const fleet = makeFleet({ urls: urls().slice(0, 2), shards: 8, split: ['0-3', '4-7'] });
    expect((await init(await fleet.config())).ok).toBe(true);
    const stale = path.join(fleet.dir, 'app-copy.yaml');
    copyFileSync(fleet.configFile, stale);

    const fromFile = startApp(stale, 3);
    const fromSeed = startApp(urls()[1]!, 11); // 11 mod 8 = 3, through pg2 only
    await waitForCalls(fromFile, 20);
    await waitForCalls(fromSeed, 20);

    const operator = async (...args: string[]) => {
      const run = await runCli([...args, '-c', fleet.configFile]);
      expect(run.code, `${args.join(' ')}: ${run.stderr}`).toBe(0);
    };
    await operator('move-shard', '3', '--to', 'pg2', '--yes');
    await waitForCalls(fromFile, fromFile.calls.length + 20);
    await operator('gc', '--yes');
    await waitForCalls(fromFile, fromFile.calls.length + 20);
    await waitForCalls(fromSeed, fromSeed.calls.length + 20);
    // pg3 joins the operator's map (not the application's copy) and takes shard 3.
    writeFileSync(
      fleet.configFile,
      `${readFileSync(fleet.configFile, 'utf8')}  - name: pg3\n    url: ${urls()[2]}\n    shards: ""\n`,
    );
    await operator('init');
    await operator('move-shard', '3', '--to', 'pg3', '--yes');
    await waitForCalls(fromFile, fromFile.calls.length + 20);
    await operator('gc', '--yes');
    await waitForCalls(fromFile, fromFile.calls.length + 20);
    await waitForCalls(fromSeed, fromSeed.calls.length + 20);

    const calls = [...(await fromFile.stop()), ...(await fromSeed.stop())];
    expect(calls.filter((c) => !c.ok)).toEqual([]);
    expect(calls.at(-1)!.host).toBe('pg3');
    const acknowledged = calls.map((c) => c.id!);
    await withClient(urls()[2]!, async (client) => {
      const ids = (await client.query<{ id: string }>('select id::text from insta3.photos')).rows.map((r) => r.id);
      expect(new Set(ids).size).toBe(ids.length);
      expect(acknowledged.filter((id) => !ids.includes(id))).toEqual([]);
      expect(ids.length).toBe(acknowledged.length);
    });
    for (const url of urls().slice(0, 2)) {
      await withClient(url, async (client) => {
        expect((await client.query(`select 1 from pg_namespace where nspname like 'insta3%'`)).rowCount).toBe(0);
      });
    }

    // A process started now from the same old copy writes to pg3 from its first call.
    const late = startApp(stale, 3, 10);
    await new Promise<void>((resolve) => late.child.once('exit', () => resolve()));
    expect(late.calls).toHaveLength(10);
    expect(late.calls.filter((c) => !c.ok || c.host !== 'pg3')).toEqual([]);
  }, 180_000);
});

describe('two operators, one with an old copy of the file', () => {
  const db = useTestDatabases(2);

  it('the old copy is refused by every command that writes, status names the difference, map pull repairs it', async () => {
    const fleet = makeFleet({ urls: db.urls, shards: 8, split: ['0-3', '4-7'], schemaPrefix: 'op' });
    expect((await init(await fleet.config())).ok).toBe(true);
    const other = path.join(fleet.dir, 'other-operator.yaml');
    copyFileSync(fleet.configFile, other);
    const moved = await runCli(['move-shard', '2-3', '--to', 'pg2', '--yes', '-c', fleet.configFile]);
    expect(moved.code, moved.stderr).toBe(0);

    for (const args of [
      ['move-shard', '1', '--to', 'pg2', '--yes'],
      ['rebalance', '--yes'],
      ['gc', '--yes'],
      ['migrate'],
      ['migrate', '--check'],
      ['add-schema', '0'],
      ['init'],
    ]) {
      const run = await runCli([...args, '-c', other]);
      expect(run.code, `${args.join(' ')}: ${run.stdout}${run.stderr}`).toBe(2);
      expect(run.stderr).toContain('disagrees with the fleet; nothing was written');
      expect(run.stderr).toContain('shards 2-3: the file says pg1, the fleet says pg2');
      expect(run.stderr).toContain('shardctl map pull');
    }
    const status = await runCli(['status', '-c', other]);
    expect(status.code).toBe(3);
    expect(status.stdout).toContain('map: the file DISAGREES with the fleet');
    expect(status.stdout).toContain('shards 2-3: the file says pg1, the fleet says pg2');
    // The hosts themselves are judged by the fleet's placement: nothing is missing, refusing writes
    // or misplaced, and nothing asks for init or a move's --resume that does not exist.
    expect(status.stdout).toMatch(/^pg1: ok .* 2 expected, 2 present/m);
    expect(status.stdout).toMatch(/^pg2: ok .* 6 expected, 6 present/m);
    expect(status.stdout).toContain('fenced old copies (moved away, waiting for gc): 2-3');
    expect(status.stdout).not.toMatch(/REFUSING WRITES|outdated|mapped to another host|missing: /);
    const show = await runCli(['map', 'show', '--json', '-c', other]);
    expect(show.code).toBe(3);
    expect(JSON.parse(show.stdout).hosts.map((h: { name: string; shards: string }) => [h.name, h.shards])).toEqual([
      ['pg1', '0-1'],
      ['pg2', '2-7'],
    ]);

    // exec and decode route by the fleet, whatever the file says.
    const wrote = await runCli([
      'exec',
      '--write',
      '--json',
      '--shards',
      '2',
      "insert into photos (user_id, image_url) values (2, 'x') returning id",
      '-c',
      other,
    ]);
    expect(wrote.code, wrote.stderr).toBe(0);
    const [row] = JSON.parse(wrote.stdout) as { shard: number; id: string }[];
    await withClient(db.urls[1]!, async (client) => {
      expect((await client.query(`select 1 from op2.photos where id = $1`, [row!.id])).rowCount).toBe(1);
    });
    const decoded = await runCli(['decode', '--json', row!.id, '-c', other]);
    expect(JSON.parse(decoded.stdout)[0]).toMatchObject({ shard: 2, host: 'pg2' });

    const before = readFileSync(other, 'utf8');
    const pulled = await runCli(['map', 'pull', '-c', other]);
    expect(pulled.code, pulled.stderr).toBe(0);
    const after = readFileSync(other, 'utf8');
    expect(after).not.toBe(before);
    expect((await loadConfig(other)).hosts.map((h) => [h.name, h.shardsSpec])).toEqual([
      ['pg1', '0-1'],
      ['pg2', '2-7'],
    ]);
    expect((await runCli(['status', '-c', other])).code).toBe(0);
    const gc = await runCli(['gc', '--yes', '-c', other]);
    expect(gc.code, gc.stderr).toBe(0);

    // A copy whose two urls are swapped: its placement agrees by name, but each url reaches the
    // other host. Every command that writes refuses it naming the field; exec routes by what
    // answered as each host, so a write for pg1's shard lands on pg1.
    const swapped = path.join(fleet.dir, 'swapped.yaml');
    const text = readFileSync(fleet.configFile, 'utf8');
    writeFileSync(
      swapped,
      text.replace(db.urls[0]!, '@@FIRST@@').replace(db.urls[1]!, db.urls[0]!).replace('@@FIRST@@', db.urls[1]!),
    );
    for (const args of [['rebalance', '--yes'], ['gc', '--yes'], ['migrate'], ['add-schema', '0'], ['init']]) {
      const run = await runCli([...args, '-c', swapped]);
      expect(run.code, `${args.join(' ')}: ${run.stdout}${run.stderr}`).toBe(2);
      expect(run.stderr).toMatch(/hosts\[\d\]\.url \(host pg\d\) in .*swapped\.yaml: reaches host pg\d of the fleet/);
      expect(run.stderr).toContain('nothing was written');
    }
    const viaSwapped = await runCli([
      'exec',
      '--write',
      '--json',
      '--shards',
      '0',
      "insert into photos (user_id, image_url) values (3, 'swapped') returning id",
      '-c',
      swapped,
    ]);
    expect(viaSwapped.code, viaSwapped.stderr).toBe(0);
    const [landed] = JSON.parse(viaSwapped.stdout) as { id: string }[];
    await withClient(db.urls[0]!, async (client) => {
      expect((await client.query(`select 1 from op0.photos where id = $1`, [landed!.id])).rowCount).toBe(1);
    });
  }, 120_000);
});

describe('discovery with a host down', () => {
  const db = useTestDatabases(2);

  it("opens from the hosts that answer; calls for the down host's shards fail naming it, the others work", async () => {
    const proxy = await startTcpProxy(db.urls[1]!);
    proxies.push(proxy);
    const fleet = makeFleet({
      urls: [db.urls[0]!, proxy.url],
      replicationUrls: [undefined, db.replicationUrls[1]],
      shards: 4,
      split: ['0-1', '2-3'],
      schemaPrefix: 'dn',
    });
    expect((await init(await fleet.config())).ok).toBe(true);
    await proxy.close();

    const router = await ShardRouter.open({ seeds: [db.urls[0]!] }, { connectTimeoutMs: 2_000 });
    try {
      expect(router.unreachableHosts().map((h) => h.name)).toEqual(['pg2']);
      expect(router.hostForShard(3).name).toBe('pg2');
      expect(await router.withShard(1, async (c) => (await c.query('select current_schema() as s')).rows[0].s)).toBe(
        'dn1',
      );
      const failed = await router.withShard(3, async (c) => c.query('select 1')).catch((e: unknown) => e);
      expect(failed).toBeInstanceOf(HostError);
      expect((failed as HostError).message).toMatch(/^host pg2\b.*cannot connect/);
    } finally {
      await router.close();
    }
  }, 60_000);
});

describe('map set-address to another address of the same server (a pooler put in front of it)', () => {
  const db = useTestDatabases(1);

  it('records it, and does not take the earlier address of the same server for a second primary (exit 0)', async () => {
    const fleet = makeFleet({ urls: db.urls, shards: 2, split: ['0-1'], schemaPrefix: 'sa' });
    expect((await init(await fleet.config())).ok).toBe(true);
    // Another address of the same server, as a pooler in front of it would be.
    const proxy = await startTcpProxy(db.urls[0]!);
    proxies.push(proxy);
    const set = await runCli(['map', 'set-address', 'pg1', proxy.url, '--json', '-c', fleet.configFile]);
    expect(set.code, set.stderr).toBe(0);
    expect(set.stderr).not.toContain('TWO PRIMARIES');
    expect((JSON.parse(set.stdout) as { stillWritable: string[] }).stillWritable).toEqual([]);
    const registry = await withClient(db.urls[0]!, (c) =>
      c.query<{ address: string }>(`select address from shardctl.hosts where name = 'pg1'`),
    );
    expect(registry.rows[0]!.address).toContain(`:${proxy.port}/`);
  });
});

describe('split brain: two addresses of a host answer as its writable primary', () => {
  const db = useTestDatabases(2);

  it('status and map set-address say TWO PRIMARIES, naming the other address (exit 3 and 1)', async () => {
    const fleet = makeFleet({ urls: [db.urls[0]!], shards: 2, split: ['0-1'], schemaPrefix: 'sb' });
    expect((await init(await fleet.config())).ok).toBe(true);
    const recorded = await withClient(db.urls[0]!, (c) =>
      c.query<{ fleet_id: string }>(`select fleet_id::text as fleet_id from shardctl.fleet`),
    );
    // The second server's database records itself as pg1 of the same fleet, as an old primary
    // started again as a primary after a failover does (its control schema is the host's).
    await withClient(db.urls[1]!, (c) =>
      c.query(
        `create schema shardctl; create table shardctl.fleet (fleet_id uuid, host_name text); insert into shardctl.fleet values ('${recorded.rows[0]!.fleet_id}', 'pg1')`,
      ),
    );
    const first = new URL(db.urls[0]!);
    const second = new URL(db.urls[1]!);
    // Both addresses in pg1's url, in libpq's syntax, as for a primary and its standby.
    const both = `${first.protocol}//${first.username}:${first.password}@${first.host},${second.host}${first.pathname}?target_session_attrs=read-write`;
    writeFileSync(fleet.configFile, readFileSync(fleet.configFile, 'utf8').replace(db.urls[0]!, both));
    const status = await runCli(['status', '-c', fleet.configFile]);
    expect(status.code, status.stderr).toBe(3);
    expect(status.stdout).toContain(`TWO PRIMARIES: ${second.host} also answers as a writable primary of pg1`);
    const json = await runCli(['status', '--json', '-c', fleet.configFile]);
    expect((JSON.parse(json.stdout) as { hosts: { twoPrimaries: string[] }[] }).hosts[0]!.twoPrimaries).toEqual([
      second.host,
    ]);
    const set = await runCli(['map', 'set-address', 'pg1', '-c', fleet.configFile]);
    expect(set.code, set.stderr).toBe(1);
    expect(set.stdout).toContain(
      `TWO PRIMARIES: the old address ${second.host} still answers as a writable primary of pg1`,
    );

    // Nor does a command that writes: init stops before it locks or writes anything.
    const writing = await runCli(['init', '-c', fleet.configFile]);
    expect(writing.code, writing.stderr).toBe(1);
    expect(writing.stderr).toContain(
      `TWO PRIMARIES: ${second.host} also answers as a writable primary of pg1 beside ${first.host}`,
    );
    expect(writing.stderr).toContain('nothing was written');

    // A router does not pick one of the two (libpq's order would take the first): the call waits
    // out failoverTimeoutMs as for a failover, then fails naming both, and writes nowhere.
    const router = await ShardRouter.open(fleet.configFile, { failoverTimeoutMs: 500 });
    try {
      const started = Date.now();
      const refused = await router
        .withShard(1, (c) => c.query(`insert into photos (user_id, image_url) values (1, 'split')`))
        .then(
          () => undefined,
          (error: unknown) => error,
        );
      expect(refused).toBeInstanceOf(HostError);
      expect(refused).toMatchObject({ code: 'TWO_PRIMARIES', host: 'pg1', shard: 1 });
      expect((refused as Error).message).toContain(
        `TWO PRIMARIES: ${second.host} also answers as a writable primary of pg1 beside ${first.host}`,
      );
      expect(Date.now() - started).toBeGreaterThanOrEqual(500);
      const written = await withClient(db.urls[0]!, (c) =>
        c.query(`select 1 from sb1.photos where image_url = 'split'`),
      );
      expect(written.rowCount).toBe(0);
      // The other server no longer records itself as pg1 (it was made another host's): the next call runs.
      await withClient(db.urls[1]!, (c) => c.query(`update shardctl.fleet set host_name = 'retired'`));
      const ran = await router.withShard(1, (c) => c.query<{ port: number }>(`select inet_server_port() as port`));
      expect(String(ran.rows[0]!.port)).toBe(first.port);
    } finally {
      await router.close();
    }
  });
});
