/**
 * Moves against real schemas and real application load (issue 11): transactions that write several
 * tables in any order, enum/domain/composite/reg* columns, sequences in every state, unlogged
 * tables, materialized views, a transaction that holds back slot creation, a run killed during the
 * preflight's probe, and messages that name where things happened.
 */
import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { init, moveShard, moveShards, shardMovedTo, status, type HostError } from '../../src/index.js';
import { type Fleet, makeFleet, runCli, FIXTURE_MIGRATIONS } from '../helpers/fleet.js';
import { adminClient, useTestDatabases, withClient } from '../helpers/hosts.js';
import {
  fleetState,
  pastIncomingGuard,
  removeCliSnapshot,
  replicationObjects,
  spawnCli,
  startShardWriter,
  waitForMoveSessionsToEnd,
} from '../helpers/moves.js';
import { runSqlBlocking } from '../helpers/faults.js';
import { ShardMap } from '../../src/config/shard-map.js';
import { REALWORLD_TABLES, realworldMigrations, realworldSeedSql, realworldWriterSql } from '../fixtures/realworld.js';
import { mkdirSync, readdirSync, readFileSync, rmdirSync } from 'node:fs';
import { dirname, join } from 'node:path';

afterAll(async () => {
  await removeCliSnapshot();
});

const examples = Object.fromEntries(
  readdirSync(FIXTURE_MIGRATIONS).map((f) => [f, readFileSync(join(FIXTURE_MIGRATIONS, f), 'utf8')]),
);

/** A two-host fleet (pg1 holds every shard, pg2 none) on the databases of the calling describe. */
function twoHosts(extraMigrations: Record<string, string> = {}) {
  const db = useTestDatabases(2);
  let fleet: Fleet;
  beforeAll(async () => {
    fleet = makeFleet({
      urls: db.urls,
      shards: 8,
      split: ['0-7', ''],
      migrations: { ...examples, ...extraMigrations },
    });
    expect((await init(await fleet.config())).ok).toBe(true);
  });
  return {
    db,
    get fleet() {
      return fleet;
    },
  };
}

function failure(promise: Promise<unknown>): Promise<(Error & { code?: string }) | null> {
  return promise.then(
    () => null,
    (error: Error & { code?: string }) => error,
  );
}

describe('the fence and application transactions that write several tables', () => {
  const env = twoHosts();

  it.each([
    ['online', 1],
    ['offline', 3],
  ] as const)(
    '%s: never deadlocks with a transaction holding one table and then writing another; the application commits, the fence retries and the move finishes',
    async (mode, shard) => {
      const config = await env.fleet.config();
      const app = await adminClient(env.db.urls[0]!);
      const watcher = await adminClient(env.db.urls[0]!);
      app.on('error', () => undefined);
      try {
        // The lock an INSERT takes, without a transaction id yet (so slot creation does not wait for it).
        await app.query('BEGIN');
        await app.query(`LOCK TABLE insta${shard}.photos IN ROW EXCLUSIVE MODE`);
        const notices: string[] = [];
        const moving = moveShard(config, shard, 'pg2', {
          mode,
          configFile: env.fleet.configFile,
          onNotice: (m) => notices.push(m),
        });
        // Wait until the fence (or the preparation of its triggers) holds likes and waits for photos:
        // a transaction of the move that locks one table at a time (the change logs' triggers) is
        // not the one this test is about, and the application's next write would pass it.
        let fencing = false;
        let seen = '';
        for (let i = 0; i < 600 && !fencing; i++) {
          const r = await watcher.query<{ pid: number; query: string }>(
            `select w.pid, left(a.query, 200) as query
               from pg_locks w join pg_stat_activity a on a.pid = w.pid
              where a.application_name = 'shardctl move' and w.mode = 'ShareRowExclusiveLock'
                and not w.granted and w.relation = $1::regclass
                and exists (select 1 from pg_locks h where h.pid = w.pid and h.mode = 'ShareRowExclusiveLock'
                            and h.granted and h.relation = $2::regclass)`,
            [`insta${shard}.photos`, `insta${shard}.likes`],
          );
          fencing = (r.rowCount ?? 0) > 0;
          seen = JSON.stringify(r.rows);
          if (!fencing) await new Promise((resolve) => setTimeout(resolve, 20));
        }
        if (!fencing) {
          // What of the move's did hold or wait for a lock on the shard's tables, for the message.
          const r = await watcher.query(
            `select l.relation::regclass::text as rel, l.mode, l.granted, l.pid, left(a.query, 200) as query
               from pg_locks l join pg_stat_activity a on a.pid = l.pid
              where a.application_name = 'shardctl move' and l.relation::regclass::text like $1`,
            [`insta${shard}.%`],
          );
          seen = JSON.stringify(r.rows);
        }
        expect(fencing, `never saw the move hold likes and wait for photos; its locks now: ${seen}`).toBe(true);
        // The application's next table is one the fence locks before photos (name order): likes.
        const second = await failure(app.query(`insert into insta${shard}.likes (photo_id, user_id) values (1, 2)`));
        const commit = await failure(app.query('COMMIT'));
        expect([second?.code ?? null, commit?.code ?? null]).toEqual([null, null]);
        const result = await moving;
        expect(result.outcome).toBe('moved');
        // The fence, or the preparation of its triggers before it, met the application's lock and let go.
        expect(
          notices.some((n) =>
            /fence attempt \d+ waits for|fenced 1 shard in \d+ attempts|the fence of 1 shard of wave 1 was (not prepared|prepared in \d+ attempts) \(tables were busy\)/.test(
              n,
            ),
          ),
          `notices: ${notices.join('\n')}\nthe move's transaction seen waiting: ${seen}`,
        ).toBe(true);
        await withClient(env.db.urls[1]!, async (c) => {
          expect((await c.query(`select 1 from insta${shard}.likes where photo_id = 1 and user_id = 2`)).rowCount).toBe(
            1,
          );
        });
      } finally {
        await app.end();
        await watcher.end();
      }
    },
  );

  it('a batch whose fence group meets a busy table: that group is fenced again shard by shard, the move finishes, the application commits', async () => {
    const config = await env.fleet.config();
    const app = await adminClient(env.db.urls[0]!);
    app.on('error', () => undefined);
    try {
      // The lock an INSERT takes, without a transaction id yet (so slot creation does not wait for it).
      await app.query('BEGIN');
      await app.query(`LOCK TABLE insta5.photos IN ROW EXCLUSIVE MODE`);
      const notices: string[] = [];
      // The application writes and commits a while after the copy is streaming: longer than the
      // preparation of the fence retries (1 s), so that the fence meets its lock.
      let release: NodeJS.Timeout | undefined;
      let committed: Promise<unknown> | undefined;
      const result = await moveShards(config, [4, 5, 6], 'pg2', {
        configFile: env.fleet.configFile,
        onNotice: (m) => notices.push(m),
        onStep: (step) => {
          if (step === 'synced') {
            release = setTimeout(() => {
              committed = app.query(`insert into insta5.photos (user_id, image_url) values (5, 'held'); commit`);
            }, 3000);
          }
        },
      }).finally(() => clearTimeout(release));
      expect(result.outcome).toBe('moved');
      expect(committed).toBeDefined();
      await committed;
      // One group of three that failed, then one transaction per shard.
      expect(
        notices.find((n) => /fenced 3 shards in \d+ attempts/.test(n)),
        notices.join('\n'),
      ).toBeDefined();
      await withClient(env.db.urls[1]!, async (c) => {
        expect((await c.query(`select 1 from insta5.photos where image_url = 'held'`)).rowCount).toBe(1);
      });
    } finally {
      await app.end();
    }
  });

  it('under writers whose transactions touch two tables in random order, no application transaction fails but with the fence’s SC100, and every commit arrives', async () => {
    const config = await env.fleet.config();
    let stop = false;
    const committed: string[] = [];
    const unexpected: string[] = [];
    const writers = Array.from({ length: 4 }, async (_, w) => {
      const client = await adminClient(env.db.urls[0]!);
      client.on('error', () => undefined);
      let n = 0;
      while (!stop) {
        const tag = `w${w}-${n++}`;
        const statements = [
          `insert into insta2.photos (user_id, image_url) values (${w}, '${tag}')`,
          `insert into insta2.comments (photo_id, user_id, body) values (${w}, ${w}, '${tag}')`,
        ];
        if (Math.random() < 0.5) statements.reverse();
        try {
          await client.query('BEGIN');
          for (const sql of statements) await client.query(sql);
          await new Promise((resolve) => setTimeout(resolve, Math.random() * 20));
          await client.query('COMMIT');
          committed.push(tag);
        } catch (error) {
          await client.query('ROLLBACK').catch(() => undefined);
          if (shardMovedTo(error)) break; // the fence: this writer would now reload its map
          unexpected.push(`${(error as { code?: string }).code}: ${(error as Error).message}`);
          // A broken connection fails every query at once: no loop that starves the timers.
          if ((error as { code?: string }).code === undefined) break;
        }
      }
      await client.end();
    });
    await new Promise((resolve) => setTimeout(resolve, 300));
    // The writers stop whatever the move does: a failed move must fail the test, not leave them running.
    const result = await moveShard(config, 2, 'pg2', { configFile: env.fleet.configFile }).finally(() => (stop = true));
    await Promise.all(writers);
    expect(result.outcome).toBe('moved');
    expect(unexpected).toEqual([]);
    expect(committed.length).toBeGreaterThan(0);
    await withClient(env.db.urls[1]!, async (c) => {
      const photos = new Set(
        (await c.query<{ t: string }>(`select image_url as t from insta2.photos`)).rows.map((r) => r.t),
      );
      const comments = new Set(
        (await c.query<{ t: string }>(`select body as t from insta2.comments`)).rows.map((r) => r.t),
      );
      expect(committed.filter((t) => !photos.has(t) || !comments.has(t))).toEqual([]);
    });
  });
});

