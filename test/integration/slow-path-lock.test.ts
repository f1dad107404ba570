import pg from 'pg';
import { describe, expect, it } from 'vitest';
import { init } from '../../src/commands/init.js';
import { status } from '../../src/commands/status.js';
import { CONTROL_VERSION, controlSchemaSql, finishSlowPath } from '../../src/fleet/control.js';
import { ID_LOCK_TABLES, SLOW_PATH_CHANGING_COMMENT, SLOW_PATH_COMMENT } from '../../src/id/sql.js';
import { makeFleet } from '../helpers/fleet.js';
import { errorOf, useTestDatabases, withClient } from '../helpers/hosts.js';

/**
 * next_id's slow path locks a table, not a row (control schema version 6): no transaction id per
 * call. And the change-over of a host whose slow path locked a row: both locks until no transaction
 * that may still run the earlier body is left, then the table lock alone.
 */

const db = useTestDatabases(1);
const dbChange = useTestDatabases(1);

/**
 * Runs fn in a transaction and counts the transaction ids given out meanwhile that ended aborted: a
 * slow path that locks a row gives each call's sub-transaction an id, and its rollback aborts it.
 * Other sessions of the server (other test files) take ids at the same time, so the ids are told
 * apart by their status, not counted: few of theirs abort.
 */
async function abortedIdsDuring(client: pg.Client, fn: () => Promise<void>): Promise<number> {
  await client.query(`begin`);
  const first = (await client.query<{ x: string }>(`select pg_current_xact_id()::text as x`)).rows[0]!.x;
  await fn();
  const next = (await client.query<{ x: string }>(`select pg_snapshot_xmax(pg_current_snapshot())::text as x`)).rows[0]!
    .x;
  await client.query(`commit`);
  const r = await client.query<{ n: number }>(
    `select count(*)::int as n from generate_series($1::bigint + 1, $2::bigint - 1) x
      where pg_xact_status(x::text::xid8) = 'aborted'`,
    [first, next],
  );
  return r.rows[0]!.n;
}

async function slowPathComment(client: pg.Client): Promise<string | null> {
  const r = await client.query<{ c: string | null }>(
    `select obj_description('shardctl.next_id_locked(regclass, integer)'::regprocedure, 'pg_proc') as c`,
  );
  return r.rows[0]!.c;
}

/** The lock table of a sequence's slot. */
async function lockTableOf(client: pg.Client, seq: string): Promise<string> {
  const r = await client.query<{ n: number }>(`select ($1::regclass::oid::bigint % ${ID_LOCK_TABLES})::int as n`, [
    seq,
  ]);
  return `shardctl.id_lock_${r.rows[0]!.n}`;
}

/** Makes insta0's next insert take the slow path: its sequence moved back to the epoch's first millisecond. */
async function idle(client: pg.Client): Promise<void> {
  await client.query(`select setval('insta0.photos_id_seq', 1024)`);
}

async function insert(client: pg.Client): Promise<void> {
  await client.query(`insert into insta0.photos (user_id, image_url) values (1, 'x')`);
}

/** One insert into insta0.photos that takes the slow path. */
async function insertBySlowPath(client: pg.Client): Promise<void> {
  await idle(client);
  await insert(client);
}

/** How many calls of the slow path this database has counted (track_functions = 'pl'). */
async function slowPathCalls(client: pg.Client): Promise<number> {
  await client.query(`select pg_stat_force_next_flush()`);
  const r = await client.query<{ calls: string | null }>(
    `select calls::text from pg_stat_user_functions where funcid = 'shardctl.next_id_locked(regclass, integer)'::regprocedure`,
  );
  return Number(r.rows[0]?.calls ?? 0);
}

describe("next_id's slow path", () => {
  it('takes no transaction id: 100 calls that each find the sequence idle abort no sub-transaction id', async () => {
    const fleet = makeFleet({ urls: db.urls, shards: 2 });
    expect((await init(await fleet.config())).ok).toBe(true);
    await withClient(db.urls[0]!, async (client) => {
      // init finished the change-over on a fresh host: the table lock alone.
      expect(await slowPathComment(client)).toBe(SLOW_PATH_COMMENT);
      const version = await client.query<{ v: number }>(`select max(control_version) as v from shardctl.layout`);
      expect(version.rows[0]!.v).toBe(CONTROL_VERSION);
      await client.query(`set track_functions = 'pl'`);
      const callsBefore = await slowPathCalls(client);
      const aborted = await abortedIdsDuring(client, async () => {
        for (let i = 0; i < 100; i += 1) {
          // 6 ms apart: each draw finds the sequence behind the clock by more than the lag (1 ms)
          // and the lead a busy sequence is given (3 ms).
          await client.query(`select pg_sleep(0.006)`);
          await client.query(`insert into insta0.photos (user_id, image_url) values ($1, 'x')`, [i]);
        }
      });
      // A row lock's sub-transactions: 100 aborted ids.
      expect(aborted).toBeLessThan(20);
      expect((await slowPathCalls(client)) - callsBefore).toBe(100);
    });
  });

  it('waits for a session holding its lock table; a missing table makes it refuse (SC005) until init restores it', async () => {
    await withClient(db.urls[0]!, async (holder) => {
      const table = await lockTableOf(holder, 'insta0.photos_id_seq');
      await holder.query(`begin`);
      await holder.query(`lock table ${table} in exclusive mode`);
      await withClient(db.urls[0]!, async (client) => {
        await client.query(`set lock_timeout = '200ms'`);
        const error = await errorOf(insertBySlowPath(client));
        expect(error.code).toBe('55P03');
      });
      await holder.query(`rollback`);
      await holder.query(`drop table ${table}`);
      await holder.query(`select setval('insta0.photos_id_seq', 1024)`);
      const error = await errorOf(holder.query(`insert into insta0.photos (user_id, image_url) values (1, 'x')`));
      expect(error.code).toBe('SC005');
      expect(error.message).toBe(
        'next_id: a lock table of sequence insta0.photos_id_seq is missing from schema shardctl',
      );
    });
    const fleet = makeFleet({ urls: db.urls, shards: 2 });
    expect((await init(await fleet.config())).ok).toBe(true);
    await withClient(db.urls[0]!, (client) => insertBySlowPath(client));
  });
});

