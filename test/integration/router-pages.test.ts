import { describe, expect, it } from 'vitest';
import { init } from '../../src/commands/init.js';
import { moveShard } from '../../src/commands/move-shard.js';
import { UsageError } from '../../src/errors.js';
import { decodeId, encodeId } from '../../src/id/layout.js';
import { ShardRouter } from '../../src/router/router.js';
import { makeFleet } from '../helpers/fleet.js';
import { useTestDatabases, withClient } from '../helpers/hosts.js';
import pg from 'pg';
import { sleep } from '../../src/clock.js';

const PHOTOS_ONLY = {
  '0001_photos.sql': `CREATE SEQUENCE photos_id_seq;
CREATE TABLE photos (id bigint PRIMARY KEY DEFAULT next_id('photos_id_seq'), user_id bigint NOT NULL, image_url text NOT NULL);
ALTER SEQUENCE photos_id_seq OWNED BY photos.id;`,
};

const PHOTOS_AND_COMMENTS = {
  ...PHOTOS_ONLY,
  '0002_comments.sql': `CREATE SEQUENCE comments_id_seq;
CREATE TABLE comments (id bigint PRIMARY KEY DEFAULT next_id('comments_id_seq'), photo_id bigint NOT NULL REFERENCES photos, body text NOT NULL);
ALTER SEQUENCE comments_id_seq OWNED BY comments.id;`,
};

type Photo = { id: bigint; user_id: bigint; image_url: string; pid: number };

describe('ShardRouter.queryEachShard with parameters', () => {
  const db = useTestDatabases(2);

  it('binds the same values on every shard; read-only chunks of one host share a round trip, each shard in its own transaction and schema', async () => {
    const fleet = makeFleet({
      urls: db.urls,
      shards: 16,
      split: ['0-7', '8-15'],
      schemaPrefix: 'qp',
      migrations: PHOTOS_ONLY,
    });
    expect((await init(await fleet.config())).ok).toBe(true);
    const router = await ShardRouter.open(fleet.configFile, { poolSize: 2 });
    try {
      // A write with parameters: one transaction per shard, each in its own schema.
      const inserted = await router.queryEachShard<{ id: string }>(
        `insert into photos (user_id, image_url) select $1, $2 from generate_series(1, $3::int) returning id`,
        { params: [7, "it's", 3] },
      );
      expect(inserted.map((r) => [r.shard, r.value.rowCount])).toEqual(Array.from({ length: 16 }, (_, i) => [i, 3]));
      for (const r of inserted) for (const row of r.value.rows) expect(router.shardForId(row.id)).toBe(r.shard);

      const sql = `select current_schema() as s, count(*)::int as n, pg_backend_pid() as pid,
        (select virtualxid from pg_locks where pid = pg_backend_pid() and locktype = 'virtualxid') as t
        from photos where user_id = $1 and image_url = $2 -- a trailing comment`;
      type Row = { s: string; n: number; pid: number; t: string };
      const results = await router.queryEachShard<Row>(sql, {
        params: [7, "it's"],
        readOnly: true,
        shardsPerQuery: 8,
        perHost: 1,
      });
      expect(results.map((r) => [r.shard, r.host, r.value.rows[0]!.s, r.value.rows[0]!.n])).toEqual(
        Array.from({ length: 16 }, (_, i) => [i, i < 8 ? 'pg1' : 'pg2', `qp${i}`, 3]),
      );
      // One connection per host, one transaction per shard.
      expect(new Set(results.map((r) => `${r.host} ${r.value.rows[0]!.pid}`)).size).toBe(2);
      expect(new Set(results.map((r) => `${r.host} ${r.value.rows[0]!.t}`)).size).toBe(16);

      // Shard 10 fails alone (division by zero there only): its chunk runs again shard by shard, naming it.
      await withClient(db.urls[1]!, (c) =>
        c.query(`insert into qp10.photos (id, user_id, image_url) values (0, 7, 'z')`),
      );
      const failed = await router
        .queryEachShard(`select count(*) filter (where 1 / id > $1) from photos`, {
          params: [0],
          readOnly: true,
          shardsPerQuery: 8,
        })
        .catch((e: unknown) => e);
      expect(
        (failed as { failures: { shard: number; error: { code: string } }[] }).failures.map((f) => [
          f.shard,
          f.error.code,
        ]),
      ).toEqual([[10, '22012']]);
      // The connections were left outside any transaction.
      const again = await router.queryEachShard<{ s: string }>('select current_schema() as s where $1', {
        params: [true],
        readOnly: true,
        shardsPerQuery: 8,
      });
      expect(again.map((r) => r.value.rows[0]!.s)).toEqual(Array.from({ length: 16 }, (_, i) => `qp${i}`));

      // One statement only, and nothing that ends the transaction: refused before anything is sent.
      const twice = await router.queryEachShard('select $1; select 2', { params: [1] }).catch((e: unknown) => e);
      expect(twice).toBeInstanceOf(UsageError);
      expect((twice as UsageError).input).toBe('sql');
      const commit = await router.queryEachShard('commit', { params: [] }).catch((e: unknown) => e);
      expect((commit as UsageError).input).toBe('sql');
    } finally {
      await router.close();
    }
  });
});

