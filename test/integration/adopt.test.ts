import { randomBytes } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { ShardMap } from '../../src/config/shard-map.js';
import { moveShard } from '../../src/commands/move-shard.js';
import { ShardRouter } from '../../src/router/router.js';
import { decodeId, encodeId } from '../../src/id/layout.js';
import { equalSplit, makeFleet, runCli } from '../helpers/fleet.js';
import { slowPathChangingOver } from '../../src/fleet/control.js';
import { startShardWriter } from '../helpers/moves.js';
import { adminClient, useTestDatabases, withClient } from '../helpers/hosts.js';
import { waitFor } from '../helpers/migrations.js';
import { articleShardSql, BASELINE, buildArticleFleet } from '../fixtures/article-fleet.js';

const main = useTestDatabases(2);
const refusals = useTestDatabases(2);
const switching = useTestDatabases(2);
const partial = useTestDatabases(2);
const owned = useTestDatabases(2);
const enums = useTestDatabases(2);
const rerun = useTestDatabases(1);
const noCreate = useTestDatabases(2);

/** Everything adopt could change: schemas, functions (body and comment), relations, sequence values, the control schema. */
async function catalog(url: string, prefix: string): Promise<unknown> {
  return withClient(url, async (c) => ({
    schemas: (await c.query(`select nspname from pg_namespace where nspname like $1 || '%' order by 1`, [prefix])).rows,
    // The runner lock's tables (sql/control_locks.sql) may appear on a host that never had shardctl:
    // taking the lock needs them. Anything else in the control schema would be a change.
    controlObjects: (
      await c.query(
        `select c.relname from pg_class c join pg_namespace n on n.oid = c.relnamespace
          where n.nspname = 'shardctl' and c.relname not in ('runner_lock', 'tracking_lock', 'workers', 'workers_pkey', 'id_locks', 'id_locks_pkey')
            and c.relname !~ '^id_lock_[0-9]+$' order by 1`,
      )
    ).rows,
    functions: (
      await c.query(
        `select n.nspname, p.proname, pg_get_function_arguments(p.oid) as args, md5(p.prosrc) as body, obj_description(p.oid, 'pg_proc') as comment
           from pg_proc p join pg_namespace n on n.oid = p.pronamespace where n.nspname like $1 || '%' order by 1, 2, 3`,
        [prefix],
      )
    ).rows,
    relations: (
      await c.query(
        `select n.nspname, c.relname, c.relkind from pg_class c join pg_namespace n on n.oid = c.relnamespace where n.nspname like $1 || '%' order by 1, 2`,
        [prefix],
      )
    ).rows,
    sequences: (
      await c.query(
        `select schemaname, sequencename, last_value::text from pg_sequences where schemaname like $1 || '%' order by 1, 2`,
        [prefix],
      )
    ).rows,
    control: (await c.query(`select to_regclass('shardctl.shards') is not null as control`)).rows,
  }));
}

interface Made {
  shard: number;
  table: 'photos' | 'likes';
  id: bigint;
  started: number;
  ended: number;
  session: number;
}

/**
 * Application sessions inserting single rows into several shards on both hosts, through the table
 * default (photos) and through an explicit call of the published next_id() (likes), until stopped.
 */
