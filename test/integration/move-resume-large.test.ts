/**
 * A shard of about 200 MB, moved under a writer and killed twice in its copy: once right after a
 * chunk committed, once in the middle of a chunk's COPY. Each resumed run copies only the chunks not
 * copied yet (the chunks' records and the bytes copied say so), the rows are equal on both hosts
 * by a full comparison, and the target holds no dead row and no more heap than the source.
 */
import { afterAll, describe, expect, it } from 'vitest';
import type { MoveResult } from '../../src/index.js';
import { ShardMap } from '../../src/config/shard-map.js';
import { runCli } from '../helpers/fleet.js';
import { move } from '../helpers/faults.js';
import {
  chunkRecords,
  insertPhotos,
  removeCliSnapshot,
  seededFleet,
  spawnCli,
  startCli,
  startShardWriter,
} from '../helpers/moves.js';
import { useTestDatabases, withClient } from '../helpers/hosts.js';
import { waitFor } from '../helpers/migrations.js';

const db = useTestDatabases(2);
afterAll(removeCliSnapshot);

/** 800,000 rows of about 250 bytes: about 200 MB of heap, copied in 8 chunks of 100,000 rows. */
const ROWS = 800_000;
const CHUNK = '100000';
const PHOTOS = '"insta1"."photos"';

/** One query's single value on a host. */
async function value(url: string, sql: string, params: unknown[] = []): Promise<string> {
  return withClient(url, async (c) => (await c.query<{ v: string }>(sql, params)).rows[0]!.v);
}

/** Rows, and a digest of every row in id order (computed on the server: the rows stay there). */
async function digest(url: string, table: string, exceptIds: readonly string[]): Promise<string> {
  return value(
    url,
    `select count(*)::text || ' ' || md5(coalesce(string_agg(p::text, E'\\n' order by id), '')) as v
       from ${table} p where not (id::text = any($1::text[]))`,
    [exceptIds],
  );
}

describe('a copy of a few hundred MB that resumes', () => {
  it('killed after a chunk and in the middle of one: each resume copies only what is left; rows equal by a full comparison, no dead rows, no extra heap', async () => {
    const { fleet } = await seededFleet(db.urls, 1, 0);
    await insertPhotos(db.urls[0]!, 1, ROWS, 200);
    const heap = Number(await value(db.urls[0]!, `select pg_relation_size('insta1.photos')::text as v`));
    expect(heap).toBeGreaterThan(180_000_000);
    const writer = startShardWriter(await ShardMap.load(fleet.configFile), 1);
    await waitFor('writes', async () => writer.acknowledged.length > 10);

    // Killed right after its second chunk committed.
    const args = ['--copy-chunk-rows', CHUNK, '--copy-parallel', '1'];
    const first = await spawnCli(move(fleet, 1, '--to', 'pg2', ...args), { SHARDCTL_FAULT_AFTER_CHUNKS: '2' });
    expect(first.signal, first.stderr).toBe('SIGKILL');
    const afterFirst = await chunkRecords(db.urls[1]!, PHOTOS);
    expect(afterFirst.length).toBeGreaterThanOrEqual(8);
    expect(afterFirst.filter((c) => c.copied).map((c) => c.chunk)).toEqual([0, 1]);

    // Resumed, and killed in the middle of a chunk's COPY (its attempt recorded, not committed).
    const second = await startCli(move(fleet, 1, '--resume', ...args));
    await waitFor(
      'another chunk copied and the next one half loaded',
      async () => {
        const copied = (await chunkRecords(db.urls[1]!, PHOTOS)).filter((c) => c.copied).length;
        const loading = Number(
          await value(
            db.urls[1]!,
            `select coalesce(max(tuples_processed), 0)::text as v from pg_stat_progress_copy where command = 'COPY FROM'`,
          ),
        );
        return copied >= 3 && loading > 30_000;
      },
      120_000,
      5,
    );
    second.child.kill('SIGKILL');
    expect((await second.done).signal).toBe('SIGKILL');
    const afterSecond = await chunkRecords(db.urls[1]!, PHOTOS);
    expect(afterSecond.map((c) => c.chunk)).toEqual(afterFirst.map((c) => c.chunk));
    const copiedBefore = afterSecond.filter((c) => c.copied).length;
    expect(copiedBefore).toBeGreaterThanOrEqual(3);
    expect(afterSecond.some((c) => c.attempted && !c.copied)).toBe(true);

    // The last run copies the chunks left, and no chunk copied before.
    const last = await runCli(move(fleet, 1, '--resume', '--json', ...args));
    expect(last.code, last.stderr).toBe(0);
    const result = JSON.parse(last.stdout) as MoveResult;
    expect(result.chunks).toMatchObject({ copied: afterFirst.length - copiedBefore, recopied: 0 });
    expect(result.chunks.fromLog + result.chunks.compared).toBe(copiedBefore);
    const copiedBytes = last.stderr
      .split('\n')
      .filter((l) => l.startsWith('{'))
      .map((l) => JSON.parse(l) as { kind: string; bytes: number; done: boolean })
      .filter((e) => e.kind === 'copy')
      .at(-1)!;
    expect(copiedBytes.done).toBe(true);
    const left = (afterFirst.length - copiedBefore) / afterFirst.length;
    expect(copiedBytes.bytes).toBeLessThan(heap * (left + 0.1));
    expect(copiedBytes.bytes).toBeGreaterThan(heap * (left - 0.2));

    await waitFor('writes on the target', async () => writer.acknowledged.some((a) => a.host === 'pg2'));
    await writer.stop();
    const onTarget = writer.acknowledged.filter((a) => a.host === 'pg2').map((a) => a.id.toString());
    const oldName = await value(
      db.urls[0]!,
      `select nspname as v from pg_namespace where nspname like 'insta1\\_moved\\_%'`,
    );
    const source = await digest(db.urls[0]!, `"${oldName}".photos`, []);
    expect(source.split(' ')[0]).toBe(String(ROWS + writer.acknowledged.filter((a) => a.host === 'pg1').length));
    expect(await digest(db.urls[1]!, 'insta1.photos', onTarget)).toBe(source);
    // Every row acknowledged is there.
    const missing = await value(
      db.urls[1]!,
      `select count(*)::text as v from unnest($1::bigint[]) a(id) where not exists (select from insta1.photos p where p.id = a.id)`,
      [writer.acknowledged.map((a) => a.id.toString())],
    );
    expect(missing).toBe('0');

    // The cut-off chunk's rows were vacuumed, and its space given back or reused.
    await withClient(db.urls[1]!, (c) => c.query('select pg_stat_force_next_flush()'));
    expect(
      await value(
        db.urls[1]!,
        `select n_dead_tup::text as v from pg_stat_user_tables where schemaname = 'insta1' and relname = 'photos'`,
      ),
    ).toBe('0');
    const targetHeap = Number(await value(db.urls[1]!, `select pg_relation_size('insta1.photos')::text as v`));
    expect(targetHeap).toBeLessThanOrEqual(heap * 1.05);
  });
});
