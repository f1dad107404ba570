import { afterAll, describe, expect, it } from 'vitest';
import type { MoveResult } from '../../src/index.js';
import { ShardMap } from '../../src/config/shard-map.js';
import { runCli } from '../helpers/fleet.js';
import { move } from '../helpers/faults.js';
import {
  chunkRecords,
  insertPhotos,
  logStarted,
  removeCliSnapshot,
  seededFleet,
  spawnCli,
  startShardWriter,
} from '../helpers/moves.js';
import { useTestDatabases, withClient } from '../helpers/hosts.js';
import { waitFor } from '../helpers/migrations.js';

const db = useTestDatabases(2);
afterAll(removeCliSnapshot);

/** 200,000 photos rows of ~150 bytes (about 30 MB), copied in chunks of 20,000 rows: 10 chunks. */
const ROWS = 200_000;
const CHUNK = '20000';
const PHOTOS = '"insta1"."photos"';

/** The names of `schema`.photos's indexes. */
async function indexes(url: string, schema: string): Promise<string[]> {
  return withClient(url, async (c) =>
    (
      await c.query<{ n: string }>(
        `select indexname as n from pg_indexes where schemaname = $1 and tablename = 'photos' order by 1`,
        [schema],
      )
    ).rows.map((r) => r.n),
  );
}

/** `schema`.photos's index definitions, read in `readFrom` (another shard of the same shape) when given, named for `schema`. */
async function indexDefinitions(url: string, schema: string, readFrom = schema): Promise<string[]> {
  return withClient(url, async (c) =>
    (
      await c.query<{ d: string }>(
        `select replace(indexdef, $1 || '.', $2 || '.') as d from pg_indexes where schemaname = $1 and tablename = 'photos' order by indexname`,
        [readFrom, schema],
      )
    ).rows.map((r) => r.d),
  );
}

