import { execFile } from 'node:child_process';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { beforeAll, describe, expect, it } from 'vitest';
import { ShardMap } from '../../src/config/shard-map.js';
import { runCli, type Fleet } from '../helpers/fleet.js';
import { move } from '../helpers/faults.js';
import { fleetState, replicationObjects, seededFleet, startShardWriter } from '../helpers/moves.js';
import { useTestDatabases, withClient } from '../helpers/hosts.js';
import { waitFor } from '../helpers/migrations.js';

/** Rows of a photos table of about 8 MB of COPY stream: enough for several seconds at a low --max-rate. */
const ROWS = 60_000;

async function bigShard(urls: readonly string[]): Promise<Fleet> {
  const { fleet } = await seededFleet(urls, 1, 0);
  await withClient(urls[0]!, (c) =>
    c.query(
      `insert into insta1.photos (user_id, image_url) select g, repeat('p', 100) || g from generate_series(1, ${ROWS}) g;
       analyze insta1.photos`,
    ),
  );
  return fleet;
}

interface CopyEvent {
  event: string;
  kind: 'copy';
  bytes: number;
  totalBytes: number;
  rows: number;
  totalRows: number;
  bytesPerSecond: number | null;
  etaMs: number | null;
  elapsedMs: number;
  done: boolean;
  run: { bytes: number; totalBytes: number; etaMs: number | null };
}

/** The move-progress events a --json run wrote on stderr, one JSON object a line. */
function progressEvents(stderr: string): CopyEvent[] {
  return stderr
    .split('\n')
    .filter((l) => l.startsWith('{'))
    .map((l) => JSON.parse(l) as CopyEvent)
    .filter((e) => e.event === 'move-progress' && e.kind === 'copy');
}

async function rows(url: string): Promise<string[]> {
  return withClient(url, async (c) =>
    (await c.query<{ r: string }>(`select (p.*)::text as r from insta1.photos p order by id`)).rows.map((r) => r.r),
  );
}

/** Each case on databases of its own (a move changes the fleet), the shard seeded before it. */
function withBigShard(): { db: ReturnType<typeof useTestDatabases>; fleet: () => Fleet } {
  const db = useTestDatabases(2);
  let fleet: Fleet | undefined;
  beforeAll(async () => {
    fleet = await bigShard(db.urls);
  });
  return { db, fleet: () => fleet! };
}

