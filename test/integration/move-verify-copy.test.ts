/**
 * The verification's figures before the fence taken from the copy (src/moves/copy-logs.ts): a large
 * keyed table's chunks summed as they are copied, and the change logs since the copy's snapshot on
 * both hosts, in place of a read of every row at the wave's snapshot P. Exact as that read: a row
 * changed on the target behind the move's back in a chunk already copied and summed, and a row the
 * source wrote that replication lost, are both found; so after a resume, where the chunks an earlier
 * run copied are summed by their reconciliation under the new slot.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { init, moveShard, type HostError } from '../../src/index.js';
import { ShardMap } from '../../src/config/shard-map.js';
import { type Fleet, makeFleet } from '../helpers/fleet.js';
import { move, runSqlBlocking } from '../helpers/faults.js';
import {
  insertPhotos,
  logStarted,
  pastIncomingGuard,
  removeCliSnapshot,
  spawnCli,
  startShardWriter,
} from '../helpers/moves.js';
import { useTestDatabases, withClient } from '../helpers/hosts.js';
import { waitFor } from '../helpers/migrations.js';

const db = useTestDatabases(2);
afterAll(removeCliSnapshot);

/** 60,000 photos rows in chunks of 10,000: 7 chunks, the last one open-ended. */
const ROWS = 60_000;
const CHUNK_ROWS = 10_000;
const FROM_COPY =
  /checksummed before the fence in \d+ ms \(1 table from the copy's chunk checksums and the changes logged since\)/;

let fleet: Fleet;
beforeAll(async () => {
  fleet = makeFleet({ urls: db.urls, shards: 6, split: ['0-5', ''] });
  expect((await init(await fleet.config())).ok).toBe(true);
});

function seed(shard: number): Promise<void> {
  return insertPhotos(db.urls[0]!, shard, ROWS, 1);
}

/**
 * Moves `shard` to pg2 in process (or resumes its move), running `onTarget` on pg2 once the copy is
 * recorded (the move waits for it).
 */
async function moveWith(shard: number, onTarget?: string, onSource?: string, resume = false) {
  const notices: string[] = [];
  let ran: number | null = 0;
  const outcome = await moveShard(await fleet.config(), shard, resume ? undefined : 'pg2', {
    configFile: fleet.configFile,
    resume,
    copyChunkRows: CHUNK_ROWS,
    onNotice: (message) => notices.push(message),
    onStep: (step) => {
      if (step !== 'copied') return;
      if (onTarget) ran = runSqlBlocking(db.urls[1]!, pastIncomingGuard(onTarget));
      if (onSource && ran === 0) ran = runSqlBlocking(db.urls[0]!, onSource);
    },
  }).then(
    (result) => ({ result, error: null }),
    (error: HostError & { details?: string[] }) => ({ result: null, error }),
  );
  expect(ran).toBe(0);
  return { ...outcome, notices: notices.join('\n') };
}

describe('the figures before the fence taken from the copy', () => {
  it('verify a move under a writer without reading the large table at P, and every row arrives', async () => {
    await seed(0);
    const writer = startShardWriter(await ShardMap.load(fleet.configFile), 0);
    await waitFor('writes', async () => writer.acknowledged.length > 10);
    // Rows of chunks already copied change on the source after the copy: the source's log has them.
    const { result, error, notices } = await moveWith(
      0,
      undefined,
      `update insta0.photos set caption = 'after the copy' where id in (select id from insta0.photos order by id limit 30);
       delete from insta0.photos where id in (select id from insta0.photos order by id offset 15000 limit 10)`,
    );
    await writer.stop();
    expect(error).toBeNull();
    expect(notices).toMatch(FROM_COPY);
    expect(result!.verification).toMatchObject({ ok: true });
    const rows = (url: string) =>
      withClient(url, async (c) =>
        (await c.query<{ r: string }>(`select (p.*)::text as r from insta0.photos p order by id`)).rows.map((r) => r.r),
      );
    const onTarget = await rows(db.urls[1]!);
    expect(onTarget.filter((r) => r.includes(',"after the copy",'))).toHaveLength(30);
    expect(onTarget.length).toBe(ROWS - 10 + writer.acknowledged.length);
  });

  it.each([
    {
      what: 'a row changed on the target behind the move’s back, in a chunk copied and summed',
      shard: 1,
      onTarget: `update insta1.photos set caption = 'corrupted' where id = (select min(id) from insta1.photos)`,
      onSource: undefined,
      named: /table insta1\.photos: 60000 rows on both, but their contents differ \(checksum\)/,
    },
    {
      what: 'a row the source wrote after the copy that replication lost',
      shard: 2,
      onTarget: `CREATE FUNCTION public.lose_photo() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$;
        CREATE TRIGGER lose BEFORE INSERT ON insta2.photos FOR EACH ROW WHEN (NEW.user_id = -1) EXECUTE FUNCTION public.lose_photo();
        ALTER TABLE insta2.photos ENABLE ALWAYS TRIGGER lose;`,
      onSource: `insert into insta2.photos (user_id, image_url) values (-1, 'lost')`,
      named: /table insta2\.photos: 60001 rows on the source, 60000 on the target/,
    },
  ])('finds $what', async ({ shard, onTarget, onSource, named }) => {
    await seed(shard);
    const { error, notices } = await moveWith(shard, onTarget, onSource);
    expect(notices).toMatch(FROM_COPY);
    expect(error).toMatchObject({ code: 'VERIFY_FAILED' });
    expect(error!.details).toHaveLength(1);
    expect(error!.details![0]).toMatch(named);
  });

  it('reads the table whole at P when something but the copy wrote to it on the target during the copy', async () => {
    await insertPhotos(db.urls[0]!, 3, 300_000, 200);
    const notices: string[] = [];
    let wrote: number | null = null;
    const outcome = await moveShard(await fleet.config(), 3, 'pg2', {
      configFile: fleet.configFile,
      copyChunkRows: CHUNK_ROWS,
      onNotice: (message) => notices.push(message),
      onProgress: (event) => {
        // Once a chunk streamed, its plan (and the target's statement triggers) exist: a write by
        // hand, of no row or of one, marks the log.
        if (event.kind === 'copy' && event.bytes > 0 && !event.done && wrote === null)
          wrote = runSqlBlocking(
            db.urls[1]!,
            pastIncomingGuard(
              `update insta3.photos set caption = 'by hand' where id = (select min(id) from insta3.photos)`,
            ),
          );
      },
    }).then(
      () => null,
      (error: HostError) => error,
    );
    expect(wrote).toBe(0);
    expect(notices.join('\n')).toMatch(/checksummed before the fence in \d+ ms; while fenced/);
    expect(notices.join('\n')).not.toMatch(FROM_COPY);
    // The row changed by hand is found if its chunk was copied before the write, and copied over
    // (its range deleted first) if not.
    if (outcome) expect(outcome).toMatchObject({ code: 'VERIFY_FAILED' });
  });
});

/** Of `shard`'s photos chunks recorded on the target, those copied. */
async function copiedChunks(shard: number): Promise<number[]> {
  return withClient(db.urls[1]!, async (c) =>
    (
      await c.query<{ chunk: number }>(
        `select chunk from shardctl.move_chunks where table_name = $1 and copied order by chunk`,
        [`"insta${shard}"."photos"`],
      )
    ).rows.map((r) => r.chunk),
  );
}

/**
 * Seeds `shard` and kills its move (CLI) once 3 of its chunks (6 or 7: cut at the key's statistics,
 * or by reading the keys) are committed, on one copying pair. Returns how many chunks it planned.
 */
async function killedInCopy(shard: number): Promise<number> {
  await seed(shard);
  const run = await spawnCli(
    move(fleet, shard, '--to', 'pg2', '--copy-chunk-rows', String(CHUNK_ROWS), '--copy-parallel', '1'),
    { SHARDCTL_FAULT_AFTER_CHUNKS: '3' },
  );
  expect(run.signal, run.stderr).toBe('SIGKILL');
  expect(await copiedChunks(shard)).toEqual([0, 1, 2]);
  return withClient(db.urls[1]!, async (c) =>
    Number(
      (
        await c.query<{ n: string }>(`select count(*)::text as n from shardctl.move_chunks where table_name = $1`, [
          `"insta${shard}"."photos"`,
        ])
      ).rows[0]!.n,
    ),
  );
}

describe('the figures before the fence of a resumed copy', () => {
  it('come from the copy too: the chunks copied before are summed as reconciled, one changed since copied again, and every row arrives', async () => {
    const planned = await killedInCopy(4);
    // A row of chunk 0 changes on the source before the resume: that chunk differs under the new
    // snapshot and is copied again; chunks 1 and 2 are kept.
    await withClient(db.urls[0]!, (c) =>
      c.query(`update insta4.photos set caption = 'before the resume' where id = (select min(id) from insta4.photos)`),
    );
    const logged = await logStarted(db.urls[0]!, 'insta4');
    const writer = startShardWriter(await ShardMap.load(fleet.configFile), 4);
    await waitFor('writes', async () => writer.acknowledged.length > 10);
    const { result, error, notices } = await moveWith(
      4,
      undefined,
      `update insta4.photos set caption = 'after the copy' where id in (select id from insta4.photos order by id offset 10000 limit 5)`,
      true,
    );
    await writer.stop();
    expect(error).toBeNull();
    expect(notices).toMatch(FROM_COPY);
    // Settled from the source's change log (the changed row's key names chunk 0; nothing read) when
    // the killed run had its log on the source, else by reading both hosts.
    expect(result!.chunks).toEqual({
      copied: planned - 3,
      recopied: 1,
      ...(logged ? { fromLog: 3, compared: 0 } : { fromLog: 0, compared: 3 }),
    });
    expect(result!.verification).toMatchObject({ ok: true });
    const rows = (url: string) =>
      withClient(url, async (c) =>
        (await c.query<{ r: string }>(`select (p.*)::text as r from insta4.photos p order by id`)).rows.map((r) => r.r),
      );
    const onTarget = await rows(db.urls[1]!);
    expect(onTarget.filter((r) => r.includes(',"before the resume",'))).toHaveLength(1);
    expect(onTarget.filter((r) => r.includes(',"after the copy",'))).toHaveLength(5);
    expect(onTarget.length).toBe(ROWS + writer.acknowledged.length);
  });

  it('finds a row changed on the target behind the move’s back in a chunk an earlier run copied, naming the table', async () => {
    await killedInCopy(5);
    // Chunk 1 (keys from the 10,001st on) was copied by the killed run and is kept by the resume.
    const { error, notices } = await moveWith(
      5,
      `update insta5.photos set caption = 'corrupted' where id = (select id from insta5.photos order by id offset 10000 limit 1)`,
      undefined,
      true,
    );
    expect(notices).toMatch(FROM_COPY);
    expect(error).toMatchObject({ code: 'VERIFY_FAILED' });
    expect(error!.details).toHaveLength(1);
    expect(error!.details![0]).toMatch(
      /table insta5\.photos: 60000 rows on both, but their contents differ \(checksum\)/,
    );
  });
});
