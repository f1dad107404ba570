/**
 * move-shard's preflight: every failed check stops the move before it changes anything, exit 1,
 * saying what to change; a bad argument is a usage error (exit 2); --dry-run only reports.
 */
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { hostForShard } from '../../src/config/types.js';
import { ONLINE_STEPS, OFFLINE_STEPS } from '../../src/moves/state.js';
import { init } from '../../src/commands/init.js';
import { FIXTURE_MIGRATIONS, type Fleet, makeFleet, runCli } from '../helpers/fleet.js';
import { adminClient, useTestDatabases, withClient } from '../helpers/hosts.js';
import {
  fleetState,
  type OwnHost,
  replicationObjects,
  schemaFingerprint,
  shardRow,
  startOwnHost,
} from '../helpers/moves.js';

const db = useTestDatabases(2);
const noKeyDb = useTestDatabases(2);
const walDb = useTestDatabases(1);
const workersDb = useTestDatabases(1);

const move = (fleet: Fleet, shard: number, ...flags: string[]) => [
  'move-shard',
  String(shard),
  ...flags,
  '-c',
  fleet.configFile,
];

async function seed(url: string, shard: number): Promise<void> {
  await withClient(url, async (client) => {
    await client.query(
      `insert into insta${shard}.photos (user_id, image_url) select g, 'seed-' || g from generate_series(1, 300) g`,
    );
    await client.query(
      `insert into insta${shard}.likes (photo_id, user_id) select g, g from generate_series(1, 100) g`,
    );
  });
}

describe('move-shard preflight on a two-host fleet', () => {
  let fleet: Fleet;
  let urls: string[];

  beforeAll(async () => {
    urls = db.urls;
    fleet = makeFleet({ urls, shards: 8, split: ['0-3', '4-7'] });
    expect((await init(await fleet.config())).ok).toBe(true);
    await seed(urls[0]!, 1);
  });

  it('--dry-run prints every check and the plan, exit 0, and changes nothing', async () => {
    const before = await fleetState(urls, fleet.configFile);
    const online = await runCli(move(fleet, 1, '--to', 'pg2', '--dry-run'));
    expect(online.code, online.stderr).toBe(0);
    const lines = online.stdout.trimEnd().split('\n');
    expect(lines[0]).toBe('move of shard 1 from pg1 to pg2 (online) — dry run, nothing changed');
    const checks = lines.filter((l) => /^ {2}(ok {2}|FAIL) /.test(l));
    expect(checks.map((l) => /^ {2}(ok {2}|FAIL) ([^:]+):/.exec(l)?.slice(1))).toEqual(
      [
        'map',
        'shards on source',
        'target free',
        'target initialised',
        'versions',
        'wal_level',
        'replication slots',
        'replication workers',
        'replica identity',
        'logged tables',
        'target reaches source',
        'config file',
        'no other move',
        'same tables as the migrations build',
        'roles on target',
        'owners on target',
        'create on target',
        'create on source',
        'replica role on target',
        'migrations',
        'target disk',
        'source WAL limits',
      ].map((name) => ['ok  ', name]),
    );
    expect(online.stdout).toContain('  ok   wal_level: wal_level=logical on pg1\n');
    expect(online.stdout).toContain('  ok   target reaches source: not probed in --dry-run');
    expect(lines).toContain(`  steps: ${ONLINE_STEPS.join(' → ')}`);

    const offline = await runCli(move(fleet, 1, '--to', 'pg2', '--mode', 'offline', '--dry-run'));
    expect(offline.code, offline.stderr).toBe(0);
    expect(offline.stdout).toContain('(offline) — dry run, nothing changed');
    expect(offline.stdout).not.toContain('wal_level');
    // A publication is the online move's alone.
    expect(offline.stdout).toContain('  ok   create on target: ');
    expect(offline.stdout).not.toContain('create on source');
    expect(offline.stdout.trimEnd().split('\n')).toContain(`  steps: ${OFFLINE_STEPS.join(' → ')}`);

    expect(await fleetState(urls, fleet.configFile)).toEqual(before);
  });

  it('an unknown target host is a usage error: exit 2, naming the hosts there are; nothing changed', async () => {
    const before = await fleetState(urls, fleet.configFile);
    const run = await runCli(move(fleet, 1, '--to', 'pg9', '--yes'));
    expect(run.code).toBe(2);
    expect(run.stderr).toContain('option --to "pg9": no such host in the map (hosts: pg1, pg2)');
    expect(await fleetState(urls, fleet.configFile)).toEqual(before);
  });

  it('refuses to move a shard to the host it is on: exit 2 (nothing to move), nothing changed', async () => {
    const before = await fleetState(urls, fleet.configFile);
    const run = await runCli(move(fleet, 1, '--to', 'pg1', '--yes'));
    expect(run.code).toBe(2);
    expect(run.stderr).toBe('error: argument <shards> "1": shard 1 is already on pg1; nothing to move\n');
    expect(await fleetState(urls, fleet.configFile)).toEqual(before);
  });

  it('refuses a target that already holds the schema, saying to drop it; --dry-run shows the same failure with exit 1', async () => {
    await withClient(urls[1]!, (c) => c.query('create schema insta1; create table insta1.mine (x int)'));
    try {
      const before = await fleetState(urls, fleet.configFile);
      const run = await runCli(move(fleet, 1, '--to', 'pg2', '--yes'));
      expect(run.code).toBe(1);
      expect(run.stderr).toContain(
        'move of shard 1 from pg1 to pg2 not started; nothing was changed:\n' +
          '  - target free: the schema of shard 1 already exists on pg2 but shardctl did not create it there; drop it first\n',
      );
      const dry = await runCli(move(fleet, 1, '--to', 'pg2', '--dry-run'));
      expect(dry.code).toBe(1);
      expect(dry.stdout).toContain('  FAIL target free: the schema of shard 1 already exists on pg2');
      expect(await fleetState(urls, fleet.configFile)).toEqual(before);
      // The schema that was there is untouched.
      expect(await withClient(urls[1]!, (c) => c.query('select * from insta1.mine').then((r) => r.rowCount))).toBe(0);
    } finally {
      await withClient(urls[1]!, (c) => c.query('drop schema insta1 cascade'));
    }
  });
});