const TYPES = `CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE DOMAIN mood_d AS mood;
CREATE TYPE pair AS (m mood, n int);
CREATE TABLE feelings (id bigint PRIMARY KEY, m mood, ms mood[], d mood_d, p pair, ps pair[], r regclass, t regtype, rs regclass[]);
`;

describe('columns whose values depend on OIDs: enums (in arrays, domains and composites) and reg* types', () => {
  const env = twoHosts({ '0004_feelings.sql': TYPES });

  it.each(['online', 'offline'] as const)('%s: carries every value by name and verifies by value', async (mode) => {
    const shard = mode === 'online' ? 3 : 4;
    // Types created on the target first, so the same types get other OIDs there.
    await withClient(env.db.urls[1]!, (c) =>
      c.query(
        `create type shift_${mode}_1 as enum ('a'); create type shift_${mode}_2 as enum ('b'); create table shift_${mode} (x int)`,
      ),
    );
    await withClient(env.db.urls[0]!, (c) =>
      c.query(`insert into insta${shard}.feelings values
        (1, 'happy', '{sad,ok}', 'ok', row('sad', 1), array[row('happy', 2)::insta${shard}.pair], 'insta${shard}.photos', 'insta${shard}.mood', array['insta${shard}.likes'::regclass]),
        (2, 'sad', '{}', null, null, null, 'insta${shard}.feelings', 'insta${shard}.pair', null)`),
    );
    const text = `select row(f.*)::text as t from insta${shard}.feelings f order by id`;
    const before = await withClient(env.db.urls[0]!, (c) => c.query<{ t: string }>(text));
    const result = await moveShard(await env.fleet.config(), shard, 'pg2', { mode, configFile: env.fleet.configFile });
    expect(result.outcome).toBe('moved');
    await withClient(env.db.urls[1]!, async (c) => {
      expect((await c.query<{ t: string }>(text)).rows).toEqual(before.rows);
      // The reg* values name the target's objects (not the source's OIDs).
      const r = await c.query<{ ok: boolean }>(
        `select r::oid = 'insta${shard}.photos'::regclass::oid and t::oid = 'insta${shard}.mood'::regtype::oid as ok from insta${shard}.feelings where id = 1`,
      );
      expect(r.rows[0]!.ok).toBe(true);
    });
  });
});