describe('ShardRouter.queryPage', () => {
  const db = useTestDatabases(2);

  it('pages 64 shards by id, newest and oldest first: every page in order, no row twice or missing while rows are inserted, a shard moved between two pages', async () => {
    const fleet = makeFleet({
      urls: db.urls,
      shards: 64,
      split: ['0-31', '32-63'],
      schemaPrefix: 'pg',
      migrations: PHOTOS_ONLY,
    });
    const config = await fleet.config();
    expect((await init(config)).ok).toBe(true);
    const router = await ShardRouter.open(fleet.configFile, { poolSize: 3 });
    try {
      // Rounds of rows on every shard at once: the ids of the shards interleave.
      for (let round = 0; round < 4; round++) {
        await router.queryEachShard(
          `insert into photos (user_id, image_url) select $1, 'r' from generate_series(1, 3)`,
          {
            params: [round],
          },
        );
      }
      const all = async (): Promise<bigint[]> =>
        (
          await router.queryEachShard<{ id: string }>('select id from photos where $1', {
            params: [true],
            readOnly: true,
            shardsPerQuery: 64,
          })
        ).flatMap((r) => r.value.rows.map((row) => BigInt(row.id)));
      const before = await all();
      expect(before).toHaveLength(64 * 12);
      const sql = `select id, user_id, image_url, pg_backend_pid() as pid from photos where image_url <> $1`;

      // Newest first, 25 a page; a row written into some shard after each page; shard 5 moved after page 3.
      const seen: bigint[] = [];
      let cursor: string | null = null;
      let pages = 0;
      do {
        const page: import('../../src/router/pages.js').Page<Photo> = await router.queryPage<Photo>(sql, {
          params: ['never'],
          limit: 25,
          cursor,
          perHost: 1,
        });
        pages += 1;
        expect(page.rows.length).toBeLessThanOrEqual(25);
        for (const row of page.rows) {
          expect(typeof row.id).toBe('bigint');
          expect(typeof row.user_id).toBe('bigint');
          seen.push(row.id);
        }
        if (pages === 1) {
          // All 64 shards in one round trip per host: one connection each.
          expect(new Set(page.rows.map((r) => r.pid)).size).toBeLessThanOrEqual(2);
        }
        cursor = page.cursor;
        if (cursor) expect(Buffer.from(cursor, 'base64url').toString()).toBe(`v1:newest:${page.rows.at(-1)!.id}`);
        await router.withKey(BigInt(pages), (c) =>
          c.query(`insert into photos (user_id, image_url) values ($1, 'later')`, [pages]),
        );
        if (pages === 3) {
          expect(router.hostForShard(5).name).toBe('pg1');
          expect((await moveShard(config, 5, 'pg2', { configFile: fleet.configFile })).outcome).toBe('moved');
        }
      } while (cursor);
      expect(router.hostForShard(5).name).toBe('pg2');
      expect(seen.every((id, i) => i === 0 || id < seen[i - 1]!)).toBe(true);
      const seenSet = new Set(seen);
      expect(before.filter((id) => !seenSet.has(id))).toEqual([]);
      expect(pages).toBeGreaterThanOrEqual(Math.ceil(before.length / 25));

      // Oldest first over what is there now, rows still being written meanwhile: all of them, ascending.
      const now = await all();
      const oldest: bigint[] = [];
      cursor = null;
      do {
        const page: import('../../src/router/pages.js').Page<Photo> = await router.queryPage<Photo>(sql, {
          params: ['never'],
          limit: 100,
          order: 'oldest',
          cursor,
        });
        oldest.push(...page.rows.map((r) => r.id));
        cursor = page.cursor;
        await router.withKey(7n, (c) => c.query(`insert into photos (user_id, image_url) values (7, 'later')`));
      } while (cursor);
      expect(oldest.every((id, i) => i === 0 || id > oldest[i - 1]!)).toBe(true);
      const oldestSet = new Set(oldest);
      expect(now.filter((id) => !oldestSet.has(id))).toEqual([]);
    } finally {
      await router.close();
    }
  });
});