describe('a table without replica identity', () => {
  let fleet: Fleet;

  beforeAll(async () => {
    const migrations: Record<string, string> = {};
    for (const file of readdirSync(FIXTURE_MIGRATIONS))
      migrations[file] = readFileSync(join(FIXTURE_MIGRATIONS, file), 'utf8');
    migrations['0004_photo_events.sql'] =
      'CREATE TABLE photo_events (photo_id bigint NOT NULL, kind text NOT NULL, at timestamptz NOT NULL DEFAULT now());\n';
    fleet = makeFleet({ urls: noKeyDb.urls, shards: 4, split: ['0-1', '2-3'], migrations });
    expect((await init(await fleet.config())).ok).toBe(true);
    await seed(noKeyDb.urls[0]!, 1);
    await withClient(noKeyDb.urls[0]!, (c) =>
      c.query(`insert into insta1.photo_events (photo_id, kind) select g, 'view' from generate_series(1, 50) g`),
    );
  });

  it('stops an online move, naming the table and what to add (exit 1, nothing changed); with REPLICA IDENTITY FULL it moves', async () => {
    const urls = noKeyDb.urls;
    const before = await fleetState(urls, fleet.configFile);
    const run = await runCli(move(fleet, 1, '--to', 'pg2', '--yes'));
    expect(run.code).toBe(1);
    expect(run.stderr).toBe(
      'error: move of shard 1 from pg1 to pg2 not started; nothing was changed:\n' +
        '  - replica identity: table insta1.photo_events has no replica identity; add a primary key or ALTER TABLE … REPLICA IDENTITY FULL, or use --mode offline\n',
    );
    expect(await fleetState(urls, fleet.configFile)).toEqual(before);

    await withClient(urls[0]!, (c) => c.query('alter table insta1.photo_events replica identity full'));
    const rows = await withClient(urls[0]!, (c) => schemaFingerprint(c, 'insta1'));
    const moved = await runCli(move(fleet, 1, '--to', 'pg2', '--yes'));
    expect(moved.code, moved.stderr).toBe(0);
    expect(await withClient(urls[1]!, (c) => schemaFingerprint(c, 'insta1'))).toEqual(rows);
    expect(hostForShard(await fleet.config(), 1)?.name).toBe('pg2');
    expect(await replicationObjects(urls)).toEqual([]);
  });
});