describe('a copy that resumes', () => {
  it('a move killed in its copy goes on with the chunks not copied yet, reconciles the ones copied before against the new snapshot, and leaves no dead rows', async () => {
    const { fleet } = await seededFleet(db.urls, 1, 0);
    await insertPhotos(db.urls[0]!, 1, ROWS, 100);
    // A plain index on every shard's photos (the same shape everywhere, so the preflight sees no
    // drift), which the target's copy, built by the migrations, lacks: a chunked table is loaded
    // without its plain indexes, and they are built from the source's definitions after its last chunk.
    for (const [i, url] of db.urls.entries())
      await withClient(url, (c) =>
        c.query(
          [0, 1]
            .map((s) => `create index photos_user_caption_idx on insta${2 * i + s}.photos (user_id, caption);`)
            .join('\n'),
        ),
      );
    const map = await ShardMap.load(fleet.configFile);
    const writer = startShardWriter(map, 1);
    await waitFor('writes', async () => writer.acknowledged.length > 10);

    // Killed once 3 chunks are committed: one copying pair, so that no other chunk commits while the
    // third one's count is taken (with two, a fourth was seen committed before the kill).
    const first = await spawnCli(move(fleet, 1, '--to', 'pg2', '--copy-chunk-rows', CHUNK, '--copy-parallel', '1'), {
      SHARDCTL_FAULT_AFTER_CHUNKS: '3',
    });
    expect(first.signal, first.stderr).toBe('SIGKILL');
    const afterFirst = await chunkRecords(db.urls[1]!, PHOTOS);
    // Chunks of about 20,000 rows, cut at the key's statistics (the table was analyzed): 10, the
    // last one open-ended (the writer's rows go there); 11 when cut by reading the keys.
    expect(afterFirst.length).toBeGreaterThanOrEqual(10);
    expect(afterFirst.length).toBeLessThanOrEqual(11);
    expect(afterFirst.filter((c) => c.copied).map((c) => c.chunk)).toEqual([0, 1, 2]);
    // Killed in its copy: the target's copy has no index yet, not even its key's.
    expect(await indexes(db.urls[1]!, 'insta1')).toEqual([]);

    // Rows of the copied chunks change on the source before the resume: the first chunk's rows
    // updated, some of the second's deleted. The next run's snapshot sees them.
    await withClient(db.urls[0]!, (c) =>
      c.query(`update insta1.photos set caption = 'changed' where id in (select id from insta1.photos order by id limit 50);
               delete from insta1.photos where id in (select id from insta1.photos order by id offset 30000 limit 20)`),
    );

    // Killed again, once 2 more chunks are committed: one copying pair again, so that the chunks
    // copied again (0 and 1, taken first) and the two new ones are all committed at the kill, and
    // no other pair commits one more meanwhile (seen on PostgreSQL 17 with two).
    const second = await spawnCli(move(fleet, 1, '--resume', '--copy-chunk-rows', CHUNK, '--copy-parallel', '1'), {
      SHARDCTL_FAULT_AFTER_CHUNKS: '2',
    });
    expect(second.signal, second.stderr).toBe('SIGKILL');
    const afterSecond = await chunkRecords(db.urls[1]!, PHOTOS);
    // The plan is the first run's; chunks 0 and 1 were copied again (they differed), 2 kept, and
    // two new ones committed (3 and 4).
    expect(afterSecond.map((c) => c.chunk)).toEqual(afterFirst.map((c) => c.chunk));
    const copiedBefore = afterSecond.filter((c) => c.copied).map((c) => c.chunk);
    expect(copiedBefore).toEqual([0, 1, 2, 3, 4]);

    // The last run with two connection pairs on the chunks (how many copy at the same moment depends
    // on the machine's speed, a chunk takes a few milliseconds: not asserted; the rows are).
    const logged = await logStarted(db.urls[0]!, 'insta1');
    const last = await runCli(move(fleet, 1, '--resume', '--json', '--copy-chunk-rows', CHUNK, '--copy-parallel', '2'));
    expect(last.code, last.stderr).toBe(0);
    const result = JSON.parse(last.stdout) as MoveResult;
    // Only the chunks not copied yet were copied; the five copied before all still matched, as the
    // source's change log told (the writer's rows went to the last chunk, not copied yet).
    expect(result.chunks).toEqual({
      copied: afterFirst.length - 5,
      recopied: 0,
      ...(logged ? { fromLog: 5, compared: 0 } : { fromLog: 0, compared: 5 }),
    });
    const events = last.stderr
      .split('\n')
      .filter((l) => l.startsWith('{'))
      .map((l) => JSON.parse(l) as { kind: string; bytes: number; done: boolean });
    const copied = events.filter((e) => e.kind === 'copy').at(-1)!;
    expect(copied.done).toBe(true);
    const records = await chunkRecords(db.urls[1]!, PHOTOS);
    expect(records).toEqual([]);
    // The plain index built after the last chunk, as the source has it.
    expect(await indexDefinitions(db.urls[1]!, 'insta1')).toEqual(
      await indexDefinitions(db.urls[0]!, 'insta1', 'insta0'),
    );

    await waitFor('writes on the target', async () => writer.acknowledged.some((a) => a.host === 'pg2'));
    await writer.stop();
    const onTarget = writer.acknowledged.filter((a) => a.host === 'pg2').map((a) => a.id.toString());
    // Every row equal on both sides (the old copy on the source, fenced under its new name), but
    // the rows written on the target after the switch.
    const oldName = await withClient(
      db.urls[0]!,
      async (c) =>
        (await c.query<{ n: string }>(`select nspname as n from pg_namespace where nspname like 'insta1\\_moved\\_%'`))
          .rows[0]!.n,
    );
    // About half of the table: the six chunks left (with the writer's rows), not the whole.
    const heap = await withClient(db.urls[0]!, async (c) =>
      Number(
        (await c.query<{ n: string }>(`select pg_relation_size(format('%I.photos', $1::text))::text as n`, [oldName]))
          .rows[0]!.n,
      ),
    );
    expect(copied.bytes).toBeGreaterThan(heap * 0.3);
    expect(copied.bytes).toBeLessThan(heap * 0.6);
    const sourceRows = await withClient(db.urls[0]!, async (c) =>
      (await c.query<{ r: string }>(`select (p.*)::text as r from "${oldName}".photos p order by id`)).rows.map(
        (r) => r.r,
      ),
    );
    const targetRows = await withClient(db.urls[1]!, async (c) =>
      (
        await c.query<{ r: string }>(
          `select (p.*)::text as r from insta1.photos p where not (id::text = any($1::text[])) order by id`,
          [onTarget],
        )
      ).rows.map((r) => r.r),
    );
    expect(targetRows.length).toBe(sourceRows.length);
    expect(targetRows).toEqual(sourceRows);
    expect(sourceRows.length).toBe(ROWS - 20 + writer.acknowledged.filter((a) => a.host === 'pg1').length);
    expect(sourceRows.filter((r) => r.includes(',changed,'))).toHaveLength(50);
    // Every row acknowledged is there.
    const ids = new Set(
      await withClient(db.urls[1]!, async (c) =>
        (await c.query<{ id: string }>('select id::text from insta1.photos')).rows.map((r) => r.id),
      ),
    );
    expect(writer.acknowledged.filter((a) => !ids.has(a.id.toString()))).toEqual([]);

    // No dead rows: the cut-off chunks' and the replaced chunks' rows were vacuumed.
    const dead = await withClient(db.urls[1]!, async (c) => {
      await c.query('select pg_stat_force_next_flush()').catch(() => undefined);
      return (
        await c.query<{ n: string }>(
          `select n_dead_tup::text as n from pg_stat_user_tables where schemaname = 'insta1' and relname = 'photos'`,
        )
      ).rows[0]!.n;
    });
    expect(dead).toBe('0');
  });
});