describe('ShardRouter.queryPage', () => {
  const db = useTestDatabases(2);

  it('reads only the shards of the keys given, and refuses a bad limit, order or cursor naming it', async () => {
    const fleet = makeFleet({
      urls: db.urls,
      shards: 8,
      split: ['0-3', '4-7'],
      schemaPrefix: 'pk',
      migrations: PHOTOS_ONLY,
    });
    expect((await init(await fleet.config())).ok).toBe(true);
    const router = await ShardRouter.open(fleet.configFile);
    try {
      await router.queryEachShard(`insert into photos (user_id, image_url) select $1, 'x' from generate_series(1, 5)`, {
        params: [0],
      });
      // Keys 3, 11 and 6: shards 3 and 6.
      const page = await router.queryPage<Photo>('select id from photos', { keys: [3n, 11n, 6n], limit: 100 });
      expect(page.cursor).toBeNull();
      expect(page.rows).toHaveLength(10);
      expect(new Set(page.rows.map((r) => router.shardForId(r.id)))).toEqual(new Set([3, 6]));
      const two = await router.queryPage<Photo>('select id from photos', { shards: [1, 2], limit: 4, order: 'oldest' });
      expect(two.rows.map((r) => r.id)).toEqual([...two.rows.map((r) => r.id)].sort((a, b) => (a < b ? -1 : 1)));
      const next = await router.queryPage<Photo>('select id from photos', {
        shards: [1, 2],
        limit: 100,
        order: 'oldest',
        cursor: two.cursor,
      });
      expect(next.rows).toHaveLength(6);
      expect(next.rows[0]!.id > two.rows.at(-1)!.id).toBe(true);

      const refused = async (options: object): Promise<UsageError> =>
        (await router
          .queryPage('select id from photos', { limit: 10, ...options })
          .catch((e: unknown) => e)) as UsageError;
      expect((await refused({ limit: 0 })).message).toBe('limit 0: must be a whole number from 1 to 10000');
      expect((await refused({ order: 'up' })).input).toBe('order');
      expect((await refused({ cursor: 'nonsense' })).input).toBe('cursor');
      expect((await refused({ cursor: two.cursor })).message).toMatch(
        /cursor .*: was made for order 'oldest', not 'newest'/,
      );
      expect((await refused({ keys: [1] })).input).toBe('keys');
      const notId = await router
        .queryPage('select image_url as id from photos', { limit: 10 })
        .catch((e: unknown) => e);
      expect((notId as UsageError).message).toBe(
        'idColumn "id": must be a bigint column (found text): pages are sorted and continued by it as a number; select the id itself (turn it into text after the page, if needed)',
      );
      // id::text (for JSON) would sort as text ('9' after '20') and fail at the next page's bound:
      // refused on the first page, before a wrong page is returned.
      const asText = await router
        .queryPage('select id::text as id from photos', { limit: 2 })
        .catch((e: unknown) => e as UsageError);
      expect(asText).toMatchObject({ input: 'idColumn', message: expect.stringContaining('(found text)') });
      // The statement's own ORDER BY / LIMIT would page each shard in its own order: refused.
      for (const [own, clause] of [
        ['select id from photos order by id asc limit 2', 'ORDER BY'],
        ['select id from photos limit 2', 'LIMIT'],
        ['select id from photos offset 1', 'OFFSET'],
        ['select id from photos fetch first 2 rows only', 'FETCH'],
      ] as const) {
        const refusedOwn = await router.queryPage(own, { limit: 2 }).catch((e: unknown) => e as UsageError);
        expect(refusedOwn).toMatchObject({ input: 'sql', message: expect.stringContaining(`has its own ${clause}`) });
      }
      // Inside parentheses (a CTE, a subquery, an aggregate's or a window's order) it is the statement's own business.
      const inner = await router.queryPage(
        'with recent as (select id from photos order by id desc limit 1000) select id, row_number() over (order by id) as n from recent',
        { limit: 2 },
      );
      expect(inner.rows.length).toBeLessThanOrEqual(2);
      // A negative bigint is no id of the scheme: refused rather than made into a cursor it would refuse.
      const negative = await router
        .queryPage('select -id as id from photos', { limit: 2 })
        .catch((e: unknown) => e as UsageError);
      expect(negative).toMatchObject({ input: 'idColumn', message: expect.stringContaining('of 0 or more') });
    } finally {
      await router.close();
    }
  });
});