describe("the slow path's change-over from its row lock", () => {
  it('takes both locks until every transaction that held a sequence lock before it has ended, then the table lock alone', async () => {
    const fleet = makeFleet({ urls: dbChange.urls, shards: 2 });
    const config = await fleet.config();
    expect((await init(config)).ok).toBe(true);
    const url = dbChange.urls[0]!;
    await withClient(url, async (client) => {
      const older = new pg.Client({ connectionString: url });
      await older.connect();
      try {
        // A transaction that drew before the change-over: it may still run the body it replaces.
        await older.query(`begin`);
        await older.query(`select nextval('insta1.photos_id_seq')`);
        // As on a host of control schema version 5 upgraded by this release: the steps again,
        // which install the slow path changing over.
        await client.query(controlSchemaSql(config));
        expect(await slowPathComment(client)).toBe(SLOW_PATH_CHANGING_COMMENT);

        // Changing over, the slow path takes the row lock too: a session holding the sequence's
        // row keeps it waiting.
        await withClient(url, async (rowHolder) => {
          await rowHolder.query(`begin`);
          await rowHolder.query(
            `select from shardctl.id_locks where slot = ('insta0.photos_id_seq'::regclass::oid::bigint % 8192)::int for no key update`,
          );
          await client.query(`set lock_timeout = '200ms'`);
          expect((await errorOf(insertBySlowPath(client))).code).toBe('55P03');
          await client.query(`reset lock_timeout`);
          await rowHolder.query(`rollback`);
        });
        await insertBySlowPath(client);

        // Not finished while the older transaction runs; status says so, without counting it a problem.
        const started = performance.now();
        expect(await finishSlowPath(client, config, { waitMs: 300 })).toBe(false);
        expect(performance.now() - started).toBeGreaterThanOrEqual(290);
        expect(await slowPathComment(client)).toBe(SLOW_PATH_CHANGING_COMMENT);
        const during = await status(config);
        expect(during.hosts[0]!.slowPathChangingOver).toBe(true);
        expect(during.hosts[0]!.ok).toBe(true);
        // Once it has ended: finished, and the row lock is not taken any more.
        await older.query(`commit`);
        expect(await finishSlowPath(client, config, { waitMs: 300 })).toBe(true);
        expect(await slowPathComment(client)).toBe(SLOW_PATH_COMMENT);
        expect((await status(config)).hosts[0]!.slowPathChangingOver).toBe(false);
      } finally {
        await older.end();
      }
      await withClient(url, async (rowHolder) => {
        await rowHolder.query(`begin`);
        await rowHolder.query(`select from shardctl.id_locks for no key update`);
        // Not waiting on the row lock any more, and no transaction id per call.
        await client.query(`set lock_timeout = '200ms'`);
        const aborted = await abortedIdsDuring(client, async () => {
          // 6 ms apart, each takes the slow path (setval back instead would repeat ids).
          for (let i = 0; i < 50; i += 1) {
            await client.query(`select pg_sleep(0.006)`);
            await insert(client);
          }
        });
        expect(aborted).toBeLessThan(10);
        await rowHolder.query(`rollback`);
      });
      // Finished stays finished.
      expect(await finishSlowPath(client, config)).toBe(true);
    });
  });
});

describe("the slow path's lock tables and its function's owner", () => {
  const dbOwner = useTestDatabases(1);

  it('a lock table created by another role than the slow path runs as (a superuser restoring it) is granted to that role', async () => {
    const fleet = makeFleet({ urls: dbOwner.urls, shards: 2 });
    expect((await init(await fleet.config())).ok).toBe(true);
    const owner = `slow_path_owner_${process.pid}`;
    await withClient(dbOwner.urls[0]!, async (client) => {
      // The slow path owned by a role of its own, with what it needs on the shard's sequence.
      await client.query(`create role ${owner}`);
      await client.query(`grant usage on schema shardctl, insta0 to ${owner}`);
      await client.query(`grant usage, select, update on sequence insta0.photos_id_seq to ${owner}`);
      await client.query(`alter function shardctl.next_id_locked(regclass, integer) owner to ${owner}`);
      const table = await lockTableOf(client, 'insta0.photos_id_seq');
      await client.query(`drop table ${table}`);
    });
    try {
      // init, as the superuser, creates the table again.
      expect((await init(await fleet.config())).ok).toBe(true);
      await withClient(dbOwner.urls[0]!, async (client) => {
        const table = await lockTableOf(client, 'insta0.photos_id_seq');
        const granted = await client.query<{ ok: boolean }>(`select has_table_privilege($1, $2, 'UPDATE') as ok`, [
          owner,
          table,
        ]);
        expect(granted.rows[0]!.ok).toBe(true);
        await insertBySlowPath(client);
      });
    } finally {
      await withClient(dbOwner.urls[0]!, async (client) => {
        await client.query(`alter function shardctl.next_id_locked(regclass, integer) owner to current_user`);
        await client.query(`drop owned by ${owner}`);
        await client.query(`drop role ${owner}`);
      });
    }
  });
});
