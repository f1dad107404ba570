/**
 * The change logs that verify tables without a usable key while fenced (src/moves/tail.ts,
 * sql/move_deltas.sql), driven step by step on two hosts: logs set up, snapshot P taken, changes
 * made after P on each host by sessions with their own settings, then verified as the cut-over
 * does. Whatever happened after P on each host, the result must be what a whole checksum says.
 */
import type pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { init } from '../../src/index.js';
import { runTransaction } from '../../src/pg/quiet.js';
import { keyedTables, shardTables } from '../../src/moves/catalog.js';
import { endPreVerification, hashMethods, preVerify, verifyShards } from '../../src/moves/verify.js';
import { DELTA_TRIGGERS } from '../../src/moves/sql/names.js';
import { DELTAS_DONE_SQL, startDeltasSql, startTrackingSql } from '../../src/moves/sql/tail.js';
import { readChanges, startSourceDeltas, stopDeltas, stopTracking } from '../../src/moves/tail.js';
import { makeFleet } from '../helpers/fleet.js';
import { adminClient, useTestDatabases } from '../helpers/hosts.js';

const SCHEMA = 'vt';

/** A keyless table of a user-defined type (checksummed by text) and one of built-in types only (by the record hash). */
const SETUP = `
DROP SCHEMA IF EXISTS ${SCHEMA} CASCADE;
CREATE SCHEMA ${SCHEMA};
CREATE DOMAIN ${SCHEMA}.score AS numeric(6, 2);
CREATE TABLE ${SCHEMA}.audit (at timestamptz, ratio float8, span interval, s ${SCHEMA}.score, note text);
CREATE TABLE ${SCHEMA}.plain (a int, b text);
INSERT INTO ${SCHEMA}.audit SELECT timestamptz '2026-01-01 12:00+00' + g * interval '1 hour', g / 3.0, g * interval '90 seconds', g, 'row ' || g FROM generate_series(1, 50) g;
INSERT INTO ${SCHEMA}.plain SELECT g, 'p' || g FROM generate_series(1, 50) g;`;

/** Writes on both hosts the same way: what replication would apply. */
const SAME = `
INSERT INTO ${SCHEMA}.audit VALUES ('2026-11-24 08:00:00.123456+00', 0.1, interval '1 day 2 hours', 1.5, 'new');
UPDATE ${SCHEMA}.audit SET note = 'edited', ratio = ratio * 2 WHERE s < 5;
DELETE FROM ${SCHEMA}.audit WHERE s BETWEEN 10 AND 12;
INSERT INTO ${SCHEMA}.plain VALUES (1, 'p1');
UPDATE ${SCHEMA}.plain SET b = 'twice' WHERE a = 1;
DELETE FROM ${SCHEMA}.plain WHERE a = 2;`;

const TRUNCATE_THEN_INSERT = `
INSERT INTO ${SCHEMA}.audit VALUES ('2026-11-24 09:00+00', 1, interval '1 hour', 2, 'before the truncate');
TRUNCATE ${SCHEMA}.audit;
INSERT INTO ${SCHEMA}.audit VALUES ('2026-05-01 10:00+02', 0.3, interval '3 minutes', 7, 'after the truncate');
UPDATE ${SCHEMA}.audit SET note = 'after, edited';`;

/** Another application's session: its text forms differ from the checksum's fixed ones. */
const APP_SETTINGS = `SET timezone = 'Asia/Kolkata'; SET datestyle = 'SQL, DMY'; SET intervalstyle = 'sql_standard'; SET extra_float_digits = 0;`;

/**
 * Two initialised hosts and, once they are up, four sessions: source, target, then a second
 * (work) session on each.
 */
function useTwoHosts(): { db: ReturnType<typeof useTestDatabases>; clients: pg.Client[] } {
  const db = useTestDatabases(2);
  const clients: pg.Client[] = [];
  beforeAll(async () => {
    const fleet = makeFleet({ urls: db.urls, shards: 2, split: ['0', '1'], migrations: {} });
    expect((await init(await fleet.config())).ok).toBe(true);
    clients.push(...(await Promise.all([...db.urls, ...db.urls].map((url) => adminClient(url)))));
  });
  afterAll(async () => {
    await Promise.all(clients.map((c) => c.end()));
  });
  return { db, clients };
}