describe('ShardRouter.queryPage', () => {
  const db = useTestDatabases(2);

  it('refuses rows that repeat an id (a join on a photo’s comments), naming idColumn and the id, rather than skip the rest of them', async () => {
    const fleet = makeFleet({
      urls: db.urls,
      shards: 4,
      split: ['0-1', '2-3'],
      schemaPrefix: 'pr',
      migrations: PHOTOS_AND_COMMENTS,
    });
    expect((await init(await fleet.config())).ok).toBe(true);
    const router = await ShardRouter.open(fleet.configFile);
    try {
      // Photos a (one comment, on shard 1) and b, c (two comments each; b on shard 1, c on shard 3).
      const photo = async (shard: number, comments: string[]): Promise<bigint> =>
        router.withShard(shard, async (c) => {
          const { rows } = await c.query<{ id: string }>(
            `insert into photos (user_id, image_url) values (1, 'u') returning id`,
          );
          const id = rows[0]!.id;
          for (const body of comments)
            await c.query(`insert into comments (photo_id, body) values ($1, $2)`, [id, body]);
          return BigInt(id);
        });
      const a = await photo(1, ['a/x']);
      const b = await photo(1, ['b/x', 'b/y']);
      const c = await photo(3, ['c/x', 'c/y']);
      expect(a < b && b < c).toBe(true);
      const joined = 'SELECT p.id, c.body FROM photos p JOIN comments c ON c.photo_id = p.id';
      const refusal = async (options: { limit: number; order?: 'newest' | 'oldest'; cursor?: string | null }) =>
        (await router.queryPage(joined, options).catch((e: unknown) => e)) as UsageError;

      // Newest first, 3 a page: c/x c/y b/? would end between b's two rows (the next page asks id < b).
      const split = await refusal({ limit: 3 });
      expect(split).toBeInstanceOf(UsageError);
      expect(split.input).toBe('idColumn');
      expect(split.message).toMatch(new RegExp(`^idColumn "id": repeats id ${c} in two rows`));
      expect(split.data).toMatchObject({ input: 'idColumn', value: 'id', id: c.toString() });
      // A page holding whole groups is refused as well: the statement cannot be paged by id.
      expect((await refusal({ limit: 10 })).data).toMatchObject({ id: c.toString() });
      // Oldest first, one a page: a/x alone is fine (the row after it is b's); the next page, b/?,
      // is followed by b's other row.
      const first = await router.queryPage<{ id: bigint; body: string }>(joined, { limit: 1, order: 'oldest' });
      expect(first.rows).toEqual([{ id: a, body: 'a/x' }]);
      const boundary = await refusal({ limit: 1, order: 'oldest', cursor: first.cursor });
      expect(boundary.data).toMatchObject({ input: 'idColumn', id: b.toString() });

      // By the comments' own ids, every row, once, whatever the page size.
      const byComment = 'SELECT c.id AS comment_id, p.id, c.body FROM photos p JOIN comments c ON c.photo_id = p.id';
      const bodies: string[] = [];
      let cursor: string | null = null;
      do {
        const page: import('../../src/router/pages.js').Page<{ body: string }> = await router.queryPage<{
          body: string;
        }>(byComment, { limit: 3, idColumn: 'comment_id', order: 'oldest', cursor });
        bodies.push(...page.rows.map((r) => r.body));
        cursor = page.cursor;
      } while (cursor);
      expect(bodies).toEqual(['a/x', 'b/x', 'b/y', 'c/x', 'c/y']);
    } finally {
      await router.close();
    }
  });
});