function startSessions(
  urls: readonly string[],
  prefix: string,
  shards: readonly number[],
  hostOf: (shard: number) => number,
  count: number,
) {
  const made: Made[] = [];
  const failures: string[] = [];
  let stop = false;
  const loops = Array.from({ length: count }, async (_, session) => {
    const clients = await Promise.all(urls.map((url) => adminClient(url)));
    for (const c of clients) c.on('error', () => undefined);
    try {
      for (let i = 0; !stop; i++) {
        const shard = shards[(session + i) % shards.length]!;
        const table = i % 2 === 0 ? 'photos' : 'likes';
        const s = `${prefix}${shard}`;
        const sql =
          table === 'photos'
            ? `insert into ${s}.photos (user_id, image_url) values (${session}, 'live') returning id`
            : `insert into ${s}.likes (id, photo_id, user_id) values (${s}.next_id(), ${i}, ${session}) returning id`;
        const started = performance.now();
        try {
          const result = await clients[hostOf(shard)]!.query<{ id: string }>(sql);
          made.push({ shard, table, id: BigInt(result.rows[0]!.id), started, ended: performance.now(), session });
        } catch (error) {
          failures.push(`${s}.${table}: ${(error as Error).message}`);
        }
      }
    } finally {
      for (const c of clients) await c.end().catch(() => undefined);
    }
  });
  return {
    made,
    failures,
    async stop() {
      stop = true;
      await Promise.all(loops);
    },
  };
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

describe('shardctl adopt', () => {
  it('adopts 64 article-built shards on 2 hosts under 8 inserting sessions: no failed insert, no repeated id, ids grow across the switch; then migrate, a move and status work', async () => {
    const split = equalSplit(64, 2);
    await buildArticleFleet(main.urls, 'insta', split);
    const fleet = makeFleet({ urls: main.urls, shards: 64, split, migrations: { '0001_article.sql': BASELINE } });
    const config = await fleet.config();

    // init refuses the hand-built schemas, and says what to do.
    const refusedInit = await runCli(['init', '-c', fleet.configFile]);
    expect(refusedInit.code).toBe(1);
    expect(refusedInit.stderr).toContain('shardctl adopt');

    const live = [0, 1, 2, 17, 31, 32, 33, 50, 63];
    const hostOf = (shard: number): number => (shard < 32 ? 0 : 1);
    const sessions = startSessions(main.urls, 'insta', live, hostOf, 8);
    // Counts, not fixed sleeps: a loaded machine (containers in CI) makes fewer inserts per second.
    await waitFor('60 inserts before adopt', async () => sessions.made.length >= 60 || sessions.failures.length > 0);
    const adoptStarted = performance.now();
    const adopted = await runCli(['adopt', '--baseline', '1', '--yes', '--json', '-c', fleet.configFile]);
    const adoptEnded = performance.now();
    await waitFor(
      '60 inserts after adopt',
      async () => sessions.made.filter((m) => m.started > adoptEnded).length >= 60 || sessions.failures.length > 0,
    );
    await sessions.stop();

    expect(adopted.stderr).not.toContain('error');
    expect(adopted.code).toBe(0);
    const result = JSON.parse(adopted.stdout) as { hosts: { host: string; switched: number; failures: unknown[] }[] };
    expect(result.hosts.map((h) => [h.host, h.switched, h.failures.length])).toEqual([
      ['pg1', 32, 0],
      ['pg2', 32, 0],
    ]);

    expect(sessions.failures).toEqual([]);
    const before = sessions.made.filter((m) => m.ended < adoptStarted);
    const after = sessions.made.filter((m) => m.started > adoptEnded);
    expect(before.length).toBeGreaterThan(50);
    expect(after.length).toBeGreaterThan(50);
    // 0 repeated ids; every id decodes to the shard it was made in.
    const keys = sessions.made.map((m) => `${m.shard}:${m.table}:${m.id}`);
    expect(new Set(keys).size).toBe(keys.length);
    expect(sessions.made.filter((m) => decodeId(m.id, config.idLayout).shard !== m.shard)).toEqual([]);
    for (const shard of live) {
      for (const table of ['photos', 'likes'] as const) {
        const maxBefore = before
          .filter((m) => m.shard === shard && m.table === table)
          .reduce((x, m) => (m.id > x ? m.id : x), 0n);
        const early = after.filter((m) => m.shard === shard && m.table === table && m.id <= maxBefore);
        expect(early, `${shard}.${table}`).toEqual([]);
      }
    }
    // After the switch each session's ids grow per table (shardctl's function never goes back).
    for (let session = 0; session < 8; session++) {
      for (const shard of live) {
        const ids = after
          .filter((m) => m.session === session && m.shard === shard && m.table === 'photos')
          .map((m) => m.id);
        expect(ids.every((id, i) => i === 0 || id > ids[i - 1]!)).toBe(true);
      }
    }
    // The published name and shardctl's next_id(seq) both answer, and every row in the tables is unique.
    await withClient(main.urls[1]!, async (c) => {
      const comment = (
        await c.query<{ c: string }>(`select obj_description('insta40.next_id()'::regprocedure, 'pg_proc') as c`)
      ).rows[0]!.c;
      expect(comment).toMatch(/^shardctl adopted next_id\(\)/);
      const ids = (
        await c.query<{ a: string; b: string }>(
          `select insta40.next_id()::text as a, insta40.next_id('insta40.table_id_seq')::text as b`,
        )
      ).rows[0]!;
      expect(BigInt(ids.b)).toBeGreaterThan(BigInt(ids.a));
      expect(decodeId(BigInt(ids.a), config.idLayout).shard).toBe(40);
      const recorded = (await c.query(`select count(*)::int as n from shardctl.shards`)).rows[0];
      expect(recorded).toEqual({ n: 32 });
      const baseline = (await c.query(`select count(*)::int as n from shardctl.migrations where version = 1`)).rows[0];
      expect(baseline).toEqual({ n: 32 });
    });

    // init no longer refuses; a new migration file is applied to every adopted shard.
    expect((await runCli(['init', '-c', fleet.configFile])).code).toBe(0);
    fleet.writeMigration(
      '0002_comments.sql',
      `CREATE SEQUENCE comments_id_seq;
CREATE TABLE comments (id bigint PRIMARY KEY DEFAULT next_id('comments_id_seq'), photo_id bigint NOT NULL, body text NOT NULL);
ALTER SEQUENCE comments_id_seq OWNED BY comments.id;
`,
    );
    const migrated = await runCli(['migrate', '-c', fleet.configFile]);
    expect(migrated.stderr).toContain('64 migrations applied, 0 shards already current, 0 failed');
    expect(migrated.code).toBe(0);
    await withClient(main.urls[0]!, async (c) => {
      const id = (
        await c.query<{ id: string }>(`insert into insta3.comments (photo_id, body) values (1, 'x') returning id`)
      ).rows[0]!.id;
      expect(decodeId(BigInt(id), config.idLayout).shard).toBe(3);
    });

    // A move of an adopted shard under a writer: every new id on the target is above every moved id.
    const map = await ShardMap.load(fleet.configFile);
    const writer = startShardWriter(map, 5);
    await waitFor('writes on the source', async () => writer.acknowledged.length >= 10);
    const moved = await moveShard(await fleet.config(), 5, 'pg2', { configFile: fleet.configFile });
    await waitFor('writes on the target', async () => writer.acknowledged.filter((a) => a.host === 'pg2').length >= 10);
    await writer.stop();
    expect(moved.outcome).toBe('moved');
    const onSource = writer.acknowledged.filter((a) => a.host === 'pg1');
    const onTarget = writer.acknowledged.filter((a) => a.host === 'pg2');
    expect(onTarget.length).toBeGreaterThan(0);
    const maxMoved = onSource.reduce((m, a) => (a.id > m ? a.id : m), 0n);
    expect(onTarget.filter((a) => a.id <= maxMoved)).toEqual([]);
    await withClient(main.urls[1]!, async (c) => {
      // The published name answers on the target too (the baseline file made it), above every moved id.
      await c.query('set search_path to public');
      const called = BigInt((await c.query<{ id: string }>(`select insta5.next_id()::text as id`)).rows[0]!.id);
      expect(called).toBeGreaterThan(maxMoved);
      expect(decodeId(called, config.idLayout).shard).toBe(5);
      const n = (
        await c.query<{ n: number; d: number }>(
          `select count(*)::int as n, count(distinct id)::int as d from insta5.photos`,
        )
      ).rows[0]!;
      expect(n.n).toBe(n.d);
      expect(n.n).toBe(
        20 +
          onSource.length +
          onTarget.length +
          sessions.made.filter((m) => m.shard === 5 && m.table === 'photos').length,
      );
    });

    // The router writes by key into an adopted shard (through the published default) and finds the row by its id.
    const router = await ShardRouter.open(fleet.configFile);
    try {
      const id = await router.withKey(31341n, async (client, shard) => {
        expect(shard).toBe(31341 % 64);
        return BigInt(
          (
            await client.query<{ id: string }>(
              `insert into photos (user_id, image_url) values (31341, 'router') returning id`,
            )
          ).rows[0]!.id,
        );
      });
      expect(decodeId(id, config.idLayout).shard).toBe(31341 % 64);
      const found = await router.withId(
        id,
        async (client) => (await client.query(`select user_id from photos where id = $1`, [id.toString()])).rows,
      );
      expect(found).toEqual([{ user_id: '31341' }]);
    } finally {
      await router.close();
    }

    const decoded = await runCli(['decode', onTarget.at(-1)!.id.toString(), '-c', fleet.configFile]);
    expect(decoded.code).toBe(0);
    expect(decoded.stdout).toMatch(/shard\D+5\b/);
    const gc = await runCli(['gc', '--yes', '-c', fleet.configFile]);
    expect(gc.code).toBe(0);
    const state = await runCli(['status', '-c', fleet.configFile]);
    expect(state.stdout + state.stderr).not.toMatch(/behind|drift|older/i);
    expect(state.code).toBe(0);
  });

  const split4 = ['0-1', '2-3'];

  it('switches a shard only once the transactions that drew with the published function have ended, and above every stored id, even one ahead of the clock', async () => {
    await buildArticleFleet(switching.urls, 'sw', split4);
    const fleet = makeFleet({ urls: switching.urls, shards: 4, split: split4, schemaPrefix: 'sw', migrations: {} });
    const config = await fleet.config();
    // A stored id 5 s ahead of the clock (made on a host whose clock ran ahead): new ids must be above it.
    const ahead = encodeId({ unixMs: BigInt(Date.now() + 5000), shard: 1, sequence: 7 }, config.idLayout);
    await withClient(switching.urls[0]!, (c) =>
      c.query(`insert into sw1.photos (id, user_id, image_url) values ($1, 1, 'ahead')`, [ahead.toString()]),
    );
    // An application transaction that drew an id with the published function and has not committed.
    const open = await adminClient(switching.urls[0]!);
    await open.query('begin');
    const pending = BigInt(
      (await open.query<{ id: string }>(`insert into sw0.photos (user_id, image_url) values (1, 'open') returning id`))
        .rows[0]!.id,
    );
    let finished = 0;
    const adopting = runCli(['adopt', '--yes', '-c', fleet.configFile]).then(
      (run) => ((finished = performance.now()), run),
    );
    await sleep(1000);
    const committed = performance.now();
    await open.query('commit');
    await open.end();
    const run = await adopting;
    expect(run.stderr).toContain('pg1: 2 shards switched');
    expect(run.code).toBe(0);
    // The switch waited for that transaction (it holds the sequence), and its id is below every new one.
    expect(finished).toBeGreaterThan(committed);
    await withClient(switching.urls[0]!, async (c) => {
      const next = async (table: string): Promise<bigint> =>
        BigInt(
          (await c.query<{ id: string }>(`insert into ${table} (user_id, image_url) values (1, 'new') returning id`))
            .rows[0]!.id,
        );
      expect(await next('sw0.photos')).toBeGreaterThan(pending);
      const after = await next('sw1.photos');
      expect(after).toBeGreaterThan(ahead);
      expect(decodeId(after, config.idLayout).shard).toBe(1);
      // A second run finds nothing to do.
      const again = await runCli(['adopt', '--yes', '-c', fleet.configFile]);
      expect(again.code).toBe(0);
      expect(again.stderr).toContain("pg1: 0 shards switched, 2 already shardctl's");
    });
    // A baseline given later is checked against the adopted shards before it is recorded.
    fleet.writeMigration('0001_article.sql', BASELINE.replace('user_id  bigint NOT NULL', 'user_id  integer NOT NULL'));
    const wrong = await runCli(['adopt', '--baseline', '1', '--yes', '-c', fleet.configFile]);
    expect(wrong.stderr).toMatch(
      /host pg1, shard 0 \(sw0\): baseline: table sw0\.likes has columns \(id bigint not null, photo_id bigint not null, user_id bigint not null\), the files create \(id bigint not null, photo_id bigint not null, user_id integer not null\)/,
    );
    expect(wrong.code).toBe(3);
    fleet.writeMigration('0001_article.sql', BASELINE);
    const right = await runCli(['adopt', '--baseline', '1', '--yes', '-c', fleet.configFile]);
    expect(right.stderr).toContain('pg1: 0 shards switched, 2 recorded');
    expect(right.code).toBe(0);
    const recorded = await withClient(switching.urls[0]!, (c) =>
      c.query(`select shard, version, name from shardctl.migrations order by shard`),
    );
    expect(recorded.rows).toEqual([
      { shard: 0, version: 1, name: '0001_article' },
      { shard: 1, version: 1, name: '0001_article' },
    ]);
  });

  it('--shards adopts only the listed shards; init refuses the others until they are adopted too', async () => {
    await buildArticleFleet(partial.urls, 'pa', split4);
    const fleet = makeFleet({ urls: partial.urls, shards: 4, split: split4, schemaPrefix: 'pa', migrations: {} });
    const untouched = await withClient(partial.urls[1]!, (c) =>
      c.query(`select md5(prosrc) from pg_proc where oid = 'pa3.next_id()'::regprocedure`),
    );
    const first = await runCli(['adopt', '--shards', '0,2', '--yes', '-c', fleet.configFile]);
    expect(first.code).toBe(0);
    expect(first.stderr).toContain('pg1: 1 shard switched');
    expect(first.stderr).toContain('pg2: 1 shard switched');
    expect(
      await withClient(partial.urls[1]!, (c) =>
        c.query(`select md5(prosrc) from pg_proc where oid = 'pa3.next_id()'::regprocedure`),
      ),
    ).toMatchObject({ rows: untouched.rows });
    const init = await runCli(['init', '-c', fleet.configFile]);
    expect(init.code).toBe(1);
    expect(init.stderr).toMatch(/host pg1: schema for shard 1 exists but shardctl did not create it/);
    expect((await runCli(['adopt', '--yes', '-c', fleet.configFile])).code).toBe(0);
    expect((await runCli(['init', '-c', fleet.configFile])).code).toBe(0);
    expect((await runCli(['status', '-c', fleet.configFile])).code).toBe(0);
  });

  it.each([
    {
      name: 'a schema whose id function is unknown',
      prefix: 'ua',
      prepare: async (urls: readonly string[]) => {
        await buildArticleFleet(urls, 'ua', split4);
        await withClient(urls[0]!, (c) =>
          c.query(
            `CREATE OR REPLACE FUNCTION ua1.next_id(OUT result bigint) AS $$ BEGIN result := nextval('ua1.table_id_seq'); END; $$ LANGUAGE plpgsql`,
          ),
        );
      },
      reason: /host pg1, shard 1 \(ua1\): next_id\(\) is not the published function/,
    },
    {
      name: 'stored ids of another shard',
      prefix: 'ub',
      prepare: async (urls: readonly string[]) => {
        await buildArticleFleet(urls, 'ub', split4);
        await withClient(urls[0]!, (c) =>
          c.query(`insert into ub0.photos (id, user_id, image_url) values (ub1.next_id(), 1, 'x')`),
        );
      },
      reason: /host pg1, shard 0 \(ub0\): table ub0\.photos: its largest id \d+ decodes to shard 1, not 0/,
    },
    {
      name: 'the same schema on two hosts',
      prefix: 'uc',
      prepare: async (urls: readonly string[]) => {
        await buildArticleFleet(urls, 'uc', split4);
        await withClient(urls[1]!, (c) => c.query(articleShardSql('uc', 1)));
      },
      reason: /host pg2, shard 1 \(uc1\): the same schema exists on hosts pg1 and pg2/,
    },
    {
      name: 'a config whose epoch disagrees with the stored ids',
      prefix: 'ud',
      prepare: async (urls: readonly string[]) => buildArticleFleet(urls, 'ud', split4),
      epoch: '2015-01-01T00:00:00.000Z',
      reason: /host pg1, shard 0 \(ud0\): layout: next_id\(\) disagrees with the config: its epoch is 1314220021721 ms/,
    },
  ])(
    'refuses $name with exit 3, naming host and shard, and changes nothing',
    async ({ prefix, prepare, reason, epoch }) => {
      await prepare(refusals.urls);
      const fleet = makeFleet({
        urls: refusals.urls,
        shards: 4,
        split: split4,
        schemaPrefix: prefix,
        migrations: {},
        ...(epoch ? { idLayout: { epoch } } : {}),
      });
      const before = await Promise.all(refusals.urls.map((url) => catalog(url, prefix)));
      const run = await runCli(['adopt', '--yes', '-c', fleet.configFile]);
      expect(run.stderr).toMatch(reason);
      expect(run.stderr).toContain('nothing was changed');
      expect(run.code).toBe(3);
      expect(await Promise.all(refusals.urls.map((url) => catalog(url, prefix)))).toEqual(before);
    },
  );

  it("a rerun on a current host leaves its control schema as it is: the slow path stays finished while an application's transaction holds a sequence", async () => {
    const url = rerun.urls[0]!;
    await buildArticleFleet([url], 'rr', ['0-1']);
    const fleet = makeFleet({
      urls: [url],
      shards: 2,
      split: ['0-1'],
      schemaPrefix: 'rr',
      migrations: { '0001_article.sql': BASELINE },
    });
    expect((await runCli(['adopt', '--yes', '-c', fleet.configFile])).code).toBe(0);
    expect(await withClient(url, (c) => slowPathChangingOver(c))).toBe(false);
    const holder = await adminClient(url);
    try {
      // An application transaction that has drawn an id and is still open.
      await holder.query(`begin; select rr0.next_id()`);
      const again = await runCli(['adopt', '--yes', '-c', fleet.configFile]);
      expect(again.code).toBe(0);
      expect(await withClient(url, (c) => slowPathChangingOver(c))).toBe(false);
    } finally {
      await holder.query('rollback');
      await holder.end();
    }
  });

  it('--dry-run prints the SQL per host and changes nothing', async () => {
    await buildArticleFleet(refusals.urls, 'dry', split4);
    const fleet = makeFleet({
      urls: refusals.urls,
      shards: 4,
      split: split4,
      schemaPrefix: 'dry',
      migrations: { '0001_article.sql': BASELINE },
    });
    const before = await Promise.all(refusals.urls.map((url) => catalog(url, 'dry')));
    const run = await runCli(['adopt', '--dry-run', '--baseline', '1', '-c', fleet.configFile]);
    expect(run.code).toBe(0);
    expect(run.stdout).toContain('-- host pg1');
    expect(run.stdout).toContain('-- host pg2');
    expect(run.stdout).toContain('ALTER SEQUENCE "dry3"."table_id_seq" CACHE 1;');
    expect(run.stdout).toContain('CREATE OR REPLACE FUNCTION "dry3".next_id(OUT result bigint)');
    expect(run.stdout).toMatch(/INSERT INTO "shardctl"\.migrations .* VALUES \(2, 1, '0001_article'/);
    expect(await Promise.all(refusals.urls.map((url) => catalog(url, 'dry')))).toEqual(before);
  });

  it('names a bad --baseline or --shards (exit 2), and asks for --yes without a terminal, changing nothing', async () => {
    await buildArticleFleet(refusals.urls, 'uf', split4);
    const fleet = makeFleet({
      urls: refusals.urls,
      shards: 4,
      split: split4,
      schemaPrefix: 'uf',
      migrations: { '0001_article.sql': BASELINE },
    });
    const before = await Promise.all(refusals.urls.map((url) => catalog(url, 'uf')));
    const cases: [string[], RegExp][] = [
      [['--baseline', 'one'], /option --baseline "one": not a migration version/],
      [['--baseline', '9', '--yes'], /option --baseline 9: no migration file has version 9/],
      [['--shards', '2-9', '--yes'], /option --shards/],
      [[], /needs confirmation: pass --yes/],
    ];
    for (const [args, message] of cases) {
      const run = await runCli(['adopt', ...args, '-c', fleet.configFile]);
      expect(run.stderr).toMatch(message);
      expect(run.code).toBe(2);
    }
    expect(await Promise.all(refusals.urls.map((url) => catalog(url, 'uf')))).toEqual(before);
  });

  it("refuses a sequence another table's default draws from, also when the default names it as text (nextval('s'::text), as databases from before PostgreSQL 8.1 have them)", async () => {
    await buildArticleFleet(refusals.urls, 'tx', split4);
    const fleet = makeFleet({ urls: refusals.urls, shards: 4, split: split4, schemaPrefix: 'tx', migrations: {} });
    await withClient(refusals.urls[0]!, async (c) => {
      await c.query(`create table tx0.counters (id bigint primary key default nextval('tx0.table_id_seq'::text))`);
      await c.query(
        `create table tx1.counters (id bigint primary key default nextval(('tx1.table_id_seq'::text)::regclass))`,
      );
    });
    const before = await Promise.all(refusals.urls.map((url) => catalog(url, 'tx')));
    const run = await runCli(['adopt', '--yes', '-c', fleet.configFile]);
    expect(run.code, run.stdout + run.stderr).toBe(3);
    for (const shard of [0, 1])
      expect(run.stderr).toContain(
        `sequence tx${shard}.table_id_seq is also the default of tx${shard}.counters: moving it would change those ids`,
      );
    expect(await Promise.all(refusals.urls.map((url) => catalog(url, 'tx')))).toEqual(before);
  });

  it('refuses a sequence that other code draws from: a trigger function naming it (in another schema too), a view; the refusal names each and nothing changes', async () => {
    await buildArticleFleet(refusals.urls, 'tz', split4);
    const fleet = makeFleet({ urls: refusals.urls, shards: 4, split: split4, schemaPrefix: 'tz', migrations: {} });
    await withClient(refusals.urls[0]!, async (c) => {
      // A trigger that sets the id itself, as some article-built fleets do for a table without the default.
      await c.query(`create table tz0.comments (id bigint primary key, body text)`);
      await c.query(`create function public.comment_id() returns trigger language plpgsql as $$
        begin new.id := nextval('tz0.TABLE_ID_SEQ'); return new; end $$`);
      await c.query(
        `create trigger comment_id before insert on tz0.comments for each row execute function public.comment_id()`,
      );
      await c.query(`create view tz1.peek as select last_value from tz1.table_id_seq`);
    });
    const before = await Promise.all(refusals.urls.map((url) => catalog(url, 'tz')));
    const run = await runCli(['adopt', '--yes', '-c', fleet.configFile]);
    expect(run.code, run.stdout + run.stderr).toBe(3);
    // The function's text names a sequence called table_id_seq: every shard on that host draws from one.
    for (const shard of [0, 1])
      expect(run.stderr).toContain(
        `sequence tz${shard}.table_id_seq is also used by function public.comment_id(): after adoption the sequence counts shardctl's positions`,
      );
    expect(run.stderr).toContain('sequence tz1.table_id_seq is also used by rule _RETURN on view tz1.peek');
    expect(run.stderr).not.toMatch(/tz[23]\.table_id_seq is also used/);
    expect(await Promise.all(refusals.urls.map((url) => catalog(url, 'tz')))).toEqual(before);
    // Once the trigger calls next_id(), as adoption needs, and the view is gone, nothing is refused
    // (a dry run: the databases are shared with the tests after this one).
    await withClient(refusals.urls[0]!, async (c) => {
      await c.query(`create or replace function public.comment_id() returns trigger language plpgsql as $$
        begin new.id := tz0.next_id(); return new; end $$`);
      await c.query(`drop view tz1.peek`);
    });
    const accepted = await runCli(['adopt', '--dry-run', '-c', fleet.configFile]);
    expect(accepted.code, accepted.stderr).toBe(0);
    expect(accepted.stderr).not.toContain('is also used by');
    await withClient(refusals.urls[0]!, (c) => c.query('drop function public.comment_id() cascade'));
  });

  it('--baseline refuses when a file creates a table a shard does not have', async () => {
    await buildArticleFleet(refusals.urls, 'ue', split4);
    const fleet = makeFleet({
      urls: refusals.urls,
      shards: 4,
      split: split4,
      schemaPrefix: 'ue',
      migrations: {
        '0001_article.sql': BASELINE,
        '0002_tags.sql': 'CREATE TABLE tags (id bigint PRIMARY KEY, name text);\n',
      },
    });
    const before = await Promise.all(refusals.urls.map((url) => catalog(url, 'ue')));
    const run = await runCli(['adopt', '--yes', '--baseline', '2', '-c', fleet.configFile]);
    expect(run.stderr).toMatch(/host pg2, shard 3 \(ue3\): baseline: table ue3\.tags does not exist/);
    expect(run.code).toBe(3);
    expect(await Promise.all(refusals.urls.map((url) => catalog(url, 'ue')))).toEqual(before);
  });

  it('--baseline refuses when the files create an index or a NOT NULL the shards do not have, and accepts them once the shards have them', async () => {
    await buildArticleFleet(refusals.urls, 'ix', split4);
    const files =
      BASELINE +
      'CREATE UNIQUE INDEX likes_once ON likes (photo_id, user_id);\nCREATE TABLE tags (id bigint PRIMARY KEY, name text NOT NULL);\n';
    for (const [i, url] of refusals.urls.entries()) {
      await withClient(url, async (c) => {
        for (const shard of i === 0 ? [0, 1] : [2, 3])
          await c.query(`CREATE TABLE ix${shard}.tags (id bigint, name text)`);
      });
    }
    const fleet = makeFleet({
      urls: refusals.urls,
      shards: 4,
      split: split4,
      schemaPrefix: 'ix',
      migrations: { '0001_article.sql': files },
    });
    const before = await Promise.all(refusals.urls.map((url) => catalog(url, 'ix')));
    const run = await runCli(['adopt', '--yes', '--baseline', '1', '-c', fleet.configFile]);
    expect(run.stderr).toMatch(/host pg2, shard 3 \(ix3\): baseline: index ix3\.likes_once does not exist/);
    expect(run.stderr).toMatch(/shard 3 \(ix3\): baseline: index ix3\.tags_pkey does not exist/);
    expect(run.stderr).toMatch(
      /shard 3 \(ix3\): baseline: table ix3\.tags has columns \(id bigint, name text\), the files create \(id bigint not null, name text not null\)/,
    );
    expect(run.code).toBe(3);
    expect(await Promise.all(refusals.urls.map((url) => catalog(url, 'ix')))).toEqual(before);

    for (const [i, url] of refusals.urls.entries()) {
      await withClient(url, async (c) => {
        for (const shard of i === 0 ? [0, 1] : [2, 3]) {
          await c.query(`CREATE UNIQUE INDEX likes_once ON ix${shard}.likes (photo_id, user_id);
            ALTER TABLE ix${shard}.tags ADD PRIMARY KEY (id), ALTER COLUMN name SET NOT NULL`);
        }
      });
    }
    const again = await runCli(['adopt', '--yes', '--baseline', '1', '-c', fleet.configFile]);
    expect(again.stderr).not.toContain('does not exist');
    expect(again.stderr).toContain('baseline: 0001_article recorded as applied');
    expect(again.code).toBe(0);
  });

  it('--baseline accepts a column whose type the schema itself defines (an enum), and refuses one of another enum', async () => {
    const split = ['0-1', '2-3'];
    await buildArticleFleet(enums.urls, 'en', split);
    for (const [i, url] of enums.urls.entries()) {
      await withClient(url, async (c) => {
        for (const shard of i === 0 ? [0, 1] : [2, 3]) {
          await c.query(`CREATE TYPE en${shard}.mood AS ENUM ('happy', 'sad');
            ALTER TABLE en${shard}.photos ADD COLUMN mood en${shard}.mood, ADD COLUMN moods en${shard}.mood[]`);
        }
      });
    }
    const withMood = BASELINE.replace(
      'CREATE TABLE photos (',
      "CREATE TYPE mood AS ENUM ('happy', 'sad');\nCREATE TABLE photos (\n  mood mood,\n  moods mood[],",
    );
    // The same columns, of another enum of the schema: still refused.
    const other = withMood
      .replace('CREATE TYPE mood', 'CREATE TYPE feeling')
      .replace('mood mood,', 'mood feeling,')
      .replace('moods mood[],', 'moods feeling[],');
    const wrong = makeFleet({
      urls: enums.urls,
      shards: 4,
      split,
      schemaPrefix: 'en',
      migrations: { '0001_article.sql': other },
    });
    const refused = await runCli(['adopt', '--yes', '--baseline', '1', '-c', wrong.configFile]);
    expect(refused.stderr).toMatch(
      /shard 0 \(en0\): baseline: table en0\.photos has columns \(.*mood mood, moods mood\[\].*\), the files create \(.*mood feeling, moods feeling\[\]/,
    );
    expect(refused.code).toBe(3);

    const fleet = makeFleet({
      urls: enums.urls,
      shards: 4,
      split,
      schemaPrefix: 'en',
      migrations: { '0001_article.sql': withMood },
    });
    const run = await runCli(['adopt', '--yes', '--baseline', '1', '-c', fleet.configFile]);
    expect(run.stderr).not.toContain('baseline: table');
    expect(run.code).toBe(0);
  });

  it('a role that may create the control schema on one host and not on the other: refused naming that host and the grant, nothing written on either', async () => {
    const suffix = randomBytes(4).toString('hex');
    const [operator, password] = [`creator_${suffix}`, `pw_${suffix}`];
    const asOperator = (url: string): string => {
      const u = new URL(url);
      u.username = operator;
      u.password = password;
      return u.toString();
    };
    for (const [i, url] of noCreate.urls.entries())
      await withClient(url, async (c) => {
        const database = decodeURIComponent(new URL(url).pathname.slice(1));
        await c.query(`CREATE ROLE ${operator} LOGIN PASSWORD '${password}'`);
        if (i === 0) await c.query(`GRANT CREATE ON DATABASE "${database}" TO ${operator}`);
      });
    try {
      const fleet = makeFleet({
        urls: noCreate.urls.map(asOperator),
        shards: 4,
        split: split4,
        schemaPrefix: 'nc',
        migrations: { '0001_article.sql': BASELINE },
      });
      for (const command of [['init'], ['adopt', '--yes']]) {
        const run = await runCli([...command, '-c', fleet.configFile]);
        expect(run.code, run.stdout + run.stderr).toBe(1);
        expect(run.stderr).toMatch(
          new RegExp(
            `host pg2: ${operator} may not create the control schema shardctl in database \\S+ .*GRANT CREATE ON DATABASE`,
          ),
        );
        expect(run.stderr).not.toContain(password);
        for (const url of noCreate.urls)
          expect(
            await withClient(
              url,
              async (c) =>
                (await c.query<{ n: number }>(`select count(*)::int as n from pg_namespace where nspname = 'shardctl'`))
                  .rows[0]!.n,
            ),
          ).toBe(0);
      }
    } finally {
      for (const url of noCreate.urls)
        await withClient(url, async (c) => {
          await c.query(`DROP OWNED BY ${operator} CASCADE`);
          await c.query(`DROP ROLE ${operator}`);
        });
    }
  });

  it("an operator without the rights of the shards' owner: refused per shard, naming the owner and the grant (exit 3, nothing changed); a member of it adopts", async () => {
    const suffix = randomBytes(4).toString('hex');
    const [owner, operator, password] = [`legacy_${suffix}`, `adopter_${suffix}`, `pw_${suffix}`];
    const asOperator = (url: string): string => {
      const u = new URL(url);
      u.username = operator;
      u.password = password;
      return u.toString();
    };
    for (const [i, url] of owned.urls.entries())
      await withClient(url, async (c) => {
        const database = decodeURIComponent(new URL(url).pathname.slice(1));
        await c.query(`CREATE ROLE ${owner}; CREATE ROLE ${operator} LOGIN PASSWORD '${password}'`);
        await c.query(`GRANT CREATE ON DATABASE "${database}" TO ${owner}, ${operator}`);
        // The fleet as its builders left it: every object theirs.
        await c.query(
          `SET ROLE ${owner}; ${articleShardSql('own', 2 * i)} ${articleShardSql('own', 2 * i + 1)} RESET ROLE`,
        );
      });
    try {
      const fleet = makeFleet({
        urls: owned.urls.map(asOperator),
        shards: 4,
        split: split4,
        schemaPrefix: 'own',
        migrations: { '0001_article.sql': BASELINE },
      });
      const before = await Promise.all(owned.urls.map((url) => catalog(url, 'own')));
      const refused = await runCli(['adopt', '--yes', '--baseline', '1', '-c', fleet.configFile]);
      expect(refused.code, refused.stderr).toBe(3);
      for (const [host, shard] of [
        ['pg1', 0],
        ['pg2', 3],
      ] as const)
        expect(refused.stderr).toContain(
          `host ${host}, shard ${shard} (own${shard}): ${operator} may not change the schema's objects, owned by ${owner}: run adopt as that role or a superuser, or GRANT "${owner}" TO "${operator}"`,
        );
      expect(refused.stderr).not.toContain('permission denied');
      expect(await Promise.all(owned.urls.map((url) => catalog(url, 'own')))).toEqual(before);

      for (const url of owned.urls) await withClient(url, (c) => c.query(`GRANT ${owner} TO ${operator}`));
      const adopted = await runCli(['adopt', '--yes', '--baseline', '1', '-c', fleet.configFile]);
      expect(adopted.code, adopted.stderr).toBe(0);
      const id = await withClient(
        asOperator(owned.urls[1]!),
        async (c) =>
          (
            await c.query<{ id: string }>(
              `insert into own3.photos (user_id, image_url) values (1, 'x') returning id::text`,
            )
          ).rows[0]!.id,
      );
      expect(decodeId(BigInt(id), (await fleet.config()).idLayout).shard).toBe(3);
    } finally {
      for (const url of owned.urls)
        await withClient(url, async (c) => {
          await c.query(`DROP OWNED BY ${owner}, ${operator} CASCADE`);
          await c.query(`DROP ROLE ${operator}; DROP ROLE ${owner}`);
        });
    }
  });
});