describe('verification from change logs (tables without a usable key)', () => {
  const { db, clients } = useTwoHosts();

  it.each([
    { case: 'the same inserts, updates and deletes on both hosts', source: SAME, target: SAME, ok: [] },
    {
      case: 'a truncate after P on both hosts, with writes before and after it',
      source: TRUNCATE_THEN_INSERT,
      target: TRUNCATE_THEN_INSERT,
      ok: [],
    },
    {
      case: 'a truncate on the source the target never got',
      source: TRUNCATE_THEN_INSERT,
      target: `INSERT INTO ${SCHEMA}.audit VALUES ('2026-05-01 10:00+02', 0.3, interval '3 minutes', 7, 'after the truncate');`,
      ok: ['vt.audit: 1 rows on the source, 51 on the target'],
    },
    {
      case: 'an insert the target lost',
      source: `${SAME}\nINSERT INTO ${SCHEMA}.plain VALUES (99, 'lost');`,
      target: SAME,
      ok: ['vt.plain: 51 rows on the source, 50 on the target'],
    },
    {
      case: 'an update applied with another value on the target',
      source: SAME,
      target: `${SAME}\nUPDATE ${SCHEMA}.audit SET note = 'other' WHERE s = 20;`,
      ok: ['vt.audit: 48 rows on both, but their contents differ (checksum)'],
    },
  ])('$case', async ({ source, target, ok }) => {
    const [src, dst, srcWork, dstWork] = clients as [pg.Client, pg.Client, pg.Client, pg.Client];
    const moveId = `logs-${Math.random().toString(36).slice(2, 8)}`;
    await Promise.all([src.query(SETUP), dst.query(SETUP)]);
    const tables = await shardTables(src, SCHEMA, 'leaves', { columnTypes: true });
    const methods = await hashMethods([src, dst], tables, true);
    expect([...methods.entries()].sort()).toEqual([
      ['vt.audit', 'text'],
      ['vt.plain', 'record'],
    ]);
    const sql = startDeltasSql(
      moveId,
      tables.map((table) => ({ table, method: methods.get(`${table.schema}.${table.table}`)! })),
      500,
    );
    await runTransaction(src, sql);
    await runTransaction(dst, sql);
    const holders = await Promise.all(db.urls.map((url) => adminClient(url)));
    const pre = await preVerify(
      { source: holders[0]!, target: holders[1]! },
      { source: srcWork, target: dstWork },
      [],
      methods,
      { moveId, tables },
    );
    try {
      await Promise.all([src.query(`${APP_SETTINGS}\n${source}`), dst.query(target)]);
      const result = await verifyShards(srcWork, dstWork, [SCHEMA], methods, { pre, changes: new Map() });
      expect(result.mismatches).toEqual(ok.map((m) => `table ${m}`));
      expect(result).toMatchObject({
        ok: ok.length === 0,
        byLog: { tables: 2 },
        byKey: { tables: 0 },
        whole: [],
        truncated: [],
      });
      expect(result.byLog.changes).toBeGreaterThan(0);
    } finally {
      await endPreVerification(pre);
    }
    // What a whole checksum says, for comparison: the verification without the logs.
    const whole = await verifyShards(srcWork, dstWork, [SCHEMA], methods);
    expect(whole.mismatches).toEqual(ok.map((m) => `table ${m}`));
    expect(whole.whole).toEqual(['vt.audit', 'vt.plain']);

    for (const c of [src, dst]) {
      await stopDeltas(c, moveId, [SCHEMA]);
      const left = await c.query<{ triggers: number; entries: number }>(
        `select (select count(*)::int from pg_trigger where tgname like 'shardctl\\_delta%' and tgenabled <> 'D') as triggers,
                (select count(*)::int from shardctl.move_deltas where move_id = $1) as entries`,
        [moveId],
      );
      expect(left.rows[0]).toEqual({ triggers: 0, entries: 0 });
    }
  });
});

/**
 * A keyed table, the same on both hosts. Its regclass column names a table on the default search
 * path, whose text is unqualified there and qualified under the log function's own path: the
 * checksum fixes the path too, or equal rows would hash apart.
 */