describe('ShardRouter.queryPage', () => {
  const db = useTestDatabases(2);

  it('oldest first, misses a row committed after the cursor passed its id; with minAgeMs a tailing reader returns it, and a bad minAgeMs is refused naming it', async () => {
    const fleet = makeFleet({
      urls: db.urls,
      shards: 16,
      split: ['0-7', '8-15'],
      schemaPrefix: 'pl',
      migrations: PHOTOS_ONLY,
    });
    const config = await fleet.config();
    expect((await init(config)).ok).toBe(true);
    const router = await ShardRouter.open(fleet.configFile);
    const open = new pg.Client({ connectionString: db.urls[0] });
    await open.connect();
    try {
      const minAgeMs = 3000;
      // Two rows on shard 9 written a minute ago: settled for any reader.
      const minuteAgo = BigInt(Date.now() - 60_000);
      const old = [0, 1].map((sequence) => encodeId({ unixMs: minuteAgo, shard: 9, sequence }, config.idLayout));
      await router.withShard(9, (c) =>
        c.query(`insert into photos (id, user_id, image_url) select unnest($1::bigint[]), 9, 'old'`, [old.map(String)]),
      );
      // Shard 1 draws an id and stays open; shard 9 then commits two newer rows.
      await open.query('BEGIN');
      const late = BigInt(
        (
          await open.query<{ id: string }>(
            `insert into pl1.photos (user_id, image_url) values (1, 'late') returning id`,
          )
        ).rows[0]!.id,
      );
      const fresh = await router.withShard(9, async (c) =>
        (
          await c.query<{ id: string }>(
            `insert into photos (user_id, image_url) select 9, 'new' from generate_series(1, 2) returning id`,
          )
        ).rows.map((r) => BigInt(r.id)),
      );
      expect(fresh.every((id) => id > late)).toBe(true);

      type Row = { id: bigint };
      const sql = 'SELECT id FROM photos';
      const read = (options: { cursor: string | null; minAgeMs?: number }) =>
        router.queryPage<Row>(sql, { shards: [1, 9], limit: 2, order: 'oldest', ...options });

      // Both readers read while the shard-1 row is uncommitted.
      const plain1 = await read({ cursor: null });
      const plain2 = await read({ cursor: plain1.cursor });
      expect([...plain1.rows, ...plain2.rows].map((r) => r.id)).toEqual([...old, ...fresh]);
      const tail1 = await read({ cursor: null, minAgeMs });
      expect(tail1.rows.map((r) => r.id)).toEqual(old);
      const tail2 = await read({ cursor: tail1.cursor, minAgeMs });
      expect(tail2.rows).toEqual([]); // the new rows are younger than minAgeMs: the reader lags
      expect(tail2.cursor).toBeNull();
      expect(tail2.resume).toBe(tail1.cursor);

      await open.query('COMMIT');

      // Without minAgeMs the cursor is past the late row's id: it is never returned.
      const plain3 = await read({ cursor: plain2.resume });
      expect(plain3.rows).toEqual([]);
      // With it, once the rows are old enough, the reader goes on from where it was: all three, in order.
      await sleep(Number(decodeId(fresh[1]!, config.idLayout).unixMs) + minAgeMs + 50 - Date.now());
      const tail3 = await read({ cursor: tail2.resume, minAgeMs });
      const tail4 = await read({ cursor: tail3.resume, minAgeMs });
      expect([...tail3.rows, ...tail4.rows].map((r) => r.id)).toEqual([late, ...fresh]);
      expect(tail4.cursor).toBeNull();

      const refused = async (options: object): Promise<UsageError> =>
        (await router
          .queryPage(sql, { limit: 10, order: 'oldest', ...options })
          .catch((e: unknown) => e)) as UsageError;
      for (const [bad, shown] of [
        [-1, '-1'],
        [1.5, '1.5'],
        [Number.NaN, 'NaN'],
        ['100', '"100"'],
      ] as const)
        expect((await refused({ minAgeMs: bad })).message).toBe(
          `minAgeMs ${shown}: must be a whole number of milliseconds, 0 or more`,
        );
      expect((await refused({ minAgeMs: 10, order: 'newest' })).message).toMatch(
        /^minAgeMs 10: applies to order 'oldest' only/,
      );
    } finally {
      await open.end();
      await router.close();
    }
  });
});