const UNHASHED = `CREATE TABLE docs (id bigint PRIMARY KEY, body json, at point, tags json[]);
CREATE TABLE notes (id bigint PRIMARY KEY, t int, body text);
CREATE COLLATION case_blind (provider = icu, locale = 'und-u-ks-level2', deterministic = false);
CREATE TABLE handles (id bigint PRIMARY KEY, handle text COLLATE case_blind);
`;

describe('columns without a hash function (json, point, json[]) and a column named t', () => {
  const env = twoHosts({ '0004_docs.sql': UNHASHED });
  const seed = (shard: number) =>
    withClient(env.db.urls[0]!, (c) =>
      c.query(`insert into insta${shard}.docs values (1, '{"a": [1, 2]}', point(1, 2), array['{}'::json]), (2, null, null, null);
        insert into insta${shard}.notes values (1, 7, 'first'), (2, 7, 'second')`),
    );
  const rows = (url: string, shard: number) =>
    withClient(url, async (c) => [
      ...(await c.query<{ r: string }>(`select row(d.*)::text as r from insta${shard}.docs d order by id`)).rows,
      ...(await c.query<{ r: string }>(`select row(n.*)::text as r from insta${shard}.notes n order by id`)).rows,
    ]);

  it.each(['online', 'offline'] as const)('%s: moves and verifies them', async (mode) => {
    const shard = mode === 'online' ? 1 : 2;
    await seed(shard);
    const before = await rows(env.db.urls[0]!, shard);
    const result = await moveShard(await env.fleet.config(), shard, 'pg2', { mode, configFile: env.fleet.configFile });
    expect(result.outcome).toBe('moved');
    expect(result.verification).toMatchObject({ ok: true });
    expect(await rows(env.db.urls[1]!, shard)).toEqual(before);
  });

  /**
   * Moves `shard` with `sql` run on the target's copy once it is synced: the move must fail its
   * verification naming `table`, and the shard stay on pg1.
   */
  async function expectTamperingFound(shard: number, sql: string, table: string) {
    let tampering: Promise<unknown> | null = null;
    const error = await failure(
      moveShard(await env.fleet.config(), shard, 'pg2', {
        configFile: env.fleet.configFile,
        onStep: (step) => {
          if (step === 'synced') tampering = withClient(env.db.urls[1]!, (c) => c.query(pastIncomingGuard(sql)));
        },
      }),
    );
    expect(tampering).not.toBeNull();
    await (tampering as Promise<unknown> | null);
    expect(error).toMatchObject({ code: 'VERIFY_FAILED' });
    expect((error as HostError & { details: string[] }).details.join('\n')).toContain(`insta${shard}.${table}`);
    expect((await ShardMap.load(env.fleet.configFile)).hostForShard(shard).name).toBe('pg1');
  }

  it('finds a difference in a column other than t, in a table with a column named t', async () => {
    await seed(3);
    // The target's copy differs from the source's in `body` only, where `t` is equal.
    await expectTamperingFound(3, `update insta3.notes set body = 'tampered' where id = 1`, 'notes');
  });

  it('finds a change of case in a column of a case-insensitive collation, where equal values hash alike', async () => {
    await withClient(env.db.urls[0]!, (c) => c.query(`insert into insta4.handles values (1, 'Ada'), (2, 'Grace')`));
    // 'ada' = 'Ada' in the column's collation, and its hash function hashes them alike.
    await expectTamperingFound(4, `update insta4.handles set handle = 'ada' where id = 1`, 'handles');
  });
});

describe('a type with a hash function on the source only', () => {
  const env = twoHosts({ '0004_amounts.sql': 'CREATE TABLE amounts (id bigint PRIMARY KEY, amount numeric);\n' });

  it('is checksummed by its text: the hash functions are probed on both hosts', async () => {
    // What a target of another major without numeric's extended hash function would be: the
    // function removed from this test database's catalog on pg2.
    await withClient(env.db.urls[1]!, (c) =>
      c.query(`DELETE FROM pg_amproc WHERE amproc = 'hash_numeric_extended'::regproc`),
    );
    await withClient(env.db.urls[0]!, (c) => c.query(`insert into insta1.amounts values (1, 1.5), (2, null)`));
    const result = await moveShard(await env.fleet.config(), 1, 'pg2', { configFile: env.fleet.configFile });
    expect(result.outcome).toBe('moved');
    expect(result.verification).toMatchObject({ ok: true });
  });
});

describe('sequences in every state', () => {
  const env = twoHosts({
    '0004_sequences.sql': `CREATE SEQUENCE s_fresh;
CREATE SEQUENCE s_called;
CREATE SEQUENCE s_uncalled;
CREATE SEQUENCE s_desc INCREMENT -1 START -1 MAXVALUE -1;
CREATE TABLE counters (id serial PRIMARY KEY, v int);
`,
  });
  const next = new Map<string, string>();

  beforeAll(async () => {
    await withClient(env.db.urls[0]!, (c) =>
      c.query(`select nextval('insta5.s_called') from generate_series(1, 5);
               select setval('insta5.s_uncalled', 101, false);
               select nextval('insta5.s_desc') from generate_series(1, 3);
               insert into insta5.counters (id, v) select g, g from generate_series(1, 100) g;
               select setval('insta5.counters_id_seq', 101, false);`),
    );
    expect((await moveShard(await env.fleet.config(), 5, 'pg2', { configFile: env.fleet.configFile })).outcome).toBe(
      'moved',
    );
    await withClient(env.db.urls[1]!, async (c) => {
      for (const seq of ['s_fresh', 's_called', 's_uncalled', 's_desc'])
        next.set(seq, (await c.query<{ v: string }>(`select nextval('insta5.${seq}')::text as v`)).rows[0]!.v);
      // The issue's recipe: the first insert after setval(..., 101, false) takes 101, no duplicate key.
      next.set(
        'counters',
        (
          await c.query<{ id: number }>(`insert into insta5.counters (v) values (0) returning id`)
        ).rows[0]!.id.toString(),
      );
    });
  });

  it.each([
    ['s_fresh', '1'],
    ['s_called', '6'],
    ['s_uncalled', '101'],
    ['s_desc', '-4'],
    ['counters', '101'],
  ])('%s hands out %s next on the target', (seq, value) => {
    expect(next.get(seq)).toBe(value);
  });
});

