/**
 * shardctl rebalance against real PostgreSQL: onto new hosts (pairs of hosts in parallel), off a
 * draining host, --dry-run and bad input changing nothing, and a rebalance killed mid-move finished
 * by running it again. A "host" here is a database: two per PostgreSQL server give four hosts.
 */
import { randomBytes } from 'node:crypto';
import { readFileSync, writeFileSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { init } from '../../src/commands/init.js';
import { rebalance } from '../../src/commands/rebalance.js';
import { loadConfig } from '../../src/config/load.js';
import { formatShardList } from '../../src/config/ranges.js';
import { status } from '../../src/commands/status.js';
import { hostForShard, type ShardctlConfig } from '../../src/config/types.js';
import { type Fleet, makeFleet, runCli } from '../helpers/fleet.js';
import { useTestDatabases, withClient } from '../helpers/hosts.js';
import {
  fleetState,
  lastMove,
  removeCliSnapshot,
  replicationObjects,
  schemaFingerprint,
  spawnCli,
  waitForMoveSessionsToEnd,
} from '../helpers/moves.js';

const growA = useTestDatabases(2);
const growB = useTestDatabases(2);
const drainA = useTestDatabases(2);
const drainB = useTestDatabases(1);
const badDb = useTestDatabases(2);
const ownEnvA = useTestDatabases(2);
const ownEnvB = useTestDatabases(1);
const killA = useTestDatabases(2);
const killB = useTestDatabases(1);
afterAll(removeCliSnapshot);

/** A fleet over these databases (pg1, pg2, ...), with per-host YAML lines (weight, drain) added. */
function fleetOf(
  urls: readonly string[],
  replicationUrls: readonly string[],
  shards: number,
  split: readonly string[],
  extra: Record<string, string> = {},
): Fleet {
  const fleet = makeFleet({ urls, shards, split });
  let text = readFileSync(fleet.configFile, 'utf8');
  urls.forEach((url, i) => {
    const lines = [`    url: ${url}`];
    // makeFleet writes the replicationUrl itself for the test hosts (under Docker they differ).
    if (replicationUrls[i] !== url && !text.includes(`replicationUrl: ${replicationUrls[i]}`))
      lines.push(`    replicationUrl: ${replicationUrls[i]}`);
    const more = extra[`pg${i + 1}`];
    if (more) lines.push(...more.split('\n').map((l) => `    ${l}`));
    text = text.replace(`    url: ${url}\n`, `${lines.join('\n')}\n`);
  });
  writeFileSync(fleet.configFile, text);
  return fleet;
}

/** Rows in every shard, more in the higher ones, so the higher the shard the larger it is. */
async function seedAll(config: ShardctlConfig): Promise<void> {
  for (const host of config.hosts) {
    await withClient(host.url, async (client) => {
      for (const shard of host.shards) {
        const photos = 200 + shard * 200;
        await client.query(
          `insert into insta${shard}.photos (user_id, image_url) select g, 'seed-' || g from generate_series(1, ${photos}) g`,
        );
        await client.query(
          `insert into insta${shard}.likes (photo_id, user_id) select g, g from generate_series(1, ${photos / 2}) g`,
        );
        await client.query(`analyze insta${shard}.photos, insta${shard}.likes`);
      }
    });
  }
}

/** Every shard's rows, fingerprinted on the host the map puts it on. */
async function fingerprints(config: ShardctlConfig): Promise<Record<number, Record<string, string>>> {
  const out: Record<number, Record<string, string>> = {};
  for (const host of config.hosts) {
    await withClient(host.url, async (client) => {
      for (const shard of host.shards) out[shard] = await schemaFingerprint(client, `insta${shard}`);
    });
  }
  return out;
}

const shardCounts = (config: ShardctlConfig) => Object.fromEntries(config.hosts.map((h) => [h.name, h.shards.length]));

describe('rebalance onto new hosts', () => {
  let fleet: Fleet;
  let urls: string[];

  beforeAll(async () => {
    urls = [growA.urls[0]!, growA.urls[1]!, growB.urls[0]!, growB.urls[1]!];
    fleet = fleetOf(urls, [...growA.replicationUrls, ...growB.replicationUrls], 12, ['0-5', '6-11', '', '']);
    expect((await init(await fleet.config())).ok).toBe(true);
    await seedAll(await fleet.config());
  });

  it('--dry-run prints the plan as a table and JSON, and changes nothing (config file and catalog compared)', async () => {
    const before = await fleetState(urls, fleet.configFile);
    const dry = await runCli(['rebalance', '--dry-run', '-c', fleet.configFile]);
    expect(dry.code, dry.stderr).toBe(0);
    const lines = dry.stdout.split('\n');
    expect(lines[0]).toMatch(/^rebalance by count: 2 moves, 6 shards, [\d.]+ [kM]B$/);
    expect(lines[1]).toMatch(/^ {2}move +shards +count +bytes$/);
    expect(lines[2]).toMatch(/^ {2}pg1 → pg3 +0-2 +3 +[\d.]+ [kM]B$/);
    expect(lines[3]).toMatch(/^ {2}pg2 → pg4 +6-8 +3 +[\d.]+ [kM]B$/);
    expect(dry.stdout).toMatch(/\n {2}pg3 +0 → 3 +0 B → [\d.]+ [kM]B +weight 1, share 3 shards\n/);
    expect(dry.stderr).toContain('rebalance by count: dry run, nothing changed');

    const json = await runCli(['rebalance', '--dry-run', '--json', '--by', 'size', '-c', fleet.configFile]);
    expect(json.code, json.stderr).toBe(0);
    const result = JSON.parse(json.stdout) as {
      outcome: string;
      by: string;
      plan: { moves: { source: string; target: string; shards: number[]; bytes: string }[]; bytesMoved: string };
    };
    expect(result.outcome).toBe('dry-run');
    expect(result.by).toBe('size');
    expect(result.plan.moves.length).toBeGreaterThan(0);
    for (const move of result.plan.moves) expect(move.bytes).toMatch(/^\d+$/);
    expect(result.plan.bytesMoved).toMatch(/^\d+$/);
    expect(await fleetState(urls, fleet.configFile)).toEqual(before);
  });

  it('status --sizes lists bytes and rows per host and the largest shards first', async () => {
    const run = await runCli(['status', '--sizes', '--json', '-c', fleet.configFile]);
    expect(run.code, run.stderr).toBe(0);
    const sizes = JSON.parse(run.stdout) as {
      hosts: { host: string; shards: number; bytes: string; rows: string }[];
      shards: { shard: number; bytes: string; rows: string }[];
    };
    expect(sizes.hosts.map((h) => [h.host, h.shards])).toEqual([
      ['pg1', 6],
      ['pg2', 6],
      ['pg3', 0],
      ['pg4', 0],
    ]);
    expect(sizes.hosts[2]!.bytes).toBe('0');
    expect(BigInt(sizes.hosts[1]!.bytes)).toBeGreaterThan(BigInt(sizes.hosts[0]!.bytes));
    expect(sizes.shards).toHaveLength(12);
    const bytes = sizes.shards.map((s) => BigInt(s.bytes));
    expect([...bytes].sort((a, b) => (a < b ? 1 : a > b ? -1 : 0))).toEqual(bytes);
    // Shard 11 has the most rows: 2400 photos and 1200 likes.
    expect(sizes.shards.find((s) => s.shard === 11)!.rows).toBe('3600');
    expect(sizes.shards[0]!.shard).toBe(11);
    const human = await runCli(['status', '--sizes', '-c', fleet.configFile]);
    expect(human.code).toBe(0);
    expect(human.stdout).toMatch(/^host +shards +size +bytes +rows\npg1 +6 +[\d.]+ [kM]B +\d+ +~\d+ +weight 1\n/);
    expect(human.stdout).toContain('largest shards (10 of 12; --json lists all):\n');
  });

  it('moves shards and rows onto the empty hosts, disjoint pairs at the same time; the map is rewritten and status is ok', async () => {
    const before = await fingerprints(await fleet.config());
    const run = await runCli(['rebalance', '--yes', '--max-parallel', '2', '-c', fleet.configFile]);
    expect(run.code, run.stderr).toBe(0);
    // Both pairs started before either finished.
    const events = run.stderr
      .split('\n')
      .filter((l) => /^(starting|done) pg/.test(l))
      .map((l) => l.split(':')[0]!.replace(/ \(.*/, ''));
    expect(events.slice(0, 2).sort()).toEqual(['starting pg1 → pg3', 'starting pg2 → pg4']);
    expect(run.stdout).toMatch(/pg1 → pg3: shards 0-2 moved, \d+ rows verified/);
    expect(run.stderr).toMatch(/rebalance by count: 2 moves, 6 shards, [\d.]+ [kM]B moved, 9000 rows verified/);

    const config = await fleet.config();
    expect(config.hosts.map((h) => [h.name, h.shardsSpec])).toEqual([
      ['pg1', '3-5'],
      ['pg2', '9-11'],
      ['pg3', '0-2'],
      ['pg4', '6-8'],
    ]);
    expect(await fingerprints(config)).toEqual(before);
    const after = await status(config);
    expect(after.ok, JSON.stringify(after.hosts.filter((h) => !h.ok))).toBe(true);
    expect(await replicationObjects(urls)).toEqual([]);

    // Balanced now: a second run has nothing to do.
    const again = await runCli(['rebalance', '--yes', '-c', fleet.configFile]);
    expect(again.code, again.stderr).toBe(0);
    expect(again.stderr).toContain('every host has its share; nothing to move');
  });
});

describe('rebalance with a draining host', () => {
  let fleet: Fleet;
  let urls: string[];

  beforeAll(async () => {
    urls = [drainA.urls[0]!, drainA.urls[1]!, drainB.urls[0]!];
    fleet = fleetOf(urls, [...drainA.replicationUrls, drainB.replicationUrls[0]!], 8, ['0-3', '4-7', ''], {
      pg2: 'drain: true',
    });
    expect((await init(await fleet.config())).ok).toBe(true);
    await seedAll(await fleet.config());
  });

  it('by size: empties the draining host onto the others and every row arrives', async () => {
    const before = await fingerprints(await fleet.config());
    const run = await runCli(['rebalance', '--by', 'size', '--yes', '--json', '-c', fleet.configFile]);
    expect(run.code, run.stderr).toBe(0);
    const result = JSON.parse(run.stdout) as {
      outcome: string;
      plan: { moves: { source: string }[] };
      rowsMoved: string;
    };
    expect(result.outcome).toBe('rebalanced');
    expect(result.plan.moves.every((m) => m.source === 'pg2')).toBe(true);
    const config = await fleet.config();
    expect(config.hosts.find((h) => h.name === 'pg2')!.shards).toEqual([]);
    expect(config.hosts.find((h) => h.name === 'pg2')!.drain).toBe(true);
    expect(await fingerprints(config)).toEqual(before);
    for (let shard = 0; shard < 8; shard++) expect(hostForShard(config, shard)?.name).not.toBe('pg2');
    expect((await status(config)).ok).toBe(true);
    expect(BigInt(result.rowsMoved)).toBeGreaterThan(0n);
  });
});

// The library's rebalance over a config loaded with an environment of the caller's own (the hosts'
// password in a ${VAR} the process does not have): it read its file again before each move, with
// the process's environment, and stopped before its first move ("REBALANCE_TEST_SECRET is not set").
describe('rebalance from the library, of a config loaded with an environment of its own', () => {
  let fleet: Fleet;
  let urls: string[];

  beforeAll(async () => {
    urls = [ownEnvA.urls[0]!, ownEnvA.urls[1]!, ownEnvB.urls[0]!];
    fleet = fleetOf(urls, [...ownEnvA.replicationUrls, ...ownEnvB.replicationUrls], 6, ['0-5', '', '']);
    expect((await init(await fleet.config())).ok).toBe(true);
  });

  it('moves one batch after another with the addresses it was given, and the file keeps its ${VAR}', async () => {
    const password = new URL(urls[0]!).password;
    expect(password).not.toBe('');
    const text = readFileSync(fleet.configFile, 'utf8');
    writeFileSync(fleet.configFile, text.split(`:${password}@`).join(':${REBALANCE_TEST_SECRET}@'));
    expect(process.env.REBALANCE_TEST_SECRET).toBeUndefined();
    const config = await loadConfig(fleet.configFile, { env: { REBALANCE_TEST_SECRET: password } });
    const result = await rebalance(config, { maxParallel: 1 });
    expect({
      outcome: result.outcome,
      moves: result.moves.map((m) => `${m.source} → ${m.target}: ${formatShardList(m.shards)}`),
    }).toEqual({ outcome: 'rebalanced', moves: ['pg1 → pg2: 4-5', 'pg1 → pg3: 2-3'] });
    const after = readFileSync(fleet.configFile, 'utf8');
    expect(after.split('${REBALANCE_TEST_SECRET}').length - 1).toBe(text.split(`:${password}@`).length - 1);
    const reread = await loadConfig(fleet.configFile, { env: { REBALANCE_TEST_SECRET: password } });
    expect(reread.hosts.map((h) => [h.name, h.shardsSpec])).toEqual([
      ['pg1', '0-1'],
      ['pg2', '4-5'],
      ['pg3', '2-3'],
    ]);
    expect((await status(reread)).ok).toBe(true);
  });
});

describe('bad input', () => {
  let fleet: Fleet;
  let urls: string[];

  beforeAll(async () => {
    urls = badDb.urls;
    fleet = fleetOf(urls, badDb.replicationUrls, 4, ['0-3', ''], { pg2: 'drain: true' });
    expect((await init(await fleet.config())).ok).toBe(true);
  });

  it.each([
    [
      ['move-shard', '1', '--to', 'pg2', '--yes'],
      'option --to "pg2": pg2 is draining (drain: true in the map); move shards to a host that is not',
    ],
    [['move-shard', '1', '--to', 'pg9', '--yes'], 'option --to "pg9": no such host in the map (hosts: pg1, pg2)'],
    [['move-shard', '2-9', '--to', 'pg2', '--yes'], 'argument <shards>'],
    [['rebalance', '--by', 'bytes', '--yes'], 'option --by "bytes": expected count, size or load'],
    [['rebalance', '--max-parallel', '0', '--yes'], 'option --max-parallel 0: must be an integer from 1 to 64'],
    [
      ['rebalance', '--max-parallel', 'two', '--yes'],
      'option --max-parallel "two": expected a whole number from 1 to 64',
    ],
    [['rebalance', '--mode', 'fast', '--yes'], 'option --mode "fast": expected online or offline'],
  ])('%j exits 2 naming the argument, and changes nothing', async (args, message) => {
    const before = await fleetState(urls, fleet.configFile);
    const run = await runCli([...args, '-c', fleet.configFile]);
    expect(run.code, run.stderr).toBe(2);
    expect(run.stderr).toContain(message);
    expect(await fleetState(urls, fleet.configFile)).toEqual(before);
  });

  it('a map with a shard list out of range exits 2 naming the field, and changes nothing', async () => {
    const broken = fleet.configFile.replace(/\.yaml$/, '.broken.yaml');
    writeFileSync(broken, readFileSync(fleet.configFile, 'utf8').replace('shards: "0-3"', 'shards: "0-4"'));
    const before = await fleetState(urls, fleet.configFile);
    const run = await runCli(['rebalance', '--yes', '-c', broken]);
    expect(run.code).toBe(2);
    expect(run.stderr).toContain('hosts[0].shards: shard 4 of host "pg1" (hosts[0]) is out of range');
    expect(await fleetState(urls, fleet.configFile)).toEqual(before);
  });

  it('without --yes and without a terminal, shows the plan, refuses (exit 2) and changes nothing', async () => {
    const undrained = fleet.configFile.replace(/\.yaml$/, '.undrained.yaml');
    writeFileSync(undrained, readFileSync(fleet.configFile, 'utf8').replace('drain: true', 'drain: false'));
    const before = await fleetState(urls, undrained);
    const run = await runCli(['rebalance', '-c', undrained]);
    expect(run.code).toBe(2);
    expect(run.stdout).toMatch(/pg1 → pg2 +2-3 +2 /);
    expect(run.stderr).toContain('needs confirmation: pass --yes');
    expect(await fleetState(urls, undrained)).toEqual(before);
  });
});

describe('a rebalance killed in the middle of a move', () => {
  let fleet: Fleet;
  let urls: string[];

  beforeAll(async () => {
    urls = [killA.urls[0]!, killA.urls[1]!, killB.urls[0]!];
    fleet = fleetOf(urls, [...killA.replicationUrls, killB.replicationUrls[0]!], 6, ['0-5', '', '']);
    expect((await init(await fleet.config())).ok).toBe(true);
    await seedAll(await fleet.config());
  });

  it('is finished by running it again: the unfinished move is resumed, the rest of the plan runs, nothing is lost', async () => {
    const before = await fingerprints(await fleet.config());
    const killed = await spawnCli(['rebalance', '--yes', '--max-parallel', '1', '-c', fleet.configFile], {
      SHARDCTL_FAULT_AFTER_STEP: 'fenced',
    });
    expect(killed.signal, killed.stderr).toBe('SIGKILL');
    expect(killed.stderr).toContain('starting pg1 → pg2 (shards 0-1)');
    await waitForMoveSessionsToEnd(urls);
    expect((await fleet.config()).hosts.map((h) => h.shardsSpec)).toEqual(['0-5', '', '']);

    const dry = await runCli(['rebalance', '--dry-run', '-c', fleet.configFile]);
    expect(dry.code, dry.stderr).toBe(0);
    expect(dry.stdout).toMatch(
      /^unfinished moves, finished first:\n {2}pg1 → pg2: shards 0-1 \(move \S+, after step fenced\)\n/,
    );
    // Planned from the map as the unfinished move will leave it: only pg1 → pg3 is left.
    expect(dry.stdout).toMatch(/rebalance by count: 1 move, 2 shards/);

    const rerun = await runCli(['rebalance', '--yes', '-c', fleet.configFile]);
    expect(rerun.code, rerun.stderr).toBe(0);
    expect(rerun.stderr).toContain('finishing 1 unfinished move first: pg1 → pg2 (shards 0-1) after step fenced');
    const config = await fleet.config();
    expect(shardCounts(config)).toEqual({ pg1: 2, pg2: 2, pg3: 2 });
    expect(config.hosts.map((h) => h.shardsSpec)).toEqual(['4-5', '0-1', '2-3']);
    expect(await fingerprints(config)).toEqual(before);
    expect((await status(config)).ok).toBe(true);
    expect(await replicationObjects(urls)).toEqual([]);
  });

  it('aborts a move whose abort was cut off, instead of resuming it', async () => {
    const shard = (await fleet.config()).hosts[0]!.shards[0]!;
    const before = await fingerprints(await fleet.config());
    const move = ['move-shard', String(shard), '--to', 'pg2', '--yes', '-c', fleet.configFile];
    expect((await spawnCli(move, { SHARDCTL_FAULT_AFTER_STEP: 'fenced' })).signal).toBe('SIGKILL');
    const cut = await spawnCli(['move-shard', String(shard), '--abort', '--yes', '-c', fleet.configFile], {
      SHARDCTL_FAULT_AFTER_STEP: 'first-undo',
    });
    expect(cut.signal, cut.stderr).toBe('SIGKILL');
    await waitForMoveSessionsToEnd(urls);

    const { moveId } = (await withClient(urls[0]!, (c) => lastMove(c, shard)))!;
    const dry = await runCli(['rebalance', '--dry-run', '-c', fleet.configFile]);
    expect(dry.code, dry.stderr).toBe(0);
    expect(dry.stdout).toContain(
      `pg1 → pg2: shard ${shard} (move ${moveId}, after step fenced; its abort was cut off: aborted, not resumed, the shards stay on pg1)`,
    );
    const rerun = await runCli(['rebalance', '--yes', '-c', fleet.configFile]);
    expect(rerun.code, rerun.stderr).toBe(0);
    expect(rerun.stderr).toContain(
      `finishing 1 unfinished move first: pg1 → pg2 (shard ${shard}) after step fenced (its abort was cut off: aborted, not resumed)`,
    );
    // Aborted on both hosts (the rebalance may have moved the shard since, by a move of its own).
    for (const url of urls.slice(0, 2)) {
      const row = await withClient(url, (c) =>
        c.query<{ status: string }>(`select status from shardctl.moves where move_id = $1`, [moveId]),
      );
      expect(row.rows, url).toEqual([{ status: 'aborted' }]);
    }
    const config = await fleet.config();
    expect(await fingerprints(config)).toEqual(before);
    expect((await status(config)).ok).toBe(true);
    expect(await replicationObjects(urls)).toEqual([]);
  });
});

describe('rebalance --dry-run, a planned move whose preflight would fail', () => {
  const db = useTestDatabases(2);

  it('says what the real run would refuse (a role missing on the target), exit 1, nothing changed', async () => {
    const role = `rb_app_${randomBytes(4).toString('hex')}`;
    const fleet = makeFleet({ urls: db.urls, shards: 4, split: ['0-3', ''] });
    expect((await init(await fleet.config())).ok).toBe(true);
    // A role of pg1's cluster only (roles are per cluster), named by the shards' grants.
    await withClient(db.urls[0]!, (c) =>
      c.query(`create role ${role}; grant usage on schema insta0, insta1, insta2, insta3 to ${role}`),
    );
    try {
      const before = readFileSync(fleet.configFile, 'utf8');
      const dry = await runCli(['rebalance', '--dry-run', '-c', fleet.configFile]);
      expect(dry.code, dry.stderr).toBe(1);
      expect(dry.stderr).toContain("the real run would refuse: a planned move's preflight fails");
      expect(dry.stderr).toMatch(
        new RegExp(`pg1 → pg2: roles on target: role ${role} \\(named by .*\\) does not exist on pg2`),
      );
      expect(dry.stderr).not.toContain('next:');
      const json = await runCli(['rebalance', '--dry-run', '--json', '-c', fleet.configFile]);
      expect(json.code).toBe(1);
      expect((JSON.parse(json.stdout) as { refused: { code: string; hosts: string[] } }).refused).toMatchObject({
        code: 'PREFLIGHT_FAILED',
        hosts: ['pg2'],
      });
      expect(readFileSync(fleet.configFile, 'utf8')).toBe(before);
      expect((await fleet.config()).hosts.map((h) => h.shardsSpec)).toEqual(['0-3', '']);
    } finally {
      await withClient(db.urls[0]!, (c) =>
        c.query(`revoke usage on schema insta0, insta1, insta2, insta3 from ${role}; drop role ${role}`),
      );
    }
  });
});
