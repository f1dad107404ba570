import { afterAll, describe, expect, it } from 'vitest';
import { ShardMap } from '../../src/config/shard-map.js';
import { runCli } from '../helpers/fleet.js';
import { move } from '../helpers/faults.js';
import {
  chunkRecords,
  insertPhotos,
  removeCliSnapshot,
  seededFleet,
  startCli,
  startShardWriter,
} from '../helpers/moves.js';
import { useTestDatabases, withClient } from '../helpers/hosts.js';
import { waitFor } from '../helpers/migrations.js';

const db = useTestDatabases(2);
afterAll(removeCliSnapshot);

/**
 * A resumed copy under several writers at once, each changing rows all over the key range (in
 * chunks already copied, in the chunk being copied, in chunks not copied yet) while a run copies,
 * while no run is alive, and after the switch. The target must end with exactly what the writers
 * were told was committed: the test keeps its own model of the table and compares every row.
 */

/** 90,000 photos rows of ~150 bytes, copied in chunks of 9,000 rows: about 10 chunks. */
const ROWS = 90_000;
const CHUNK = '9000';
const TABLE = '"insta1"."photos"';

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** Every third id from `offset`, in an order that jumps over the whole key range (7919 is prime to their count). */
function spread(ids: readonly string[], offset: number): string[] {
  const part = ids.filter((_, k) => k % 3 === offset);
  return part.map((_, k) => part[(k * 7919) % part.length]!);
}

/** Every photos row of shard 1 on the host at `url`, by id, as the model writes it: `user_id|image_url|caption`. */
async function photoRows(url: string): Promise<{ id: string; row: string }[]> {
  return withClient(
    url,
    async (c) =>
      (
        await c.query<{ id: string; row: string }>(
          `select id::text as id, concat_ws('|', user_id, image_url, coalesce(caption, '')) as row from insta1.photos order by id`,
        )
      ).rows,
  );
}

async function copiedChunks(): Promise<number> {
  return (await chunkRecords(db.urls[1]!, TABLE)).filter((c) => c.copied).length;
}

describe('a resumed copy under several writers', () => {
  it('writers inserting, updating, deleting and changing keys through a move killed twice in its copy: the target holds exactly the acknowledged changes', async () => {
    const { fleet } = await seededFleet(db.urls, 1, 0);
    await insertPhotos(db.urls[0]!, 1, ROWS, 100);
    const seeded = await photoRows(db.urls[0]!);
    const ids = seeded.map((r) => r.id);
    const toUpdate = spread(ids, 1);
    const toDelete = spread(ids, 2);
    // Half of the rows no other writer touches get a new key, -id: each row leaves its chunk for the
    // first one (below every id), from a chunk copied or not yet copied into one copied early.
    const toRekey = spread(ids, 0).filter((_, k) => k % 2 === 0);

    const inserter = startShardWriter(await ShardMap.load(fleet.configFile), 1);
    // Cyclic: once every row of its part is deleted, a delete finds nothing and is not acknowledged.
    const updater = startShardWriter(
      await ShardMap.load(fleet.configFile),
      1,
      (i) =>
        `update insta1.photos set caption = 'u${i}' where id = ${toUpdate[(i - 1) % toUpdate.length]} returning id`,
    );
    const deleter = startShardWriter(
      await ShardMap.load(fleet.configFile),
      1,
      (i) => `delete from insta1.photos where id = ${toDelete[(i - 1) % toDelete.length]} returning id`,
    );
    // Not cyclic either: a row given a new key is not found by its old one again.
    const rekeyer = startShardWriter(
      await ShardMap.load(fleet.configFile),
      1,
      (i) => `update insta1.photos set id = -id where id = ${toRekey[(i - 1) % toRekey.length]} returning id`,
    );
    const writers = [inserter, updater, deleter, rekeyer];
    await waitFor('writes', async () => writers.every((w) => w.acknowledged.length > 10));

    // Two copying pairs held to about 3 MB/s: a chunk takes about half a second.
    const slowly = ['--copy-chunk-rows', CHUNK, '--copy-parallel', '2', '--max-rate', '3000000'];
    const first = await startCli(move(fleet, 1, '--to', 'pg2', ...slowly));
    await waitFor('two chunks copied', async () => (await copiedChunks()) >= 2);
    first.child.kill('SIGKILL');
    expect((await first.done).signal).toBe('SIGKILL');
    const afterFirst = await copiedChunks();
    // The writers go on while no run is alive: rows of copied chunks change on the source alone.
    await sleep(1000);

    const second = await startCli(move(fleet, 1, '--resume', ...slowly));
    await waitFor('two more chunks copied by the resumed run', async () => (await copiedChunks()) >= afterFirst + 2);
    second.child.kill('SIGKILL');
    expect((await second.done).signal).toBe('SIGKILL');
    const afterSecond = await copiedChunks();
    expect(afterSecond).toBeLessThan((await chunkRecords(db.urls[1]!, TABLE)).length);
    await sleep(1000);

    const last = await runCli(move(fleet, 1, '--resume', '--copy-chunk-rows', CHUNK, '--copy-parallel', '2'));
    expect(last.code, last.stderr).toBe(0);
    await waitFor('the inserter and the updater acknowledged on the target', async () =>
      [inserter, updater].every((w) => w.acknowledged.some((a) => a.host === 'pg2')),
    );
    await sleep(300);
    for (const w of writers) await w.stop();
    for (const w of [inserter, updater]) expect(w.acknowledged.some((a) => a.host === 'pg1')).toBe(true);
    expect(deleter.acknowledged.length).toBeGreaterThan(100);
    expect(rekeyer.acknowledged.length).toBeGreaterThan(100);

    // The model: the seeded rows, the inserted ones, each updated row's last acknowledged caption,
    // less the deleted rows. A statement that failed (at the fence) was rolled back, so it is not in it.
    const expected = new Map(seeded.map((r) => [r.id, r.row]));
    for (const a of inserter.acknowledged) expected.set(String(a.id), '1|w|');
    const lastUpdate = new Map<string, number>();
    for (const a of updater.acknowledged)
      lastUpdate.set(String(a.id), Math.max(lastUpdate.get(String(a.id)) ?? 0, a.i));
    for (const [id, i] of lastUpdate) expected.set(id, expected.get(id)!.replace(/\|$/, `|u${i}`));
    for (const a of deleter.acknowledged) expected.delete(String(a.id));
    for (const a of rekeyer.acknowledged) {
      expected.set(String(a.id), expected.get(String(-a.id))!);
      expected.delete(String(-a.id));
    }

    const onTarget = await photoRows(db.urls[1]!);
    const actual = new Map(onTarget.map((r) => [r.id, r.row]));
    const wrong = [
      ...[...expected]
        .filter(([id, row]) => actual.get(id) !== row)
        .map(([id, row]) => `${id}: want ${row}, have ${actual.get(id)}`),
      ...[...actual].filter(([id]) => !expected.has(id)).map(([id, row]) => `${id}: not wanted, have ${row}`),
    ];
    expect(wrong.slice(0, 20)).toEqual([]);
    expect(actual.size).toBe(expected.size);
  });
});
