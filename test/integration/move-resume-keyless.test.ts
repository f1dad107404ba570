import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { MoveResult } from '../../src/index.js';
import { init } from '../../src/index.js';
import { type Fleet, makeFleet, runCli } from '../helpers/fleet.js';
import { move } from '../helpers/faults.js';
import { chunkRecords, removeCliSnapshot, spawnCli } from '../helpers/moves.js';
import { useTestDatabases, withClient } from '../helpers/hosts.js';

const db = useTestDatabases(2);
afterAll(removeCliSnapshot);

/** 100,000 rows of a table without a primary key (about 13 MB), in chunks of about 10,000 rows. */
const ROWS = 100_000;
const CHUNK = '10000';
const EVENTS_TABLE = '"insta1"."events"';
const EVENTS = `CREATE TABLE events (user_id bigint NOT NULL, body text NOT NULL);
ALTER TABLE events REPLICA IDENTITY FULL;`;
/** A keyed table beside it (the second test). */
const ITEMS = `CREATE TABLE items (id bigint PRIMARY KEY, body text NOT NULL);`;

let fleet: Fleet;
beforeAll(async () => {
  fleet = makeFleet({
    urls: db.urls,
    shards: 4,
    split: ['0-1', '2-3'],
    migrations: { '0001_events.sql': EVENTS, '0002_items.sql': ITEMS },
  });
  expect((await init(await fleet.config())).ok).toBe(true);
});

async function deadRows(url: string, schema: string, table: string): Promise<string> {
  return withClient(url, async (c) => {
    await c.query('select pg_stat_force_next_flush()').catch(() => undefined);
    return (
      await c.query<{ n: string }>(
        `select n_dead_tup::text as n from pg_stat_user_tables where schemaname = $1 and relname = $2`,
        [schema, table],
      )
    ).rows[0]!.n;
  });
}

/** The name the source's old copy of `shard` took at the switch. */
async function oldSchema(shard: number): Promise<string> {
  return withClient(
    db.urls[0]!,
    async (c) =>
      (
        await c.query<{ n: string }>(`select nspname as n from pg_namespace where nspname like $1`, [
          `insta${shard}\\_moved\\_%`,
        ])
      ).rows[0]!.n,
  );
}

async function rowsOf(url: string, table: string): Promise<string[]> {
  return withClient(url, async (c) =>
    (await c.query<{ r: string }>(`select (e.*)::text as r from ${table} e order by 1`)).rows.map((r) => r.r),
  );
}

