import pg from 'pg';
import { describe, expect, it } from 'vitest';
import { decodeId, DEFAULT_ID_LAYOUT, type IdLayout } from '../../src/id/layout.js';
import { ID_FUNCTION_VERSION, ID_LEAD_MS, renderNextIdSql } from '../../src/id/sql.js';
import { init } from '../../src/commands/init.js';
import { controlLocksSql } from '../../src/fleet/control.js';
import { status } from '../../src/commands/status.js';
import { makeFleet } from '../helpers/fleet.js';
import { useTestDatabases, withClient } from '../helpers/hosts.js';

const db = useTestDatabases(1);
/** A database of its own for the upgrade test, which initialises a fleet. */
const dbUpgrade = useTestDatabases(1);

async function installShard(client: pg.Client, schema: string, shard: number, layout: IdLayout): Promise<void> {
  // The slow path's lock rows live in the control schema.
  await client.query(controlLocksSql());
  await client.query(`create schema if not exists "${schema}"`);
  await client.query(renderNextIdSql(schema, shard, layout));
  await client.query(`create sequence if not exists "${schema}".photos_id_seq`);
}

function errorOf(promise: Promise<unknown>): Promise<pg.DatabaseError> {
  return promise.then(
    () => {
      throw new Error('expected the query to fail');
    },
    (error: pg.DatabaseError) => error,
  );
}