describe('unlogged tables and materialized views', () => {
  const env = twoHosts({
    '0004_cache.sql': 'CREATE UNLOGGED TABLE cache (k int PRIMARY KEY, v text);\n',
    '0005_counts.sql':
      'CREATE MATERIALIZED VIEW photo_counts AS SELECT user_id, count(*) AS n FROM photos GROUP BY user_id;\n',
  });

  it('an online move refuses UNLOGGED tables before changing anything, naming them; offline carries them', async () => {
    await withClient(env.db.urls[0]!, (c) => c.query(`insert into insta6.cache values (1, 'a'), (2, 'b')`));
    const before = await fleetState(env.db.urls, env.fleet.configFile);
    const run = await runCli(['move-shard', '6', '--to', 'pg2', '--yes', '-c', env.fleet.configFile]);
    expect(run.code).toBe(1);
    expect(run.stderr).toContain(
      '  - logged tables: table insta6.cache is UNLOGGED, which logical replication does not carry; ALTER TABLE … SET LOGGED, or use --mode offline',
    );
    expect(await fleetState(env.db.urls, env.fleet.configFile)).toEqual(before);
    const offline = await runCli([
      'move-shard',
      '6',
      '--to',
      'pg2',
      '--mode',
      'offline',
      '--yes',
      '-c',
      env.fleet.configFile,
    ]);
    expect(offline.code, offline.stderr).toBe(0);
    expect(
      await withClient(env.db.urls[1]!, (c) => c.query(`select k from insta6.cache order by k`).then((r) => r.rows)),
    ).toEqual([{ k: 1 }, { k: 2 }]);
  });

  it('refreshes materialized views on the target after the switch and says so', async () => {
    await withClient(env.db.urls[0]!, (c) =>
      c.query(
        `insert into insta7.photos (user_id, image_url) select g % 3, 'x' from generate_series(1, 30) g; refresh materialized view insta7.photo_counts`,
      ),
    );
    const run = await runCli([
      'move-shard',
      '7',
      '--to',
      'pg2',
      '--mode',
      'offline',
      '--yes',
      '-c',
      env.fleet.configFile,
    ]);
    expect(run.code, run.stderr).toBe(0);
    expect(run.stdout).toContain('materialized views refreshed on pg2: insta7.photo_counts');
    const counts = await withClient(env.db.urls[1]!, (c) =>
      c.query<{ n: string }>(`select sum(n)::text as n from insta7.photo_counts`),
    );
    expect(counts.rows[0]!.n).toBe('30');
  });
});

describe('waits that say what they wait for', () => {
  const env = twoHosts();

  it('a transaction holding an xid on the source server holds back the slot: named within seconds, the move stops at the limit, resumable', async () => {
    const holder = await adminClient(env.db.hosts[0]!.url); // another database on the same server
    holder.on('error', () => undefined);
    try {
      await holder.query('BEGIN');
      const pid = (await holder.query<{ pid: number }>('select pg_backend_pid() as pid, pg_current_xact_id()')).rows[0]!
        .pid;
      const notices: string[] = [];
      const error = (await failure(
        moveShard(await env.fleet.config(), 1, 'pg2', {
          configFile: env.fleet.configFile,
          waitTimeoutMs: 5000,
          onNotice: (m) => notices.push(m),
        }),
      )) as HostError | null;
      expect(error?.code).toBe('SLOT_WAIT_TIMEOUT');
      expect(error?.message).toContain(`host pg1, shard 1: creating the replication slot waited`);
      expect(error?.message).toContain(`pid ${pid}`);
      expect(
        notices.some(
          (n) => n.includes('creating the replication slot waits for open transactions') && n.includes(`pid ${pid}`),
        ),
      ).toBe(true);
    } finally {
      await holder.query('COMMIT').catch(() => undefined);
      await holder.end();
    }
    const resumed = await runCli(['move-shard', '1', '--resume', '--yes', '-c', env.fleet.configFile]);
    expect(resumed.code, resumed.stderr).toBe(0);
  });
});

describe('leftovers and messages after a kill', () => {
  const env = twoHosts();

  it('a run killed during the reachability probe leaves a recorded probe: status lists it, --abort and gc drop it', async () => {
    for (const clear of [
      ['move-shard', '2', '--abort', '--yes'],
      ['gc', '--yes'],
    ]) {
      const run = await spawnCli(['move-shard', '2', '--to', 'pg2', '--yes', '-c', env.fleet.configFile], {
        SHARDCTL_FAULT_AFTER_STEP: 'probe',
      });
      expect(run.signal).toBe('SIGKILL');
      await waitForMoveSessionsToEnd(env.db.urls);
      const report = await runCli(['status', '-c', env.fleet.configFile]);
      expect(report.code).toBe(3);
      expect(report.stdout).toMatch(
        /left by killed runs \(shardctl gc drops them\): probe-subscription shardctl_probe_\d+_[0-9a-f]+/,
      );
      const cleared = await runCli([...clear, '-c', env.fleet.configFile]);
      expect(cleared.code, cleared.stderr).toBe(0);
      expect(`${cleared.stdout}${cleared.stderr}`).toMatch(/probe-subscription shardctl_probe_/);
      // pg_subscription is shared by every database of the cluster: only this test's database counts
      // (test files running beside it probe their own targets on the same server).
      const subs = await withClient(env.db.urls[1]!, (c) =>
        c.query(
          `select 1 from pg_subscription where subname like 'shardctl_probe%' and subdbid = (select oid from pg_database where datname = current_database())`,
        ),
      );
      expect(subs.rowCount).toBe(0);
      expect((await status(await env.fleet.config())).hosts.flatMap((h) => h.leftovers)).toEqual([]);
    }
  });

  it('a resumed move reports every row and the write block of the killed run too; migrate and init name the unfinished move meanwhile', async () => {
    await withClient(env.db.urls[0]!, (c) =>
      c.query(`insert into insta4.photos (user_id, image_url) select g, 's' from generate_series(1, 120) g`),
    );
    const killed = await spawnCli(['move-shard', '4', '--to', 'pg2', '--yes', '-c', env.fleet.configFile], {
      SHARDCTL_FAULT_AFTER_STEP: 'fenced',
    });
    expect(killed.signal).toBe('SIGKILL');
    await waitForMoveSessionsToEnd(env.db.urls);
    const moveId = /move (\w+): shard 4 from pg1 to pg2/.exec(killed.stderr)?.[1];
    expect(moveId).toBeDefined();
    for (const command of ['migrate', 'init']) {
      const run = await runCli([command, '-c', env.fleet.configFile]);
      expect(run.code).toBe(1);
      expect(run.stderr).toContain(
        `shard 4 is in the unfinished move ${moveId} from pg1 to pg2 (last step done: fenced); finish it (resume) or undo it (abort), then run this again`,
      );
      expect(run.stderr).toContain('\nnext: shardctl move-shard 4 --resume, or shardctl move-shard 4 --abort\n');
    }
    await new Promise((resolve) => setTimeout(resolve, 1500));
    const resumed = await runCli(['move-shard', '4', '--resume', '--json', '--yes', '-c', env.fleet.configFile]);
    expect(resumed.code, resumed.stderr).toBe(0);
    const result = JSON.parse(resumed.stdout) as { rowsMoved: string; writeBlockedMs: number };
    expect(result.rowsMoved).toBe('120');
    expect(result.writeBlockedMs).toBeGreaterThanOrEqual(1500);
  });
});