/**
 * For a describe block: a two-host fleet of 4 shards on pg1 whose source (pg1) or target (pg2) is a
 * server of the block's own, started with `settings`, the other host a database of `other`; shard 1
 * seeded. Stopped after the block.
 */
function useOwnHostPair(
  settings: Record<string, string>,
  place: 'source' | 'target',
  other: ReturnType<typeof useTestDatabases>,
): { fleet: () => Fleet; urls: () => string[]; own: () => OwnHost } {
  let own: OwnHost | undefined;
  let dispose: (() => Promise<void>) | undefined;
  let fleet: Fleet | undefined;
  let urls: string[] = [];
  beforeAll(async () => {
    const started = await startOwnHost(settings);
    dispose = started.dispose;
    own = started.host;
    urls = place === 'source' ? [own.url, other.urls[0]!] : [other.urls[0]!, own.url];
    fleet = makeFleet({
      urls,
      shards: 4,
      split: ['0-3', ''],
      ...(place === 'source' ? { replicationUrls: [own.replicationUrl] } : {}),
    });
    expect((await init(await fleet.config())).ok).toBe(true);
    await seed(urls[0]!, 1);
  }, 120_000);
  afterAll(async () => {
    await dispose?.();
  });
  return { fleet: () => fleet!, urls: () => urls, own: () => own! };
}

/** An online move of shard 1 to pg2 refused by its preflight with this one failed check: exit 1, nothing changed. */
async function expectRefused(fleet: Fleet, urls: string[], failed: string): Promise<void> {
  const before = await fleetState(urls, fleet.configFile);
  const run = await runCli(move(fleet, 1, '--to', 'pg2', '--yes'));
  expect(run.code).toBe(1);
  expect(run.stderr).toBe(`error: move of shard 1 from pg1 to pg2 not started; nothing was changed:\n  - ${failed}\n`);
  expect(await fleetState(urls, fleet.configFile)).toEqual(before);
  expect(await replicationObjects(urls)).toEqual([]);
}

describe('a source with wal_level=replica', () => {
  const pair = useOwnHostPair({ wal_level: 'replica' }, 'source', walDb);

  it('stops an online move, saying to set wal_level=logical or use --mode offline (exit 1, nothing changed); offline it moves', async () => {
    const [fleet, urls] = [pair.fleet(), pair.urls()];
    await expectRefused(
      fleet,
      urls,
      'wal_level: wal_level=replica on pg1; set wal_level=logical and restart it, or use --mode offline',
    );

    const rows = await withClient(pair.own().url, (c) => schemaFingerprint(c, 'insta1'));
    const offline = await runCli(move(fleet, 1, '--to', 'pg2', '--mode', 'offline', '--yes'));
    expect(offline.code, offline.stderr).toBe(0);
    const target = await adminClient(urls[1]!);
    try {
      expect(await schemaFingerprint(target, 'insta1')).toEqual(rows);
      expect(await shardRow(target, 1)).toEqual({ state: 'active', schema: 'insta1' });
    } finally {
      await target.end();
    }
  });
});

describe('a target without logical replication workers', () => {
  const pair = useOwnHostPair({ max_logical_replication_workers: '0' }, 'target', workersDb);

  it('stops an online move before its copy, saying what to raise or to use --mode offline (exit 1, nothing changed)', async () => {
    await expectRefused(
      pair.fleet(),
      pair.urls(),
      "replication workers: 0 of 0 logical replication workers free on pg2; the move's subscription could never run there: raise max_logical_replication_workers (and max_worker_processes) on pg2 and restart it, or use --mode offline",
    );
  });
});
