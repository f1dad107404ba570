/**
 * Batched moves: `move-shard <shards> --to <host>` moves each source host's shards in one move,
 * the sources in parallel, cut over in waves; killed after any step it is finished or undone.
 * Three hosts: pg1 and pg3 are two databases on the first server, pg2 is on the second.
 */
import { readFileSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { init, moveShards, ShardMap, status } from '../../src/index.js';
import { ONLINE_STEPS } from '../../src/moves/state.js';
import { type Fleet, makeFleet, runCli } from '../helpers/fleet.js';
import { useTestDatabases, withClient } from '../helpers/hosts.js';
import {
  fleetState,
  removeCliSnapshot,
  replicationObjects,
  spawnCli,
  startShardWriter,
  waitForMoveSessionsToEnd,
} from '../helpers/moves.js';

/** Databases for three hosts (registered in the calling describe): pg1, pg2, pg3. */
function threeHosts() {
  const pair = useTestDatabases(2);
  const third = useTestDatabases(1);
  const urls = (): string[] => [pair.urls[0]!, pair.urls[1]!, third.urls[0]!];
  return {
    urls,
    fleet: (shards: number, split: [string, string, string]): Fleet => makeFleet({ urls: urls(), shards, split }),
  };
}

afterAll(async () => {
  await removeCliSnapshot();
});

describe('a batch of shards from two source hosts', () => {
  const { urls, fleet: threeHostFleet } = threeHosts();

  it('moves online in parallel and in waves under a write load: every committed row arrives, the old copies accept nothing after the fence', async () => {
    const fleet = threeHostFleet(12, ['0-3', '8-11', '4-7']);
    const config = await fleet.config();
    expect((await init(config)).ok).toBe(true);
    for (const [url, shards] of [
      [urls()[0]!, [0, 1, 2]],
      [urls()[2]!, [4, 5, 6]],
    ] as const) {
      await withClient(url, async (c) => {
        for (const s of shards)
          await c.query(
            `insert into insta${s}.photos (user_id, image_url) select g, 'seed' from generate_series(1, 300) g`,
          );
      });
    }
    const map = await ShardMap.load(fleet.configFile);
    const writers = [startShardWriter(map, 1), startShardWriter(map, 5)];
    await new Promise((resolve) => setTimeout(resolve, 200));
    const notices: string[] = [];
    const result = await moveShards(config, [0, 1, 2, 4, 5, 6], 'pg2', {
      configFile: fleet.configFile,
      wave: { maxShards: 2 },
      onNotice: (m) => notices.push(m),
    });
    await new Promise((resolve) => setTimeout(resolve, 200));
    for (const w of writers) await w.stop();

    expect(result.outcome).toBe('moved');
    expect(result.moves.map((m) => [m.source, m.shards, m.waves])).toEqual([
      ['pg1', [0, 1, 2], [[0, 1], [2]]],
      ['pg3', [4, 5, 6], [[4, 5], [6]]],
    ]);
    expect(result.writeBlockedMs).not.toBeNull();
    // Every seeded row and every acknowledged write is on the target; ids on the target only grow.
    for (const [writer, shard, source] of [
      [writers[0]!, 1, urls()[0]!],
      [writers[1]!, 5, urls()[2]!],
    ] as const) {
      const before = writer.acknowledged.filter((a) => a.host !== 'pg2');
      const after = writer.acknowledged.filter((a) => a.host === 'pg2');
      expect(before.length).toBeGreaterThan(0);
      await withClient(urls()[1]!, async (c) => {
        const ids = new Set(
          (await c.query<{ id: string }>(`select id from insta${shard}.photos`)).rows.map((r) => BigInt(r.id)),
        );
        expect(before.filter((a) => !ids.has(a.id))).toEqual([]);
        expect(ids.size).toBe(300 + before.length + after.length);
        const maxMoved = before.reduce((m, a) => (a.id > m ? a.id : m), 0n);
        expect(after.every((a) => a.id > maxMoved)).toBe(true);
      });
      // The old copy holds exactly what it acknowledged before the fence.
      await withClient(source, async (c) => {
        const old = (
          await c.query<{ nspname: string }>(`select nspname from pg_namespace where nspname like $1`, [
            `insta${shard}\\_moved\\_%`,
          ])
        ).rows[0]!.nspname;
        const n = await c.query<{ n: string }>(`select count(*) as n from "${old}".photos`);
        expect(Number(n.rows[0]!.n)).toBe(300 + before.length);
      });
    }
    expect(BigInt(result.rowsMoved)).toBeGreaterThanOrEqual(6n * 300n);
    const text = readFileSync(fleet.configFile, 'utf8');
    expect(text).toMatch(/name: pg1\n(?: {4}(?!shards:).*\n)*\s+shards: "3"/);
    expect(text).toMatch(/name: pg3\n(?: {4}(?!shards:).*\n)*\s+shards: "7"/);
    expect(text).toMatch(/name: pg2\n(?: {4}(?!shards:).*\n)*\s+shards: "0-2,4-6,8-11"/);
    const report = await status(await fleet.config());
    expect(report.hosts.map((h) => [h.host, h.moves, h.leftovers, h.missing])).toEqual([
      ['pg1', [], [], []],
      ['pg2', [], [], []],
      ['pg3', [], [], []],
    ]);
    expect(await replicationObjects(urls())).toEqual([]);
  });
});

describe('a batch that is only planned or refused', () => {
  const { urls, fleet: threeHostFleet } = threeHosts();
  let fleet: Fleet;

  beforeAll(async () => {
    fleet = threeHostFleet(6, ['0-1', '2-3', '4-5']);
    expect((await init(await fleet.config())).ok).toBe(true);
  });

  it('--dry-run prints each source host’s move with its preflight and waves, exit 0, and changes nothing', async () => {
    const before = await fleetState(urls(), fleet.configFile);
    const run = await runCli([
      'move-shard',
      '0-1,4-5',
      '--to',
      'pg2',
      '--dry-run',
      '--wave-size',
      '1',
      '-c',
      fleet.configFile,
    ]);
    expect(run.code, run.stderr).toBe(0);
    expect(run.stdout).toContain('move of shards 0-1 from pg1 to pg2 (online) — dry run, nothing changed');
    expect(run.stdout).toContain('move of shards 4-5 from pg3 to pg2 (online) — dry run, nothing changed');
    expect(run.stdout).toContain('  cut-over in 2 waves: 0 | 1');
    expect(run.stdout).not.toContain('FAIL');
    expect(await fleetState(urls(), fleet.configFile)).toEqual(before);
  });

  it.each([
    { args: ['0-1', '--to', 'pg9'], message: 'option --to "pg9": no such host in the map (hosts: pg1, pg2, pg3)' },
    { args: ['0-9', '--to', 'pg2'], message: 'argument <shards> "0-9": shard 6 is out of range 0-5' },
    {
      args: ['1-3', '--to', 'pg2'],
      message: 'argument <shards> "1-3": shards 2-3 are already on pg2; nothing to move',
    },
    { args: ['x', '--to', 'pg2'], message: 'argument <shards> "x": ' },
    {
      args: ['1', '--to', 'pg2', '--wave-size', '0'],
      message: 'option --wave-size "0": expected a whole number from 1 to 999999',
    },
    {
      args: ['1', '--abort', '--drop-source'],
      message:
        'option --drop-source: with --abort the source copy is kept (the shards stay there); give no --drop-source',
    },
    {
      args: ['1', '--to', 'pg2', '--mode', 'offline', '--copy-parallel', '2'],
      message:
        'option --copy-parallel "2": only for an online move; an offline move fences each shard and copies it whole',
    },
    {
      args: ['1', '--to', 'pg2', '--mode', 'offline', '--wave-size', '8'],
      message: 'option --wave-size "8": only for an online move',
    },
  ])(
    'refuses $args with exit 2 and changes nothing, with --yes and without (named before the question)',
    async ({ args, message }) => {
      const before = await fleetState(urls(), fleet.configFile);
      for (const yes of [['--yes'], []]) {
        const run = await runCli(['move-shard', ...args, ...yes, '-c', fleet.configFile]);
        expect(run.code).toBe(2);
        expect(run.stderr).toContain(message);
        expect(run.stderr).not.toContain('needs confirmation');
      }
      expect(await fleetState(urls(), fleet.configFile)).toEqual(before);
    },
  );
});

describe('a batch killed after a step', () => {
  const { urls, fleet: threeHostFleet } = threeHosts();
  let fleet: Fleet;

  beforeAll(async () => {
    // Two shards per case, cut over in two waves of one.
    fleet = threeHostFleet(48, ['0-43', '44-47', '']);
    expect((await init(await fleet.config())).ok).toBe(true);
    await withClient(urls()[0]!, async (c) => {
      for (let s = 0; s < 44; s++)
        await c.query(
          `insert into insta${s}.photos (user_id, image_url) select g, 'seed' from generate_series(1, 50) g`,
        );
    });
  });

  const steps = ONLINE_STEPS.slice(0, -1);
  const cases = steps.flatMap((step, i) => [
    { step, action: '--resume' as const, shards: `${4 * i},${4 * i + 1}` },
    { step, action: '--abort' as const, shards: `${4 * i + 2},${4 * i + 3}` },
  ]);

  it.each(cases)('after $step, $action finishes or undoes it (shards $shards)', async ({ step, action, shards }) => {
    const [a, b] = shards.split(',').map(Number) as [number, number];
    const run = await spawnCli(
      ['move-shard', shards, '--to', 'pg2', '--wave-size', '1', '--yes', '-c', fleet.configFile],
      { SHARDCTL_FAULT_AFTER_STEP: step },
    );
    expect(run.signal, run.stderr).toBe('SIGKILL');
    // Each session runs its queries one at a time (src/pg/serial.ts): node-postgres warns on stderr
    // about queries queued on a busy client, and pg 9 refuses them.
    expect(run.stderr).not.toContain('Warning');
    await waitForMoveSessionsToEnd(urls());
    const next = await runCli(['move-shard', shards, action, '--yes', '-c', fleet.configFile]);
    expect(next.stderr).not.toContain('Warning');
    const onTarget = async (shard: number): Promise<number | null> =>
      withClient(urls()[1]!, async (c) =>
        (await c.query(`select 1 from pg_namespace where nspname = $1`, [`insta${shard}`])).rowCount
          ? Number((await c.query<{ n: string }>(`select count(*) as n from insta${shard}.photos`)).rows[0]!.n)
          : null,
      );
    if (action === '--resume') {
      expect(next.code, next.stderr).toBe(0);
      expect([await onTarget(a), await onTarget(b)]).toEqual([50, 50]);
    } else if (step === 'switched') {
      // The first wave is live on the target: undoing would leave two writable copies.
      expect(next.code).toBe(1);
      expect(next.stderr).toContain(`already switched shard ${a} to pg2; it cannot be aborted. Resume it to finish it`);
      expect(next.stderr).toContain(`\nnext: shardctl move-shard ${a}-${b} --resume\n`);
      const resumed = await runCli(['move-shard', shards, '--resume', '--yes', '-c', fleet.configFile]);
      expect(resumed.code, resumed.stderr).toBe(0);
      expect([await onTarget(a), await onTarget(b)]).toEqual([50, 50]);
    } else {
      expect(next.code, next.stderr).toBe(0);
      expect([await onTarget(a), await onTarget(b)]).toEqual([null, null]);
      // The sources are writable again.
      await withClient(urls()[0]!, (c) =>
        c.query(`insert into insta${a}.photos (user_id, image_url) values (1, 'after abort')`),
      );
    }
    const moves = (await status(await fleet.config())).hosts.flatMap((h) => [...h.moves, ...h.leftovers]);
    expect(moves).toEqual([]);
  });
});