describe('a failure on the target', () => {
  const env = twoHosts();

  it('a failure on the target names the target, not the source', async () => {
    // Something outside the shard schema that only the source has (a role missing there is refused by the preflight).
    const fn = `source_only_${randomBytes(3).toString('hex')}`;
    await withClient(env.db.urls[0]!, (c) =>
      c.query(`create function public.${fn}() returns int language sql as 'select 1'`),
    );
    env.fleet.writeMigration('0004_uses_public.sql', `CREATE VIEW uses_public AS SELECT public.${fn}() AS x;\n`);
    try {
      expect((await runCli(['migrate', '-c', env.fleet.configFile])).code).toBe(0);
      const run = await runCli(['move-shard', '3', '--to', 'pg2', '--yes', '-c', env.fleet.configFile]);
      expect(run.code).toBe(1);
      expect(run.stderr).toMatch(
        new RegExp(
          `host pg2, shard 3: move \\S+ failed at step target-created: cannot create the target copy: function public\\.${fn}\\(\\) does not exist .*; resume the move to retry, or abort it to undo`,
        ),
      );
      expect(run.stderr).toContain('next: shardctl move-shard 3 --resume, or shardctl move-shard 3 --abort');
      expect((await runCli(['move-shard', '3', '--abort', '--yes', '-c', env.fleet.configFile])).code).toBe(0);
    } finally {
      await withClient(env.db.urls[0]!, (c) => c.query(`drop function public.${fn}() cascade`));
    }
  });
});

describe('a failure in a round trip of several target copies', () => {
  const env = twoHosts();

  it('names the shard that failed, keeps what committed before it, and --resume builds the rest', async () => {
    // A check every shard passes on the source; on the target it refuses shard 5, the third of the
    // four copies sent in one round trip (an offline move builds its batch at once).
    const fn = `refuse_${randomBytes(3).toString('hex')}`;
    const define = (refused: string) =>
      `create function public.${fn}() returns int language plpgsql as $$ begin ` +
      `if current_schema() = '${refused}' then raise exception 'refused for %', current_schema(); end if; return 1; end $$`;
    await withClient(env.db.urls[0]!, (c) => c.query(define('none')));
    await withClient(env.db.urls[1]!, (c) => c.query(define('insta5')));
    env.fleet.writeMigration('0004_checked.sql', `SELECT public.${fn}();\n`);
    try {
      expect((await runCli(['migrate', '-c', env.fleet.configFile])).code).toBe(0);
      const args = ['move-shard', '3-6', '--to', 'pg2', '--mode', 'offline', '--yes', '-c', env.fleet.configFile];
      const run = await runCli(args);
      expect(run.code).toBe(1);
      expect(run.stderr).toMatch(
        /host pg2, shard 5: move \S+ failed at step target-created: cannot create the target copy: refused for insta5/,
      );
      const built = await withClient(env.db.urls[1]!, (c) =>
        c.query<{ shard: number; versions: string }>(
          `select s.shard, string_agg(m.version::text, ',' order by m.version) as versions from shardctl.shards s
             join shardctl.migrations m using (shard) where s.shard between 3 and 6 group by s.shard order by s.shard`,
        ),
      );
      expect(built.rows).toEqual([
        { shard: 3, versions: '1,2,3,4' },
        { shard: 4, versions: '1,2,3,4' },
        // Each migration commits on its own: shard 5's copy stops before the one refused.
        { shard: 5, versions: '1,2,3' },
      ]);
      await withClient(env.db.urls[1]!, (c) =>
        c.query(define('none').replace('create function', 'create or replace function')),
      );
      const resumed = await runCli(['move-shard', '3-6', '--resume', '--yes', '-c', env.fleet.configFile]);
      expect(resumed.code, resumed.stderr).toBe(0);
      const active = await withClient(env.db.urls[1]!, (c) =>
        c.query<{ n: number }>(
          `select count(*)::int as n from shardctl.shards where shard between 3 and 6 and state = 'active'`,
        ),
      );
      expect(active.rows[0]!.n).toBe(4);
    } finally {
      for (const url of env.db.urls) await withClient(url, (c) => c.query(`drop function public.${fn}() cascade`));
    }
  });
});

