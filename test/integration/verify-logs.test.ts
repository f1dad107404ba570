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
import { shardTables } from '../../src/moves/catalog.js';
import { endPreVerification, hashMethods, preVerify, verifyShards } from '../../src/moves/verify.js';
import { startDeltasSql } from '../../src/moves/sql.js';
import { stopDeltas } from '../../src/moves/tail.js';
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

describe('verification from change logs (tables without a usable key)', () => {
  const db = useTestDatabases(2);
  let clients: pg.Client[] = [];

  beforeAll(async () => {
    const fleet = makeFleet({ urls: db.urls, shards: 2, split: ['0', '1'], migrations: {} });
    expect((await init(await fleet.config())).ok).toBe(true);
    clients = await Promise.all([...db.urls, ...db.urls].map((url) => adminClient(url)));
  });
  afterAll(async () => {
    await Promise.all(clients.map((c) => c.end()));
  });

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