const KEYED_SETUP = `
DROP SCHEMA IF EXISTS ${SCHEMA} CASCADE;
CREATE SCHEMA ${SCHEMA};
CREATE TABLE IF NOT EXISTS public.vt_ref ();
CREATE TABLE ${SCHEMA}.k (id int PRIMARY KEY, v text, at timestamptz, r regclass DEFAULT 'public.vt_ref');
INSERT INTO ${SCHEMA}.k SELECT g, 'v' || g, timestamptz '2026-01-01 12:00+00' + g * interval '1 minute' FROM generate_series(1, 50) g;`;

/** What replication would apply on both hosts. */
const KEYED_SAME = `
INSERT INTO ${SCHEMA}.k VALUES (100, 'new', '2026-11-26 08:00+00');
UPDATE ${SCHEMA}.k SET v = 'edited' WHERE id < 5;
UPDATE ${SCHEMA}.k SET id = 200 WHERE id = 6;
DELETE FROM ${SCHEMA}.k WHERE id BETWEEN 10 AND 12;`;

const KEYED_TRUNCATE = `
INSERT INTO ${SCHEMA}.k VALUES (101, 'before the truncate', now());
TRUNCATE ${SCHEMA}.k;
INSERT INTO ${SCHEMA}.k VALUES (1, 'after the truncate', '2026-05-01 10:00+02');`;

// The keyed tables as the cut-over verifies them: the target's figure from P and the keys its
// tracking triggers recorded, the source's from P and its own change log. A change the source
// commits after P and replication never applies leaves no key on the target: only the source's log
// shows it (docs/moves.md, step 10).
describe('verification of keyed tables: changed keys on the target, the change log on the source', () => {
  const { db, clients } = useTwoHosts();

  it.each([
    { case: 'the same writes on both hosts', source: KEYED_SAME, target: KEYED_SAME, ok: [], truncated: [] },
    { case: 'nothing written after P', source: '', target: '', ok: [], truncated: [] },
    {
      case: 'an insert the target lost',
      source: `${KEYED_SAME}\nINSERT INTO ${SCHEMA}.k VALUES (99, 'lost', now());`,
      target: KEYED_SAME,
      ok: ['vt.k: 49 rows on the source, 48 on the target'],
      truncated: [],
    },
    {
      case: 'an update the target lost',
      source: `${KEYED_SAME}\nUPDATE ${SCHEMA}.k SET v = 'lost' WHERE id = 20;`,
      target: KEYED_SAME,
      ok: ['vt.k: 48 rows on both, but their contents differ (checksum)'],
      truncated: [],
    },
    {
      case: 'a delete the target lost',
      source: `${KEYED_SAME}\nDELETE FROM ${SCHEMA}.k WHERE id = 30;`,
      target: KEYED_SAME,
      ok: ['vt.k: 47 rows on the source, 48 on the target'],
      truncated: [],
    },
    {
      case: 'a write by hand on the target',
      source: KEYED_SAME,
      target: `${KEYED_SAME}\nUPDATE ${SCHEMA}.k SET v = 'by hand' WHERE id = 40;`,
      ok: ['vt.k: 48 rows on both, but their contents differ (checksum)'],
      truncated: [],
    },
    { case: 'a truncate on both hosts', source: KEYED_TRUNCATE, target: KEYED_TRUNCATE, ok: [], truncated: ['vt.k'] },
    {
      case: 'a truncate the target never got',
      source: KEYED_TRUNCATE,
      target: `INSERT INTO ${SCHEMA}.k VALUES (101, 'before the truncate', now());`,
      ok: ['vt.k: 1 rows on the source, 51 on the target'],
      truncated: [],
    },
  ])('$case', async ({ source, target, ok, truncated }) => {
    const [src, dst, srcWork, dstWork] = clients as [pg.Client, pg.Client, pg.Client, pg.Client];
    const moveId = `keys-${Math.random().toString(36).slice(2, 8)}`;
    await Promise.all([src.query(KEYED_SETUP), dst.query(KEYED_SETUP)]);
    const tables = await shardTables(src, SCHEMA, 'leaves', { columnTypes: true });
    const methods = await hashMethods([src, dst], tables, true);
    const keyed = await keyedTables(src, [SCHEMA]);
    expect(keyed.map((k) => k.table.table)).toEqual(['k']);
    // Hashed by its text: a regclass is an OID, which differs between hosts.
    expect(methods.get('vt.k')).toBe('text');
    await runTransaction(dst, startTrackingSql(moveId, keyed));
    await runTransaction(src, startDeltasSql(moveId, [{ table: keyed[0]!.table, method: methods.get('vt.k')! }], 500));
    const holders = await Promise.all(db.urls.map((url) => adminClient(url)));
    const pre = await preVerify(
      { source: holders[0]!, target: holders[1]! },
      { source: srcWork, target: dstWork },
      keyed,
      methods,
      {
        moveId,
        tables: [],
        keyedOnSource: true,
      },
    );
    try {
      await Promise.all([src.query(`${APP_SETTINGS}\n${source}`), dst.query(target)]);
      const result = await verifyShards(srcWork, dstWork, [SCHEMA], methods, {
        pre,
        changes: await readChanges(dst, moveId),
      });
      expect(result.mismatches).toEqual(ok.map((m) => `table ${m}`));
      expect(result).toMatchObject({ ok: ok.length === 0, byLog: { tables: 0 }, whole: [], truncated });
    } finally {
      await endPreVerification(pre);
    }
    // What a whole checksum says, for comparison.
    const whole = await verifyShards(srcWork, dstWork, [SCHEMA], methods);
    expect(whole.mismatches).toEqual(ok.map((m) => `table ${m}`));
    await stopTracking(dst, moveId, [SCHEMA]);
    await stopDeltas(src, moveId, [SCHEMA]);
  });
});