describe('a map that cannot be rewritten at the switch', () => {
  const env = twoHosts();

  it('says the target is live and to fix it and --resume (not --abort), leaves no temporary file, and --resume finishes', async () => {
    // The rewrite writes <config>.shardctl-<pid>.tmp first: a directory in its way makes it fail.
    const blocker = `${env.fleet.configFile}.shardctl-${process.pid}.tmp`;
    mkdirSync(blocker);
    try {
      const run = await runCli([
        'move-shard',
        '5',
        '--to',
        'pg2',
        '--mode',
        'offline',
        '--yes',
        '-c',
        env.fleet.configFile,
      ]);
      expect(run.code).toBe(1);
      expect(run.stderr).toContain('host pg2, shard 5: the target copy of shard 5 is active, but the map');
      expect(run.stderr).toContain(`Fix that and resume the move (it can no longer be aborted)`);
      expect(run.stderr).toContain('\nnext: shardctl move-shard 5 --resume\n');
      expect(run.stderr).not.toContain('--abort');
      const refused = await runCli(['move-shard', '5', '--abort', '--yes', '-c', env.fleet.configFile]);
      expect(refused.code).toBe(1);
      expect(refused.stderr).toContain('it cannot be aborted');
    } finally {
      rmdirSync(blocker);
    }
    expect(readdirSync(dirname(env.fleet.configFile)).filter((f) => f.includes('.tmp'))).toEqual([]);
    const resumed = await runCli(['move-shard', '5', '--resume', '--yes', '-c', env.fleet.configFile]);
    expect(resumed.code, resumed.stderr).toBe(0);
    expect(readFileSync(env.fleet.configFile, 'utf8')).toMatch(/name: pg2\n(?: {4}(?!shards:).*\n)*\s+shards: "5"/);
  });
});

/** Every row of a table as text, sorted: a full comparison of two copies. */
async function allRowsOf(url: string, table: string): Promise<string[]> {
  return withClient(url, async (c) =>
    (await c.query<{ r: string }>(`select t::text as r from ${table} t order by 1`)).rows.map((r) => r.r),
  );
}

describe('a real-world schema (test/fixtures/realworld) under a writer', () => {
  const db = useTestDatabases(2);

  it('moves identity and generated columns, TOAST, deferrable cascades, RLS, partitions and a keyless table: both copies equal row for row', async () => {
    const fleet = makeFleet({ urls: db.urls, shards: 4, split: ['0-1', '2-3'], migrations: realworldMigrations() });
    expect((await init(await fleet.config())).ok).toBe(true);
    await withClient(db.urls[0]!, (c) => c.query(realworldSeedSql('insta1', 500)));
    const map = await ShardMap.load(fleet.configFile);
    // Once during the cut-over (once the move's change logs exist on the source, before the fence),
    // the writer's transaction also empties the keyless table; the table `truncate_once` on the
    // source is the flag, dropped by that transaction.
    await withClient(db.urls[0]!, (c) => c.query('create table public.truncate_once ()'));
    const truncateOnce = `DO $$ BEGIN
      IF to_regclass('public.truncate_once') IS NOT NULL AND EXISTS (
           SELECT FROM pg_trigger WHERE tgname = 'shardctl_delta' AND tgrelid = 'insta1.audit_log'::regclass AND tgenabled <> 'D') THEN
        DROP TABLE public.truncate_once;
        TRUNCATE insta1.audit_log;
      END IF;
    END $$;`;
    const writer = startShardWriter(map, 1, (i) =>
      realworldWriterSql('insta1', i).replace('BEGIN;', () => `BEGIN;\n${truncateOnce}`),
    );
    await new Promise((resolve) => setTimeout(resolve, 300));

    // The writer stops while the shard is fenced (it is refused then anyway), so that nothing changes
    // after the switch and both copies can be compared whole.
    let stopping = null as Promise<void> | null;
    const result = await moveShard(await fleet.config(), 1, 'pg2', {
      configFile: fleet.configFile,
      onStep: (step) => {
        if (step === 'verified') stopping = writer.stop();
      },
    });
    expect(stopping).not.toBeNull();
    await stopping;

    expect(result.outcome).toBe('moved');
    expect(writer.writes).toBeGreaterThan(10);
    const truncated = await withClient(
      db.urls[0]!,
      async (c) =>
        (await c.query<{ done: boolean }>(`select to_regclass('public.truncate_once') is null as done`)).rows[0]!.done,
    );
    expect(truncated).toBe(true);
    // Nothing was checksummed over all its rows while fenced: the keyed tables and partitions by
    // their changed keys, the keyless table from its change logs, a table empty when the cut-over
    // began by its size (still empty) or whole (holding only the cut-over's rows).
    expect(result.verification).toMatchObject({ ok: true, whole: [], truncated: [], byLog: { tables: 1 } });
    // Verified one by one: the tables that hold rows (the partitions, not their parent).
    const leaves = REALWORLD_TABLES.filter((t) => t !== 'events');
    expect(result.verification!.tables.map((t) => t.table).sort()).toEqual([...leaves].sort());
    const { byKey, empty, filled } = result.verification!;
    expect(byKey.tables + empty + filled.length).toBe(leaves.length - 1);
    expect(byKey.tables).toBeGreaterThanOrEqual(leaves.length - 2);
    expect(await replicationObjects(db.urls)).toEqual([]);
    const renamed = await withClient(
      db.urls[0]!,
      async (c) =>
        (await c.query<{ nspname: string }>(`select nspname from pg_namespace where nspname like 'insta1\\_moved\\_%'`))
          .rows[0]!.nspname,
    );
    for (const table of REALWORLD_TABLES) {
      expect(await allRowsOf(db.urls[1]!, `insta1.${table}`), table).toEqual(
        await allRowsOf(db.urls[0]!, `"${renamed}".${table}`),
      );
    }
    expect((await allRowsOf(db.urls[0]!, `"${renamed}".accounts`)).length).toBeGreaterThan(500);
    // The identity column goes on after the rows it carried.
    await withClient(db.urls[1]!, async (c) => {
      const next = await c.query<{ n: string; max: string }>(
        `insert into insta1.accounts (handle) values ('after-move') returning legacy_no::text as n, (select max(legacy_no)::text from insta1.accounts) as max`,
      );
      expect(BigInt(next.rows[0]!.n)).toBeGreaterThan(BigInt(next.rows[0]!.max));
    });
  });
});

