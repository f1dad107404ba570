import pg from 'pg';
import { describe, expect, it } from 'vitest';
import { decodeId, DEFAULT_ID_LAYOUT, type IdLayout } from '../../src/id/layout.js';
import { ID_FUNCTION_VERSION, ID_LEAD_MS, renderNextIdControlSql, renderNextIdSql } from '../../src/id/sql.js';
import { init } from '../../src/commands/init.js';
import { CONTROL_VERSION, controlLocksSql } from '../../src/fleet/control.js';
import { status } from '../../src/commands/status.js';
import { moveShard } from '../../src/commands/move-shard.js';
import { makeFleet } from '../helpers/fleet.js';
import { renderNextIdV1Sql } from '../fixtures/next-id-v1.js';
import { errorOf, useTestDatabases, withClient } from '../helpers/hosts.js';

const db = useTestDatabases(1);
/** A database of its own for the upgrade test, which initialises a fleet. */
const dbUpgrade = useTestDatabases(1);
/** Two hosts for a move of a shard that still has the previous release's functions. */
const dbMove = useTestDatabases(2);

async function installShard(client: pg.Client, schema: string, shard: number, layout: IdLayout): Promise<void> {
  // The slow path and its lock rows live in the control schema (one layout per host: the last
  // installed wins, and each test installs the one it uses).
  await client.query(controlLocksSql());
  await client.query(renderNextIdControlSql(layout, 'insta'));
  await client.query(`create schema if not exists "${schema}"`);
  await client.query(renderNextIdSql(schema, shard, layout));
  await client.query(`create sequence if not exists "${schema}".photos_id_seq`);
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
      expect(error.message).toContain('is not in the schema of shard 11');
    });
  });

  it("the host's slow path, called directly, moves no sequence outside the schema of the shard it is given", async () => {
    await withClient(db.urls[0]!, async (client) => {
      await installShard(client, 'insta18', 18, DEFAULT_ID_LAYOUT);
      await client.query('create sequence if not exists public.victim_seq');
      await client.query(`select nextval('public.victim_seq'), nextval('insta18.photos_id_seq')`);
      const cases = [
        [`'public.victim_seq'`, '18'],
        [`'insta18.photos_id_seq'`, '19'],
        [`'insta18.photos_id_seq'`, '-1'],
        [`'insta18.photos_id_seq'`, '8192'],
        [`'insta18.photos_id_seq'`, 'null'],
      ] as const;
      for (const [seq, shard] of cases) {
        const error = await errorOf(client.query(`select shardctl.next_id_locked(${seq}, ${shard})`));
        expect({ seq, shard, code: error.code }).toEqual({ seq, shard, code: 'SC003' });
      }
      const victim = await client.query<{ last_value: string }>('select last_value from public.victim_seq');
      expect(victim.rows[0]!.last_value).toBe('1');
      // Its own shard's sequence: moved to the clock, and the id carries the shard.
      const r = await client.query<{ id: string }>(`select shardctl.next_id_locked('insta18.photos_id_seq', 18) as id`);
      expect(decodeId(BigInt(r.rows[0]!.id), DEFAULT_ID_LAYOUT).shard).toBe(18);
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
    const control = renderNextIdControlSql(DEFAULT_ID_LAYOUT, 'insta');
    const fast = /RETURN CASE\s+WHEN (.*?)\s+THEN/s.exec(
      control.slice(control.indexOf('"shardctl".next_id_fast(')),
    )![1]!;
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

  it('init upgrades a fleet installed by the previous release (per-shard slow path) in place under 8 inserting sessions: no insert fails, no id repeats, ids keep their shard and their order', async () => {
    const url = dbUpgrade.urls[0]!;
    const fleet = makeFleet({ urls: [url], shards: 2, schemaPrefix: 'upg' });
    const config = await fleet.config();
    expect((await init(config)).ok).toBe(true);
    // The previous release's state: control schema version 2 without the host-wide slow path, and
    // next_id v1 (next_id_locked and next_id_fast in each shard schema).
    await withClient(url, async (client) => {
      for (const shard of [0, 1]) await client.query(renderNextIdV1Sql(`upg${shard}`, shard, config.idLayout));
      await client.query(
        'drop function shardctl.next_id_fast(regclass, integer, bigint), shardctl.next_id_locked(regclass, integer)',
      );
      await client.query('update shardctl.layout set control_version = 2');
      for (const shard of [0, 1]) {
        // No primary key: a repeated id must be stored and counted, not refused.
        await client.query(
          `create table upg${shard}.ids (id bigint not null default upg${shard}.next_id('upg${shard}.photos_id_seq'), phase text, at timestamptz default clock_timestamp())`,
        );
      }
      // A burst first, so that the position is ahead of the clock when the new version takes over.
      await client.query(`insert into upg0.ids (phase) select 'old' from generate_series(1, 100000)`);
    });
    expect((await status(config)).hosts[0]!.nextIdOutdated).toEqual([0, 1]);

    // Eight sessions keep inserting (small batches over both shards, at a rate that also takes the
    // slow path) while init replaces the functions.
    let upgrading = true;
    let failed = 0;
    const writers = Array.from({ length: 8 }, async (_, i) => {
      const client = new pg.Client({ connectionString: url });
      await client.connect();
      try {
        let batches = 0;
        while (upgrading || batches < 5) {
          const shard = (i + batches) % 2;
          await client
            .query(`insert into upg${shard}.ids (phase) select 'during' from generate_series(1, 50)`)
            .catch(() => (failed += 1));
          batches += 1;
        }
      } finally {
        await client.end();
      }
    });
    try {
      const result = await init(config);
      expect(result.ok).toBe(true);
    } finally {
      upgrading = false;
      await Promise.all(writers);
    }
    expect(failed).toBe(0);

    await withClient(url, async (client) => {
      await client.query(`insert into upg0.ids (phase) select 'new' from generate_series(1, 100000)`);
      for (const shard of [0, 1]) {
        const r = await client.query<{
          total: string;
          distinct: string;
          wrong_shard: string;
          max_per_ms: string;
        }>(`
            select count(*) as total, count(distinct id) as distinct,
                   count(*) filter (where (id >> 10) & 8191 <> ${shard}) as wrong_shard,
                   (select max(c) from (select count(*) c from upg${shard}.ids group by id >> 23) m) as max_per_ms
              from upg${shard}.ids`);
        const row = r.rows[0]!;
        expect(row.distinct).toBe(row.total);
        expect(row.wrong_shard).toBe('0');
        expect(Number(row.max_per_ms)).toBeLessThanOrEqual(1024);
      }
      // Ids sort by time: every id drawn after another one (a later commit's batch) is larger.
      const order = await client.query<{ old_max: string; new_min: string; total: string }>(`
          select max(id) filter (where phase = 'old') as old_max, min(id) filter (where phase = 'new') as new_min,
                 count(*) as total from upg0.ids`);
      expect(BigInt(order.rows[0]!.new_min)).toBeGreaterThan(BigInt(order.rows[0]!.old_max));
      expect(Number(order.rows[0]!.total)).toBeGreaterThan(200_000);
      const fn = await client.query<{ lang: string; comment: string; body: string }>(`
          select l.lanname as lang, obj_description(p.oid, 'pg_proc') as comment, pg_get_functiondef(p.oid) as body
            from pg_proc p join pg_language l on l.oid = p.prolang where p.oid = 'upg0.next_id(regclass)'::regprocedure`);
      expect(fn.rows[0]!.lang).toBe('sql');
      expect(fn.rows[0]!.comment).toContain(`shardctl next_id v${ID_FUNCTION_VERSION}:`);
      expect(fn.rows[0]!.body).toContain('shardctl.next_id_locked(seq, 0)');
      // The earlier per-shard slow path now hands over to the host's (for statements planned
      // before the upgrade); next_id_fast is gone.
      const locked = await client.query<{ body: string }>(
        `select prosrc as body from pg_proc where oid = 'upg0.next_id_locked(regclass)'::regprocedure`,
      );
      expect(locked.rows[0]!.body.trim().split('\n')).toHaveLength(3);
      expect(locked.rows[0]!.body).toContain('"shardctl".next_id_locked(seq, 0)');
      const fast = await client.query(
        `select from pg_proc where proname = 'next_id_fast' and pronamespace = 'upg0'::regnamespace`,
      );
      expect(fast.rowCount).toBe(0);
      expect(
        (await client.query<{ n: number }>(`select count(*)::int as n from upg0.ids where id is null`)).rows[0]!.n,
      ).toBe(0);
      // The fast path is inlined into the INSERT itself, no PL/pgSQL call per id.
      const plan = await client.query<{ 'QUERY PLAN': string }>(
        `explain verbose insert into upg0.ids (phase) values ('x')`,
      );
      const text = plan.rows.map((r) => r['QUERY PLAN']).join('\n');
      expect(text).toContain('currval(');
      expect(text).not.toContain('upg0.next_id_locked');
      // The forwarder still works for a caller that names it.
      await client.query(`select nextval('upg1.photos_id_seq')`);
      const forwarded = await client.query<{ id: string }>(`select upg1.next_id_locked('upg1.photos_id_seq') as id`);
      expect(decodeId(BigInt(forwarded.rows[0]!.id), config.idLayout).shard).toBe(1);
    });
    expect((await status(config)).hosts[0]!.nextIdOutdated).toEqual([]);
  });

  it("a shard still on the previous release's next_id moves online to a host upgraded on the way, and arrives with the host's slow path", async () => {
    const fleet = makeFleet({ urls: dbMove.urls, shards: 4, schemaPrefix: 'mv' });
    const config = await fleet.config();
    expect((await init(config)).ok).toBe(true);
    // Both hosts as the previous release left them (init not yet run after the upgrade).
    for (const [i, url] of dbMove.urls.entries()) {
      await withClient(url, async (client) => {
        for (const shard of i === 0 ? [0, 1] : [2, 3])
          await client.query(renderNextIdV1Sql(`mv${shard}`, shard, config.idLayout));
        await client.query(
          'drop function shardctl.next_id_fast(regclass, integer, bigint), shardctl.next_id_locked(regclass, integer)',
        );
        await client.query('update shardctl.layout set control_version = 2');
      });
    }
    await withClient(dbMove.urls[0]!, (client) =>
      client.query(`insert into mv0.photos (user_id, image_url) select g, 'x' from generate_series(1, 500) g`),
    );
    const result = await moveShard(config, 0, 'pg2', { configFile: fleet.configFile });
    expect(result.outcome).toBe('moved');
    await withClient(dbMove.urls[1]!, async (client) => {
      expect((await client.query('select control_version from shardctl.layout')).rows[0].control_version).toBe(
        CONTROL_VERSION,
      );
      const r = await client.query<{ id: string }>(
        `insert into mv0.photos (user_id, image_url) values (1, 'y') returning id`,
      );
      expect(decodeId(BigInt(r.rows[0]!.id), config.idLayout).shard).toBe(0);
      const fns = await client.query<{ name: string }>(
        `select proname as name from pg_proc where pronamespace = 'mv0'::regnamespace order by 1`,
      );
      expect(fns.rows.map((f) => f.name)).toEqual(['next_id']);
      const count = await client.query<{ n: number }>('select count(*)::int as n from mv0.photos');
      expect(count.rows[0]!.n).toBe(501);
    });
  });
});