// On the source the logs are set up table by table, each transaction holding one table's lock: an
// application transaction busy on one table delays that table only, and the tables done stay done.
describe('the change logs set up on a busy source', () => {
  const db = useTestDatabases(1);
  const SETUP = `DROP SCHEMA IF EXISTS ${SCHEMA} CASCADE; CREATE SCHEMA ${SCHEMA};
    CREATE TABLE ${SCHEMA}.a (id int PRIMARY KEY); CREATE TABLE ${SCHEMA}.b (id int PRIMARY KEY); CREATE TABLE ${SCHEMA}.c (id int);`;
  const logged = ['a', 'b', 'c'].map((table) => ({ table: { schema: SCHEMA, table }, method: 'record' as const }));
  const done = async (c: pg.Client, moveId: string): Promise<string[]> =>
    (await c.query<{ table: string }>(`${DELTAS_DONE_SQL} ORDER BY 2`, [[SCHEMA], moveId, DELTA_TRIGGERS])).rows.map(
      (r) => r.table,
    );

  it.each([
    { case: 'waits out a writer that holds one table for a while, then logs every table', holdMs: 400, limitMs: 5_000 },
    {
      case: 'past its limit, fails with the lock wait and leaves the tables before the busy one done',
      holdMs: 2_000,
      limitMs: 300,
    },
  ])('$case', async ({ holdMs, limitMs }) => {
    const [c, writer] = await Promise.all([adminClient(db.urls[0]!), adminClient(db.urls[0]!)]);
    try {
      await c.query(SETUP);
      await init(await makeFleet({ urls: db.urls, shards: 1, split: ['0'], migrations: {} }).config());
      const moveId = `busy-${Math.random().toString(36).slice(2, 8)}`;
      await writer.query(`BEGIN; INSERT INTO ${SCHEMA}.b VALUES (1)`);
      const released = new Promise((resolve) => setTimeout(resolve, holdMs)).then(() => writer.query('COMMIT'));
      const setUp = startSourceDeltas(c, moveId, logged, 100, limitMs).then(
        () => null,
        (error: unknown) => error,
      );
      const error = await setUp;
      if (holdMs < limitMs) {
        expect(error).toBeNull();
        expect(await done(c, moveId)).toEqual(['a', 'b', 'c']);
      } else {
        expect(error).toMatchObject({ code: '55P03' });
        expect(await done(c, moveId)).toEqual(['a']);
      }
      await released;
      await stopDeltas(c, moveId, [SCHEMA]);
      expect(await done(c, moveId)).toEqual([]);
    } finally {
      await Promise.all([c.end(), writer.end()]);
    }
  });
});