describe('a real-world schema: a change lost on the way to the target during the cut-over', () => {
  const db = useTestDatabases(2);

  // A row the source commits during the cut-over, after the pre-verification's snapshot P and
  // before the fence, that the target silently drops: a BEFORE INSERT trigger there, ALWAYS, so it
  // fires for the apply worker. The source's change log has the row, the target's figure does not
  // (from its log on the keyless audit_log, from its changed keys on the keyed events, where no key
  // of the row is recorded). After P by construction: a session on the source waits until the
  // move's log exists on the table (or partition) the row goes to, takes its ROW EXCLUSIVE lock
  // (which the fence's lock waits for, and nothing before P needs), waits until the move's snapshot
  // holder there is idle in its transaction, inserts the row and commits.
  it.each([
    {
      table: 'audit_log',
      shard: 0,
      insert: `INSERT INTO {s}.audit_log (actor, action) VALUES (-1, 'lost')`,
      leaves: ['audit_log'],
      into: 'audit_log',
      named: /table insta0\.audit_log: \d+ rows on the source, \d+ on the target/,
    },
    {
      table: 'events',
      shard: 1,
      insert: `INSERT INTO {s}.events (account_id, kind) VALUES (-1, 'lost')`,
      leaves: ['events_2026', 'events_2027', 'events_other'],
      into: 'events_2026',
      named: /table insta1\.events_\w+ \(a partition of insta1\.events\): \d+ rows on the source, \d+ on the target/,
    },
  ])(
    'is found in the $table table, the move undone and its change logs removed from both hosts',
    async ({ table, shard, insert, leaves, into, named }) => {
      const schema = `insta${shard}`;
      const fleet = makeFleet({ urls: db.urls, shards: 4, split: ['0-1', '2-3'], migrations: realworldMigrations() });
      expect((await init(await fleet.config())).ok).toBe(true);
      await withClient(db.urls[0]!, (c) => c.query(realworldSeedSql(schema, 200)));
      const writer = startShardWriter(await ShardMap.load(fleet.configFile), shard, (i) =>
        realworldWriterSql(schema, i),
      );
      const until = (condition: string, what: string): string => `
        WHILE NOT (${condition}) LOOP
          IF clock_timestamp() > started + interval '60 seconds' THEN RAISE EXCEPTION 'waited 60 s for ${what}'; END IF;
          PERFORM pg_sleep(0.001);
          PERFORM pg_stat_clear_snapshot();
        END LOOP;`;
      const loseAfterP = `BEGIN;
        DO $$ DECLARE started timestamptz := clock_timestamp(); BEGIN
          ${until(
            `EXISTS (SELECT FROM pg_trigger WHERE tgname = 'shardctl_delta' AND tgrelid = '${schema}.${into}'::regclass AND tgenabled <> 'D')`,
            'the change log',
          )}
          LOCK TABLE ${schema}.${into} IN ROW EXCLUSIVE MODE;
          ${until(
            `EXISTS (SELECT FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'shardctl move verify'
                        AND state = 'idle in transaction' AND backend_xmin IS NOT NULL)`,
            'the snapshot P',
          )}
          ${insert.replace('{s}', schema)};
        END $$;
        COMMIT;`;
      let lost: Promise<unknown> | undefined;
      const dropLost = leaves
        .map(
          (
            leaf,
          ) => `CREATE TRIGGER lose BEFORE INSERT ON ${schema}.${leaf} FOR EACH ROW WHEN (NEW.account_id = -1 OR NEW.actor = -1) EXECUTE FUNCTION public.lose();
                   ALTER TABLE ${schema}.${leaf} ENABLE ALWAYS TRIGGER lose;`,
        )
        .join('\n')
        .replace(
          /NEW\.account_id = -1 OR NEW\.actor = -1/g,
          table === 'events' ? 'NEW.account_id = -1' : 'NEW.actor = -1',
        );
      let losing: number | null | undefined;
      const error = await failure(
        moveShard(await fleet.config(), shard, 'pg2', {
          configFile: fleet.configFile,
          onStep: (step) => {
            // The target's copy exists and streams; the cut-over has not begun. It begins once the
            // trigger is there (the move waits), so the row cannot reach the target before it.
            if (step === 'synced') {
              losing = runSqlBlocking(
                db.urls[1]!,
                `CREATE OR REPLACE FUNCTION public.lose() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$; ${dropLost}`,
              );
              lost = withClient(db.urls[0]!, (c) => c.query(loseAfterP)).then(
                () => null,
                (error: unknown) => error,
              );
            }
          },
        }),
      );
      await writer.stop();
      expect(losing).toBe(0);
      expect(await lost).toBeNull();
      expect(error).toMatchObject({ code: 'VERIFY_FAILED' });
      const details = (error as HostError & { details: string[] }).details;
      expect(details, details.join('\n')).toHaveLength(1);
      expect(details[0]).toMatch(named);
      // Aborted: the source is writable and nothing of the move logs there any more (a trigger whose
      // table the writer held at every removal may stay, calling the function that does nothing);
      // no log entry is left.
      for (const url of db.urls) {
        const left = await withClient(
          url,
          async (c) =>
            (
              await c.query<{ triggers: number; entries: number }>(
                `select (select count(*)::int from pg_trigger t join pg_proc p on p.oid = t.tgfoid
                          where t.tgname like 'shardctl\\_delta%' and t.tgenabled <> 'D'
                            and p.prosrc !~ '^\\s*BEGIN RETURN NULL; END\\s*$') as triggers,
                    (select case when to_regclass('shardctl.move_deltas') is null then 0 else (select count(*)::int from shardctl.move_deltas) end) as entries`,
              )
            ).rows[0]!,
        );
        expect(left, url).toEqual({ triggers: 0, entries: 0 });
      }
      expect((await ShardMap.load(fleet.configFile)).hostForShard(shard).name).toBe('pg1');
      await withClient(db.urls[0]!, (c) => c.query(realworldWriterSql(schema, 100_000)));
    },
  );
});