describe('next_id()', () => {
  it('never repeats an id: 8 sessions inserting 200-row batches concurrently', async () => {
    const url = db.urls[0]!;
    await withClient(url, async (client) => {
      await installShard(client, 'insta5', 5, DEFAULT_ID_LAYOUT);
      // No primary key on purpose: a duplicate must be counted, not rejected.
      await client.query(
        `create table insta5.ids (id bigint not null default insta5.next_id('insta5.photos_id_seq'), x int)`,
      );
    });
    const sessions = 8;
    const deadline = Date.now() + 6000;
    let batches = 0;
    await Promise.all(
      Array.from({ length: sessions }, async () => {
        const client = new pg.Client({ connectionString: url });
        await client.connect();
        try {
          while (Date.now() < deadline) {
            await client.query('insert into insta5.ids (x) select g from generate_series(1, 200) g');
            batches += 1;
          }
        } finally {
          await client.end();
        }
      }),
    );
    await withClient(url, async (client) => {
      const r = await client.query<{
        total: string;
        distinct: string;
        negative: string;
        wrong_shard: string;
        max_per_ms: string;
      }>(`
        select count(*) as total, count(distinct id) as distinct,
               count(*) filter (where id <= 0) as negative,
               count(*) filter (where (id >> 10) & 8191 <> 5) as wrong_shard,
               (select max(c) from (select count(*) c from insta5.ids group by id >> 23) m) as max_per_ms
          from insta5.ids`);
      const row = r.rows[0]!;
      expect(Number(row.total)).toBe(batches * 200);
      expect(Number(row.total)).toBeGreaterThan(50_000);
      expect(row.distinct).toBe(row.total);
      expect(row.negative).toBe('0');
      expect(row.wrong_shard).toBe('0');
      // The layout's 10 sequence bits hold at most 1024 ids per millisecond per shard and sequence.
      expect(Number(row.max_per_ms)).toBeLessThanOrEqual(1024);
    });
  });

  it('draws 2,000,000 distinct ids in one statement (more than 1024 per millisecond runs ahead, never wraps)', async () => {
    await withClient(db.urls[0]!, async (client) => {
      await installShard(client, 'insta6', 6, DEFAULT_ID_LAYOUT);
      const r = await client.query<{ total: string; distinct: string; ordered: boolean }>(`
        select count(*) as total, count(distinct id) as distinct, bool_and(id > prev) as ordered from (
          select id, lag(id, 1, 0::bigint) over (order by n) as prev
            from (select n, insta6.next_id('insta6.photos_id_seq') as id from generate_series(1, 2000000) n) s) t`);
      expect(r.rows[0]!.distinct).toBe('2000000');
      expect(r.rows[0]!.ordered).toBe(true);
    });
  });

  it("encodes the Instagram post's example (1387263000 ms, shard 1341, sequence 905) and TypeScript decodes it", async () => {
    // An epoch chosen so that 1387263000 ms after it is a minute from now: the sequence position
    // is set there, slightly ahead of the clock, which next_id must use as is.
    const epochMs = BigInt(Date.now()) - 1387263000n + 60_000n;
    const layout: IdLayout = { epochMs, shardBits: 13, sequenceBits: 10 };
    await withClient(db.urls[0]!, async (client) => {
      await installShard(client, 'insta1341', 1341, layout);
      // The 5001st row of the table: 5001 % 1024 = 905.
      await client.query(`select setval('insta1341.photos_id_seq', (1387263000::bigint << 10) | 904)`);
      const r = await client.query<{ id: string }>(`select insta1341.next_id('insta1341.photos_id_seq') as id`);
      const id = BigInt(r.rows[0]!.id);
      expect(id).toBe((1387263000n << 23n) | (1341n << 10n) | 905n);
      const decoded = decodeId(id, layout);
      expect(decoded.unixMs - epochMs).toBe(1387263000n);
      expect(decoded.shard).toBe(1341);
      expect(decoded.sequence).toBe(905);
    });
  });

  it('moves an idle sequence forward to the clock, so ids sort by time', async () => {
    await withClient(db.urls[0]!, async (client) => {
      await installShard(client, 'insta7', 7, DEFAULT_ID_LAYOUT);
      const first = BigInt(
        (await client.query<{ id: string }>(`select insta7.next_id('insta7.photos_id_seq') as id`)).rows[0]!.id,
      );
      await client.query('select pg_sleep(0.05)');
      const second = BigInt(
        (await client.query<{ id: string }>(`select insta7.next_id('insta7.photos_id_seq') as id`)).rows[0]!.id,
      );
      const now = BigInt(Date.now());
      const a = decodeId(first, DEFAULT_ID_LAYOUT);
      const b = decodeId(second, DEFAULT_ID_LAYOUT);
      expect(b.unixMs - a.unixMs).toBeGreaterThanOrEqual(45n);
      expect(now - b.unixMs).toBeLessThan(2_000n);
      expect(b.shard).toBe(7);
    });
  });

  it('never moves the sequence backwards when it is ahead of the clock (a clock that stepped back)', async () => {
    await withClient(db.urls[0]!, async (client) => {
      await installShard(client, 'insta8', 8, DEFAULT_ID_LAYOUT);
      const ahead = (BigInt(Date.now()) - DEFAULT_ID_LAYOUT.epochMs + 3_600_000n) << 10n;
      await client.query(`select setval('insta8.photos_id_seq', $1)`, [ahead.toString()]);
      const r = await client.query<{ id: string }>(
        `select insta8.next_id('insta8.photos_id_seq') as id from generate_series(1, 3) order by 1`,
      );
      const ids = r.rows.map((row) => BigInt(row.id));
      expect(ids.map((id) => decodeId(id, DEFAULT_ID_LAYOUT).sequence)).toEqual([1, 2, 3]);
      expect(decodeId(ids[0]!, DEFAULT_ID_LAYOUT).unixMs - DEFAULT_ID_LAYOUT.epochMs).toBe(ahead >> 10n);
    });
  });

  it('raises an error naming the layout when the clock is past its range, instead of wrapping', async () => {
    // 40 time bits from 1980 ran out in 2014.
    const layout: IdLayout = { epochMs: BigInt(Date.parse('1980-01-01T00:00:00Z')), shardBits: 13, sequenceBits: 10 };
    await withClient(db.urls[0]!, async (client) => {
      await installShard(client, 'insta9', 9, layout);
      const error = await errorOf(client.query(`select insta9.next_id('insta9.photos_id_seq')`));
      expect(error.code).toBe('SC001');
      expect(error.message).toContain('epoch 1980-01-01T00:00:00.000Z, 40 time bits, 13 shard bits, 10 sequence bits');
      expect(error.message).toContain('ran out of time bits on 2014-11-03T19:53:47.776Z');
    });
  });

  it('raises an error when the clock is before the epoch', async () => {
    const layout: IdLayout = { epochMs: BigInt(Date.now() + 86_400_000), shardBits: 13, sequenceBits: 10 };
    await withClient(db.urls[0]!, async (client) => {
      await installShard(client, 'insta10', 10, layout);
      const error = await errorOf(client.query(`select insta10.next_id('insta10.photos_id_seq')`));
      expect(error.code).toBe('SC002');
      expect(error.message).toContain('before the epoch of the id layout');
    });
  });

  it('refuses to move a sequence outside its own schema', async () => {
    await withClient(db.urls[0]!, async (client) => {
      await installShard(client, 'insta11', 11, DEFAULT_ID_LAYOUT);
      await client.query('create sequence public.other_seq');
      const error = await errorOf(client.query(`select insta11.next_id('public.other_seq')`));
      expect(error.code).toBe('SC003');
      expect(error.message).toContain('is not in schema insta11');
    });
  });

  it('refuses a sequence with CACHE > 1, whose cached values would bypass the shared position', async () => {
    await withClient(db.urls[0]!, async (client) => {
      await installShard(client, 'insta13', 13, DEFAULT_ID_LAYOUT);
      await client.query('alter sequence insta13.photos_id_seq cache 10');
      const error = await errorOf(client.query(`select insta13.next_id('insta13.photos_id_seq')`));
      expect(error.code).toBe('SC004');
      expect(error.message).toContain('has CACHE > 1');
    });
  });

  it('works for a role that has only USAGE on the sequence', async () => {
    await withClient(db.urls[0]!, async (client) => {
      await installShard(client, 'insta12', 12, DEFAULT_ID_LAYOUT);
      await client.query(
        `create table insta12.photos (id bigint primary key default insta12.next_id('insta12.photos_id_seq'), v int)`,
      );
      await client.query(
        `do $$ begin if not exists (select from pg_roles where rolname = 'shardctl_app') then create role shardctl_app; end if; end $$`,
      );
      await client.query('grant usage on schema insta12 to shardctl_app');
      await client.query('grant usage on sequence insta12.photos_id_seq to shardctl_app');
      await client.query('grant insert, select on insta12.photos to shardctl_app');
      await client.query('begin; set local role shardctl_app');
      try {
        const r = await client.query<{ id: string }>('insert into insta12.photos (v) values (1), (2) returning id');
        expect(r.rows.map((row) => decodeId(BigInt(row.id), DEFAULT_ID_LAYOUT).shard)).toEqual([12, 12]);
      } finally {
        await client.query('rollback');
      }
    });
  });

  it("installing next_id waits for the transactions that drew from the schema's sequences, so no older slow path runs beside the new one", async () => {
    await withClient(db.urls[0]!, async (client) => {
      await installShard(client, 'insta17', 17, DEFAULT_ID_LAYOUT);
      await withClient(db.urls[0]!, async (drawing) => {
        await drawing.query(`begin; select nextval('insta17.photos_id_seq')`);
        const error = await errorOf(
          client.query(`begin; set local lock_timeout = '200ms'; ${renderNextIdSql('insta17', 17, DEFAULT_ID_LAYOUT)}`),
        );
        await client.query('rollback');
        expect(error.code).toBe('55P03');
        await drawing.query('commit');
      });
      await client.query(
        `begin; set local lock_timeout = '200ms'; ${renderNextIdSql('insta17', 17, DEFAULT_ID_LAYOUT)}; commit`,
      );
    });
  });

  it('moves a sequence that is just behind the clock (fewer than max_backends positions) up to the clock in one locked call', async () => {
    await withClient(db.urls[0]!, async (client) => {
      await installShard(client, 'insta14', 14, DEFAULT_ID_LAYOUT);
      // The fast path's threshold now, minus 50 positions: too close for setval() (the proof needs
      // max_backends of room), so a slow path that only used setval() would take the lock on every
      // call until the clock moved on.
      const threshold = `((floor(extract(epoch from clock_timestamp()) * 1000)::bigint - ${DEFAULT_ID_LAYOUT.epochMs} - 1) << 10)`;
      const before = await client.query<{ threshold: string }>(
        `select ${threshold} as threshold, setval('insta14.photos_id_seq', ${threshold} - 50)`,
      );
      await client.query(`select insta14.next_id('insta14.photos_id_seq')`);
      const after = await client.query<{ last_value: string }>('select last_value from insta14.photos_id_seq');
      expect(BigInt(after.rows[0]!.last_value)).toBeGreaterThanOrEqual(BigInt(before.rows[0]!.threshold));
    });
  });

  it('moves a busy sequence (less than 4 ms behind) ID_LEAD_MS ahead of the clock, and an idle one to the clock itself', async () => {
    await withClient(db.urls[0]!, async (client) => {
      await installShard(client, 'insta15', 15, DEFAULT_ID_LAYOUT);
      const nowMs = `(floor(extract(epoch from clock_timestamp()) * 1000)::bigint - ${DEFAULT_ID_LAYOUT.epochMs})`;
      const move = async (behind: number) => {
        // `behind` positions behind the fast path's threshold, (now_ms - 1) << 10.
        // In one statement (a target list is evaluated in order), so that the clock does not move
        // on between the setval() and the call.
        const r = await client.query<{ from_ms: string; id: string; to_ms: string }>(
          `select ${nowMs} as from_ms, setval('insta15.photos_id_seq', ((${nowMs} - 1) << 10) - ${behind}),
                  insta15.next_id('insta15.photos_id_seq') as id, ${nowMs} as to_ms`,
        );
        const ms = decodeId(BigInt(r.rows[0]!.id), DEFAULT_ID_LAYOUT).unixMs - DEFAULT_ID_LAYOUT.epochMs;
        return { ms, from: BigInt(r.rows[0]!.from_ms), to: BigInt(r.rows[0]!.to_ms) };
      };
      // Busy: more than 2 * max_backends (setval is safe) and less than 4096 positions behind.
      const busy = await move(1000);
      expect(busy.ms).toBeGreaterThanOrEqual(busy.from + BigInt(ID_LEAD_MS));
      expect(busy.ms).toBeLessThanOrEqual(busy.to + BigInt(ID_LEAD_MS));
      // Idle: far behind; moved to the clock, not ahead of it.
      const idle = await move(1_000_000);
      expect(idle.ms).toBeGreaterThanOrEqual(idle.from);
      expect(idle.ms).toBeLessThanOrEqual(idle.to);
    });
  });

  it("evaluates next_id()'s one condition on PostgreSQL exactly as next_id_fast()'s, at every edge of the range and the clock", async () => {
    // The two conditions from the installed text, with the draw and the clock as parameters.
    const sql = renderNextIdSql('insta16', 16, DEFAULT_ID_LAYOUT);
    const inline = /RETURN CASE\s+WHEN (.*?)\s+THEN/s.exec(
      sql.slice(sql.indexOf('"insta16".next_id(seq regclass)')),
    )![1]!;
    const fast = /RETURN CASE\s+WHEN (.*?)\s+THEN/s.exec(sql.slice(sql.indexOf('"insta16".next_id_fast(')))![1]!;
    const asQuery = (condition: string, position: string) =>
      condition.replaceAll(position, '$1::bigint').replaceAll('pg_catalog.clock_timestamp()', '$2::timestamptz');
    const nowPos = (BigInt(Date.now()) - DEFAULT_ID_LAYOUT.epochMs) << 10n;
    const max = (1n << 50n) - 1n;
    const positions = [
      0n,
      1n,
      1023n,
      1024n,
      1025n,
      2047n,
      2048n,
      nowPos - 2049n,
      nowPos - 2048n,
      nowPos - 1025n,
      nowPos - 1024n,
      nowPos - 1n,
      nowPos,
      nowPos + 1023n,
      nowPos + 1024n,
      max - 1n,
      max,
    ];
    await withClient(db.urls[0]!, async (client) => {
      for (const p of positions) {
        const ms = p >> 10n;
        const acceptBefore = DEFAULT_ID_LAYOUT.epochMs + ms + 2n;
        // The clock at the edges of p's acceptance (1 µs either side) and before the epoch.
        const clocks = [
          acceptBefore * 1000n - 1n,
          acceptBefore * 1000n,
          acceptBefore * 1000n + 1n,
          DEFAULT_ID_LAYOUT.epochMs * 1000n - 5000n,
          BigInt(Date.now()) * 1000n,
        ];
        for (const us of clocks) {
          const clock = `${new Date(Number(us / 1000n)).toISOString().slice(0, 23)}${String(us % 1000n).padStart(3, '0')}Z`;
          const r = await client.query<{ inline: boolean; fast: boolean }>(
            `select (${asQuery(inline, 'pg_catalog.nextval(seq)')}) as inline, (${asQuery(fast, 'pos')}) as fast`,
            [p.toString(), clock],
          );
          expect({ p, clock, accepted: r.rows[0]!.inline }).toEqual({ p, clock, accepted: r.rows[0]!.fast });
        }
      }
      // Just past the layout's end, and below zero: refused (the slow path then raises SC001 or moves it).
      for (const p of [max + 1n, max + 2n, 2n * max, -1n, -(1n << 40n)]) {
        const r = await client.query<{ inline: boolean }>(
          `select (${asQuery(inline, 'pg_catalog.nextval(seq)')}) as inline`,
          [p.toString(), new Date().toISOString()],
        );
        expect({ p, accepted: r.rows[0]!.inline }).toEqual({ p, accepted: false });
      }
    });
  });

  /**
   * A synthetic older version for the upgrade mechanism (no released version precedes the current
   * one): today's functions under version 0, with a marker in the slow path's body so that the test
   * sees init replace all three functions, not only the comment.
   */
  const OLDER_MARKER = '-- synthetic older next_id';
  function olderNextIdSql(schema: string, shard: number, layout: IdLayout): string {
    const current = renderNextIdSql(schema, shard, layout);
    const older = current
      .replaceAll(`shardctl next_id v${ID_FUNCTION_VERSION}:`, 'shardctl next_id v0:')
      .replace('AS $next_id_locked$\n', `AS $next_id_locked$\n${OLDER_MARKER}\n`);
    expect(older).toContain('shardctl next_id v0:');
    expect(older).toContain(OLDER_MARKER);
    return older;
  }

  it('init detects an older next_id() and replaces it in place while a writer inserts: no insert fails, ids never repeat', async () => {
    const url = dbUpgrade.urls[0]!;
    const fleet = makeFleet({ urls: [url], shards: 2, schemaPrefix: 'upg' });
    const config = await fleet.config();
    expect((await init(config)).ok).toBe(true);
    await withClient(url, async (client) => {
      await client.query(olderNextIdSql('upg0', 0, config.idLayout));
      // No primary key: a repeated id must be stored and counted, not refused.
      await client.query(
        `create table upg0.ids (id bigint not null default upg0.next_id('upg0.photos_id_seq'), phase text)`,
      );
      // A burst first, so that the position is ahead of the clock when the new version takes over.
      await client.query(`insert into upg0.ids (phase) select 'old' from generate_series(1, 100000)`);
    });
    expect((await status(config)).hosts[0]!.nextIdOutdated).toEqual([0]);

    // One session keeps inserting (small batches, at a rate that also takes the slow path) while
    // init replaces the functions.
    let upgrading = true;
    const writer = (async () => {
      const client = new pg.Client({ connectionString: url });
      await client.connect();
      try {
        let batches = 0;
        while (upgrading || batches < 5) {
          await client.query(`insert into upg0.ids (phase) select 'during' from generate_series(1, 200)`);
          batches += 1;
        }
      } finally {
        await client.end();
      }
    })();
    try {
      const result = await init(config);
      expect(result.ok).toBe(true);
    } finally {
      upgrading = false;
      await writer;
    }

    await withClient(url, async (client) => {
      await client.query(`insert into upg0.ids (phase) select 'new' from generate_series(1, 100000)`);
      const r = await client.query<{
        total: string;
        distinct: string;
        old_max: string;
        new_min: string;
        max_per_ms: string;
      }>(`
          select count(*) as total, count(distinct id) as distinct,
                 max(id) filter (where phase = 'old') as old_max, min(id) filter (where phase = 'new') as new_min,
                 (select max(c) from (select count(*) c from upg0.ids group by id >> 23) m) as max_per_ms
            from upg0.ids`);
      const row = r.rows[0]!;
      expect(Number(row.total)).toBeGreaterThanOrEqual(201_000);
      expect(row.distinct).toBe(row.total);
      // The new function continues from the old position: later ids are larger.
      expect(BigInt(row.new_min)).toBeGreaterThan(BigInt(row.old_max));
      expect(Number(row.max_per_ms)).toBeLessThanOrEqual(1024);
      const fn = await client.query<{ lang: string; comment: string }>(`
          select l.lanname as lang, obj_description(p.oid, 'pg_proc') as comment
            from pg_proc p join pg_language l on l.oid = p.prolang where p.oid = 'upg0.next_id(regclass)'::regprocedure`);
      expect(fn.rows[0]!.lang).toBe('sql');
      expect(fn.rows[0]!.comment).toContain(`shardctl next_id v${ID_FUNCTION_VERSION}:`);
      expect(fn.rows[0]!.comment).not.toContain('shardctl next_id v0:');
      // The slow path was replaced too (one statement replaces all three functions).
      const locked = await client.query<{ body: string }>(
        `select prosrc as body from pg_proc where oid = 'upg0.next_id_locked(regclass)'::regprocedure`,
      );
      expect(locked.rows[0]!.body).not.toContain(OLDER_MARKER);
      // The fast path is inlined into the INSERT itself, no PL/pgSQL call per id.
      const plan = await client.query<{ 'QUERY PLAN': string }>(
        `explain verbose insert into upg0.ids (phase) values ('x')`,
      );
      const text = plan.rows.map((r) => r['QUERY PLAN']).join('\n');
      expect(text).toContain('currval(');
      expect(text).not.toContain('next_id_fast');
      const fresh = await client.query<{ lang: string }>(
        `select l.lanname as lang from pg_proc p join pg_language l on l.oid = p.prolang where p.oid = 'upg1.next_id(regclass)'::regprocedure`,
      );
      expect(fresh.rows[0]!.lang).toBe('sql');
    });
    expect((await status(config)).hosts[0]!.nextIdOutdated).toEqual([]);
  });
});