describe('a keyless table copied in chunks of blocks', () => {
  it('is copied by block ranges, and a resumed run empties it and copies it again whole from its own snapshot: rows equal, no dead rows', async () => {
    await withClient(db.urls[0]!, (c) =>
      c.query(
        `insert into insta1.events select g, repeat('e', 100) || g from generate_series(1, ${ROWS}) g;
         analyze insta1.events`,
      ),
    );

    const first = await spawnCli(move(fleet, 1, '--to', 'pg2', '--copy-chunk-rows', CHUNK, '--copy-parallel', '1'), {
      SHARDCTL_FAULT_AFTER_CHUNKS: '3',
    });
    expect(first.signal, first.stderr).toBe('SIGKILL');
    const planned = await chunkRecords(db.urls[1]!, EVENTS_TABLE);
    // About ten ranges of blocks, the first and the last open-ended.
    expect(planned.length).toBeGreaterThanOrEqual(8);
    expect(planned.length).toBeLessThanOrEqual(12);
    expect(new Set(planned.map((c) => c.key_column))).toEqual(new Set(['ctid']));
    expect(planned[0]!.lo).toBeNull();
    expect(planned.slice(1).every((c) => /^\(\d+,0\)$/.test(c.lo ?? ''))).toBe(true);
    expect(planned.filter((c) => c.copied)).toHaveLength(3);
    const killedRows = await withClient(db.urls[1]!, async (c) =>
      Number((await c.query<{ n: string }>('select count(*)::text as n from insta1.events')).rows[0]!.n),
    );
    expect(killedRows).toBeGreaterThan(0);

    // Rows of the copied blocks change on the source before the resume (an update moves its row to
    // a later block), and rows are added: the next snapshot sees them.
    await withClient(db.urls[0]!, (c) =>
      c.query(`update insta1.events set body = 'changed' where user_id <= 40;
               delete from insta1.events where user_id between 1001 and 1030;
               insert into insta1.events select g, 'added' from generate_series(${ROWS + 1}, ${ROWS + 25}) g`),
    );

    const last = await runCli(move(fleet, 1, '--resume', '--json', '--copy-chunk-rows', CHUNK, '--copy-parallel', '2'));
    expect(last.code, last.stderr).toBe(0);
    const result = JSON.parse(last.stdout) as MoveResult;
    // Every chunk of a new plan copied (none kept from the killed run), none reconciled.
    expect(result.chunks.recopied).toBe(0);
    expect(result.chunks.copied).toBeGreaterThanOrEqual(8);
    expect(await chunkRecords(db.urls[1]!, EVENTS_TABLE)).toEqual([]);

    const oldName = await withClient(
      db.urls[0]!,
      async (c) =>
        (await c.query<{ n: string }>(`select nspname as n from pg_namespace where nspname like 'insta1\\_moved\\_%'`))
          .rows[0]!.n,
    );
    const sourceRows = await rowsOf(db.urls[0]!, `"${oldName}".events`);
    const targetRows = await rowsOf(db.urls[1]!, 'insta1.events');
    expect(sourceRows).toHaveLength(ROWS - 30 + 25);
    expect(targetRows).toEqual(sourceRows);
    expect(targetRows.filter((r) => r.endsWith(',changed)'))).toHaveLength(40);

    // The killed run's rows (its three chunks and the one cut off) went with the TRUNCATE.
    const dead = await withClient(db.urls[1]!, async (c) => {
      await c.query('select pg_stat_force_next_flush()').catch(() => undefined);
      return (
        await c.query<{ n: string }>(
          `select n_dead_tup::text as n from pg_stat_user_tables where schemaname = 'insta1' and relname = 'events'`,
        )
      ).rows[0]!.n;
    });
    expect(dead).toBe('0');
  });

  it('a shard of keyed and keyless tables killed at three points of its copy, then finished: the last run copies only the keyed chunks left and the keyless table again, rows equal, no dead rows', async () => {
    // 30,000 rows in each table, chunks of 5,000: about 6 key chunks of items (cut at the key's
    // statistics), about 6 block chunks of events; one copying pair, so that the kills fall after the same chunks every time.
    const rows = 30_000;
    const chunk = '5000';
    await withClient(db.urls[0]!, (c) =>
      c.query(
        `insert into insta0.events select g, repeat('e', 100) || g from generate_series(1, ${rows}) g;
         insert into insta0.items select g, repeat('i', 100) || g from generate_series(1, ${rows}) g;
         analyze insta0.events, insta0.items`,
      ),
    );
    const items = () => chunkRecords(db.urls[1]!, '"insta0"."items"');
    /** The items chunks copied after each kill. */
    const copiedAfter: number[] = [];
    let plan: { lo: string | null }[] | null = null;
    for (const [i, after] of ['2', '5', '4'].entries()) {
      const flags = i === 0 ? ['--to', 'pg2'] : ['--resume'];
      const run = await spawnCli(move(fleet, 0, ...flags, '--copy-chunk-rows', chunk, '--copy-parallel', '1'), {
        SHARDCTL_FAULT_AFTER_CHUNKS: after,
      });
      expect(run.signal, run.stderr).toBe('SIGKILL');
      const records = await items();
      // Once planned, the keyed table's plan is the same in every run (a keyless one's is not).
      if (records.length > 0) {
        plan ??= records.map((r) => ({ lo: r.lo }));
        expect(records.map((r) => ({ lo: r.lo }))).toEqual(plan);
      }
      copiedAfter.push(records.filter((r) => r.copied).length);
      if (i === 0)
        // Between the kills the source changes: rows of the first key chunk and of the keyless table.
        await withClient(db.urls[0]!, (c) =>
          c.query(`update insta0.items set body = 'changed' where id <= 3;
                   update insta0.events set body = 'changed' where user_id <= 20`),
        );
    }
    // A chunk once copied stays copied (the changed one is copied again, not dropped).
    expect(copiedAfter).toEqual([...copiedAfter].sort((a, b) => a - b));
    expect(plan).not.toBeNull();
    expect(plan!.length).toBeGreaterThanOrEqual(6);
    expect(plan!.length).toBeLessThanOrEqual(7);

    const last = await runCli(move(fleet, 0, '--resume', '--json', '--copy-chunk-rows', chunk, '--copy-parallel', '2'));
    expect(last.code, last.stderr).toBe(0);
    const result = JSON.parse(last.stdout) as MoveResult;
    // The last run copied the keyed chunks left and a new plan of the keyless table, nothing again.
    expect(result.chunks.recopied).toBe(0);
    const keylessChunks = result.chunks.copied - (plan!.length - copiedAfter.at(-1)!);
    expect(keylessChunks).toBeGreaterThanOrEqual(4);
    expect(keylessChunks).toBeLessThanOrEqual(8);

    const old = await oldSchema(0);
    for (const table of ['events', 'items']) {
      const sourceRows = await rowsOf(db.urls[0]!, `"${old}".${table}`);
      expect(sourceRows).toHaveLength(rows);
      expect(await rowsOf(db.urls[1]!, `insta0.${table}`)).toEqual(sourceRows);
      expect(await deadRows(db.urls[1]!, 'insta0', table)).toBe('0');
    }
  });
});