// A source table kept busy for longer than the change logs' set-up may wait (5 s): an application
// transaction holds its ROW EXCLUSIVE lock from before the move until the move says it gave up.
// The move goes on without the logs and says what that costs: the keyless table checksummed whole
// while fenced, the keyed ones compared by their changed keys alone.
describe('a real-world schema: a source too busy for the change logs', () => {
  const db = useTestDatabases(2);

  it('moves without them, saying so; the keyless table checksummed whole while fenced, no trigger left on', async () => {
    const fleet = makeFleet({ urls: db.urls, shards: 4, split: ['0-1', '2-3'], migrations: realworldMigrations() });
    expect((await init(await fleet.config())).ok).toBe(true);
    await withClient(db.urls[0]!, (c) => c.query(realworldSeedSql('insta1', 200)));
    const holder = await adminClient(db.urls[0]!);
    try {
      await holder.query('BEGIN; LOCK TABLE insta1.accounts IN ROW EXCLUSIVE MODE');
      const notices: string[] = [];
      let released: Promise<unknown> | undefined;
      const result = await moveShard(await fleet.config(), 1, 'pg2', {
        configFile: fleet.configFile,
        onNotice: (message) => {
          notices.push(message);
          if (message.includes('no change logs')) released ??= holder.query('COMMIT');
        },
      });
      expect(released).toBeDefined();
      await released;
      expect(result.outcome).toBe('moved');
      const given = notices.find((n) => n.includes('no change logs'))!;
      expect(given).toMatch(/^host pg1: no change logs for the wave's tables \(.*lock timeout.*\); /);
      expect(given).toContain('1 table without a usable key is checksummed whole while fenced');
      expect(given).toMatch(
        /\d+ keyed tables are compared by their changed keys alone, which cannot see a change replication loses after the snapshot/,
      );
      expect(result.verification).toMatchObject({ ok: true, whole: ['insta1.audit_log'], byLog: { tables: 0 } });
      expect(result.verification!.byKey.tables).toBeGreaterThan(0);
    } finally {
      await holder.end();
    }
    for (const url of db.urls) {
      const on = await withClient(
        url,
        async (c) =>
          (
            await c.query<{ n: number }>(
              `select count(*)::int as n from pg_trigger where tgname like 'shardctl\\_%' and tgname <> 'shardctl_fence' and tgenabled <> 'D'`,
            )
          ).rows[0]!.n,
      );
      expect(on, url).toBe(0);
    }
  });
});

describe('a real-world schema: a run killed during the cut-over', () => {
  const db = useTestDatabases(2);

  const deltaTriggers = (url: string) =>
    withClient(
      url,
      async (c) =>
        (
          await c.query<{ n: number }>(
            `select count(*)::int as n from pg_trigger where tgname like 'shardctl\\_delta%' and tgenabled <> 'D'`,
          )
        ).rows[0]!.n,
    );

  it.each([
    { then: '--abort', shard: 0 },
    { then: '--resume', shard: 1 },
  ])(
    'leaves change logs on the fenced source; $then removes them from both hosts and the source takes writes unlogged',
    async ({ then, shard }) => {
      const schema = `insta${shard}`;
      const fleet = makeFleet({ urls: db.urls, shards: 4, split: ['0-1', '2-3'], migrations: realworldMigrations() });
      expect((await init(await fleet.config())).ok).toBe(true);
      await withClient(db.urls[0]!, (c) => c.query(realworldSeedSql(schema, 100)));
      const args = ['move-shard', String(shard), '--to', 'pg2', '--yes', '-c', fleet.configFile];
      const killed = await spawnCli(args, { SHARDCTL_FAULT_AFTER_STEP: 'fenced' });
      expect(killed.signal, killed.stderr).toBe('SIGKILL');
      await waitForMoveSessionsToEnd(db.urls);
      // The keyless table's log on both hosts, and the keyed tables' on the source.
      const logged = await withClient(db.urls[0]!, async (c) =>
        (
          await c.query<{ relname: string }>(
            `select distinct c.relname from pg_trigger t join pg_class c on c.oid = t.tgrelid
                where t.tgname like 'shardctl\\_delta%' and t.tgenabled <> 'D' order by 1`,
          )
        ).rows.map((r) => r.relname),
      );
      expect(logged).toContain('audit_log');
      expect(logged).toContain('accounts');
      expect(logged).toContain('events_2026');
      expect(await deltaTriggers(db.urls[1]!)).toBe(2);

      // Named with it, a target or a mode the move did not record is refused, naming what it keeps;
      // the same command again with the flag (its own target) goes on.
      const otherTarget = await runCli([
        'move-shard',
        String(shard),
        '--to',
        'pg1',
        then,
        '--yes',
        '-c',
        fleet.configFile,
      ]);
      expect(otherTarget.code, otherTarget.stderr).toBe(2);
      expect(otherTarget.stderr).toMatch(
        new RegExp(
          `option --to "pg1": the unfinished move \\S+ of shard ${shard} is online, from pg1 to pg2, and keeps its target; give --to pg2 or none`,
        ),
      );
      const otherMode = await runCli([...args, '--mode', 'offline', then]);
      expect(otherMode.code, otherMode.stderr).toBe(2);
      expect(otherMode.stderr).toContain('option --mode "offline": the unfinished move');
      expect(otherMode.stderr).toContain('and keeps its mode; give --mode online or none');
      const run = await runCli([...args, then]);
      expect(run.code, run.stderr).toBe(0);
      // Aborted: none left. Moved: none on the target; on the source only those of the old copy,
      // which refuses every write, and their function switched off (it does nothing).
      expect(await deltaTriggers(db.urls[1]!)).toBe(0);
      const left = await withClient(
        db.urls[0]!,
        async (c) =>
          (
            await c.query<{ schema: string; off: boolean }>(
              `select distinct n.nspname as schema, p.prosrc ~ '^\\s*BEGIN RETURN NULL; END\\s*$' as off
                 from pg_trigger t join pg_class c on c.oid = t.tgrelid join pg_namespace n on n.oid = c.relnamespace
                 join pg_proc p on p.oid = t.tgfoid
                where t.tgname like 'shardctl\\_delta%' and t.tgenabled <> 'D'`,
            )
          ).rows,
      );
      if (then === '--abort') expect(left).toEqual([]);
      else
        expect(left).toEqual([{ schema: expect.stringMatching(new RegExp(`^${schema}_moved_`)) as string, off: true }]);
      const owner = then === '--abort' ? 0 : 1;
      await withClient(db.urls[owner]!, (c) => c.query(realworldWriterSql(schema, 1)));
      const entries = await withClient(
        db.urls[owner]!,
        async (c) =>
          (
            await c.query<{ n: number }>(
              `select case when to_regclass('shardctl.move_deltas') is null then 0 else (select count(*)::int from shardctl.move_deltas) end as n`,
            )
          ).rows[0]!.n,
      );
      expect(entries).toBe(0);
    },
  );
});