describe('a move copy under --json', () => {
  const { db, fleet: made } = withBigShard();

  it('--json: copy events with monotonic bytes, an ETA and the run totals; --max-rate holds the rate within 20%; the dry run then estimates at the measured rate', async () => {
    const fleet = made();
    const dryBefore = await runCli(move(fleet, 1, '--to', 'pg2', '--dry-run'));
    expect(dryBefore.code, dryBefore.stderr).toBe(0);
    expect(dryBefore.stdout).toMatch(/ {2}copy: [\d.]+ MB, ~60,000 rows; about \d+ s at 50\.0 MB\/s \(a default: /);
    expect(dryBefore.stdout).toMatch(/ {4}shard 1: [\d.]+ MB, ~60,000 rows, about \d+ s\n/);

    const maxRate = 2 * 1024 * 1024;
    const run = await runCli(move(fleet, 1, '--to', 'pg2', '--json', '--max-rate', '2MB'));
    expect(run.code, run.stderr).toBe(0);
    const events = progressEvents(run.stderr);
    expect(events.length).toBeGreaterThan(4);
    for (let i = 1; i < events.length; i++) expect(events[i]!.bytes).toBeGreaterThanOrEqual(events[i - 1]!.bytes);
    const last = events.at(-1)!;
    expect(last).toMatchObject({ done: true, etaMs: 0, rows: ROWS, totalRows: ROWS });
    expect(last.bytes).toBe(last.totalBytes);
    expect(last.bytes).toBeGreaterThan(6 * 1024 * 1024);
    // While it copied: an ETA from a measured rate, and the run's figures (one move: the same).
    const middle = events.filter((e) => e.etaMs !== null && e.bytes > 0 && e.bytes < e.totalBytes);
    expect(middle.length).toBeGreaterThan(2);
    for (const e of middle) {
      expect(e.etaMs).toBeGreaterThan(0);
      expect(e.bytes).toBeLessThanOrEqual(e.totalBytes);
      expect(e.run).toMatchObject({ bytes: e.bytes, totalBytes: e.totalBytes });
    }
    const rate = last.bytes / (last.elapsedMs / 1000);
    expect(rate).toBeGreaterThan(maxRate * 0.8);
    expect(rate).toBeLessThan(maxRate * 1.2);
    expect(await rows(db.urls[1]!)).toHaveLength(ROWS);

    // The next dry run (the shard back on pg1 needs no move: a shard of pg2 is asked about) uses that rate.
    const dryAfter = await runCli(move(fleet, 1, '--to', 'pg1', '--dry-run'));
    expect(dryAfter.stdout).toMatch(
      /at (1\.[6-9]|2\.[0-3]) MB\/s \(the rate the last copy recorded on these hosts reached\)/,
    );
  });
});

describe('a move copy on a terminal', () => {
  const { fleet: made } = withBigShard();

  it('draws a bar', async () => {
    const fleet = made();
    const command = [
      process.execPath,
      join(import.meta.dirname, '..', '..', 'bin', 'shardctl.js'),
      ...move(fleet, 1, '--to', 'pg2', '--max-rate', '4MB'),
    ]
      .map((a) => `'${a.replaceAll("'", "'\\''")}'`)
      .join(' ');
    // `script` runs the command on a pseudo-terminal and copies what it wrote.
    const { stdout } = await promisify(execFile)('script', ['-qec', command, '/dev/null'], {
      env: { ...process.env, TERM: 'xterm' },
    });
    expect(stdout).toMatch(/pg1 → pg2 \[[█░]+\] \d+% [\d.]+ [kM]?B of ~[\d.]+ MB, [\d,]+ of ~60,000 rows/);
    expect(stdout).toMatch(/\[█{40}\] 100%/);
    expect(stdout).toContain('shard 1 moved from pg1 to pg2');
  });
});

describe('the WAL guard', () => {
  const { db, fleet: made } = withBigShard();

  it('--max-slot-wal: the copy stops once the slot holds more WAL than the bound, the slot is dropped, --resume finishes it', async () => {
    const fleet = made();
    const map = await ShardMap.load(fleet.configFile);
    const writer = startShardWriter(map, 1);
    await waitFor('writes', async () => writer.acknowledged.length > 10);
    const stopped = await runCli(move(fleet, 1, '--to', 'pg2', '--max-rate', '1MB', '--max-slot-wal', '64kB'));
    expect(stopped.code).toBe(1);
    expect(stopped.stderr).toMatch(
      /replication slot \S+ holds [\d.]+ [kM]B of WAL, more than the bound of 64\.0 kB: the copy stopped and the slot was dropped/,
    );
    expect(stopped.stderr).toContain('next: shardctl move-shard 1 --resume, or shardctl move-shard 1 --abort');
    expect((await replicationObjects(db.urls)).filter((o) => o.includes(': slot '))).toEqual([]);
    const resumed = await runCli(move(fleet, 1, '--resume'));
    expect(resumed.code, resumed.stderr).toBe(0);
    await waitFor('writes on the target', async () => writer.acknowledged.some((a) => a.host === 'pg2'));
    await writer.stop();
    const ids = await withClient(db.urls[1]!, async (c) =>
      (await c.query<{ id: string }>('select id from insta1.photos')).rows.map((r) => BigInt(r.id)),
    );
    const present = new Set(ids);
    expect(writer.acknowledged.filter((a) => !present.has(a.id))).toEqual([]);
    expect(ids.length).toBe(ROWS + writer.acknowledged.length);
  });
});

describe('the copy options', () => {
  const { db, fleet: made } = withBigShard();

  it.each([
    ['--max-rate', 'fast'],
    ['--max-rate', '0'],
    ['--max-slot-wal', '-5MB'],
    ['--copy-parallel', '0'],
    ['--copy-parallel', '65'],
    ['--copy-chunk-rows', '1e6'],
  ])('%s %s is refused: exit 2 naming the option, nothing changed', async (option, value) => {
    const fleet = made();
    const before = await fleetState(db.urls, fleet.configFile);
    const run = await runCli(move(fleet, 1, '--to', 'pg2', option, value));
    expect(run.code).toBe(2);
    expect(run.stderr).toContain(`option ${option} ${JSON.stringify(value)}: expected a`);
    expect(await fleetState(db.urls, fleet.configFile)).toEqual(before);
  });
});
