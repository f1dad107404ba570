/**
 * fleet-inserts: what next_id() costs a single-row insert when the inserts are spread over the 512
 * shards of a host, each in its own transaction (an application's writes through the router or a
 * pool), against the same inserts into a `bigserial` table beside it in every shard.
 *
 * At such rates each shard's sequence is drawn a few times a second, far less than once a
 * millisecond, so nearly every call of next_id() finds its position behind the clock and takes the
 * locked slow path (docs/ids.md, "Cost"); and every statement is planned anew, which inlines
 * next_id()'s SQL body into the plan. The benchmark separates the two: the server's time per insert
 * (planned, run and committed) and per plan alone (EXPLAIN of the same statement), each side in
 * interleaved rounds, in one session (a procedure that runs each insert through EXECUTE, as a
 * client's unnamed statement is planned, and commits after each; synchronous_commit off, so that
 * no round waits for the disk), and the share of calls that took the locked path
 * (track_functions = 'pl'). No target: figures for capacity planning.
 */
import { initFleet, itemAt, log, markdownTable, median, required, round, textTable, withClient } from './lib.js';

export const description = 'single-row inserts over 512 shards: next_id() against bigserial, per insert and per plan';

const SHARDS = 512;
const INSERTS = 20_000;
const ROUNDS = 5;

/** A bigserial table beside photos in every shard, and the loops that insert or plan over the shards. */
const SETUP_SQL = `
DO $setup$
BEGIN
  FOR s IN 0..${SHARDS - 1} LOOP
    EXECUTE format('CREATE TABLE IF NOT EXISTS %I.photos_serial (id bigserial PRIMARY KEY, user_id bigint NOT NULL,
                    image_url text NOT NULL, caption text, created_at timestamptz NOT NULL DEFAULT now())', 'insta' || s);
  END LOOP;
END
$setup$;
CREATE SCHEMA IF NOT EXISTS bench;
CREATE OR REPLACE PROCEDURE bench.fleet_inserts(n int, tbl text, plan_only bool, INOUT ms float8 DEFAULT NULL)
LANGUAGE plpgsql AS $p$
DECLARE
  started timestamptz := clock_timestamp();
  plan text;
BEGIN
  FOR i IN 1..n LOOP
    IF plan_only THEN
      EXECUTE format('EXPLAIN INSERT INTO %I.%I (user_id, image_url) VALUES ($1, $2)', 'insta' || (i * 7919) % ${SHARDS}, tbl)
        INTO plan USING i, 'https://cdn.example.com/p.jpg';
    ELSE
      EXECUTE format('INSERT INTO %I.%I (user_id, image_url) VALUES ($1, $2)', 'insta' || (i * 7919) % ${SHARDS}, tbl)
        USING i, 'https://cdn.example.com/p.jpg';
    END IF;
    COMMIT;
  END LOOP;
  ms := extract(epoch FROM clock_timestamp() - started) * 1000;
END
$p$;`;

/** next_id's locked calls so far in this session's statistics (track_functions = 'pl'). */
const LOCKED_CALLS_SQL = `SELECT coalesce(sum(calls), 0)::bigint AS calls FROM pg_stat_user_functions WHERE funcname = 'next_id_locked'`;

/** @typedef {'photos' | 'photos_serial'} Table */
/** @typedef {Awaited<ReturnType<typeof run>>} Result */

/**
 * @param {import('./run.js').BenchContext} ctx
 * @param {string} major
 */
export async function run(ctx, major) {
  const fleet = await ctx.fleet('fleet-inserts', major, {
    database: 'bench_fleet_inserts',
    hostCount: 1,
    shards: SHARDS,
  });
  const host = itemAt(fleet.hosts, 0);
  const serverVersion = await host.serverVersion();
  log(`fleet-inserts on PostgreSQL ${serverVersion}: init of ${SHARDS} shards on one host (untimed)`);
  await initFleet(fleet);
  return withClient(host.url(fleet.database), async (client) => {
    await client.query(SETUP_SQL);
    await client.query(`SET synchronous_commit = off; SET track_functions = 'pl'`);
    /** @type {Record<string, number[]>} per side: µs per statement of each round */
    const sides = { 'insert next_id': [], 'insert bigserial': [], 'plan next_id': [], 'plan bigserial': [] };
    /** @type {Record<string, { xids: number[], walBytes: number[] }>} per insert side: transaction ids and WAL per insert of each round */
    const written = { 'insert next_id': { xids: [], walBytes: [] }, 'insert bigserial': { xids: [], walBytes: [] } };
    /** The next transaction id and the WAL position, read without taking an id (the session is the server's only writer). */
    const position = async () =>
      required(
        (
          await client.query(
            `SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS xid, pg_current_wal_lsn()::text AS lsn`,
          )
        ).rows[0],
        'the position',
      );
    const walSince = async (/** @type {string} */ lsn) =>
      Number(
        required(
          (await client.query(`SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1)::bigint AS b`, [lsn])).rows[0],
          'wal',
        ).b,
      );
    /** @type {[string, Table, boolean][]} */
    const order = [
      ['insert next_id', 'photos', false],
      ['insert bigserial', 'photos_serial', false],
      ['plan next_id', 'photos', true],
      ['plan bigserial', 'photos_serial', true],
    ];
    const call = async (/** @type {Table} */ table, /** @type {boolean} */ planOnly) =>
      Number(
        required(
          (await client.query('CALL bench.fleet_inserts($1, $2, $3)', [INSERTS, table, planOnly])).rows[0],
          'the procedure row',
        ).ms,
      );
    // Every shard's tables, plans and sequences touched once, untimed.
    for (const [, table, planOnly] of order) await call(table, planOnly);
    const lockedBefore = Number(required((await client.query(LOCKED_CALLS_SQL)).rows[0], 'locked calls').calls);
    for (let r = 0; r < ROUNDS; r++) {
      // Alternate the order each round, so that neither side always runs first.
      for (const [name, table, planOnly] of r % 2 === 0 ? order : [...order].reverse()) {
        const before = await position();
        const ms = await call(table, planOnly);
        required(sides[name], name).push((ms * 1000) / INSERTS);
        const w = written[name];
        if (w) {
          const wal = await walSince(before.lsn);
          const after = await position();
          // Less the two reads' own: neither takes an id.
          w.xids.push((Number(after.xid) - Number(before.xid)) / INSERTS);
          w.walBytes.push(wal / INSERTS);
        }
      }
      log(
        `  round ${r + 1}/${ROUNDS}: ${Object.entries(sides)
          .map(([name, v]) => `${name} ${round(v.at(-1) ?? 0)} µs`)
          .join(', ')}`,
      );
    }
    // Statistics reach the shared counters when the session goes idle: a moment for them.
    await client.query('SELECT pg_stat_force_next_flush()').catch(() => undefined);
    await new Promise((resolve) => setTimeout(resolve, 1200));
    const lockedCalls =
      Number(required((await client.query(LOCKED_CALLS_SQL)).rows[0], 'locked calls').calls) - lockedBefore;
    const m = Object.fromEntries(Object.entries(sides).map(([name, v]) => [name, median(v)]));
    const insertNextId = required(m['insert next_id'], 'insert next_id');
    const insertSerial = required(m['insert bigserial'], 'insert bigserial');
    const planNextId = required(m['plan next_id'], 'plan next_id');
    const planSerial = required(m['plan bigserial'], 'plan bigserial');
    return {
      benchmark: 'fleet-inserts',
      major,
      serverVersion,
      shards: SHARDS,
      insertsPerRound: INSERTS,
      rounds: ROUNDS,
      perInsertUs: { nextId: insertNextId, bigserial: insertSerial, runs: sides },
      perPlanUs: { nextId: planNextId, bigserial: planSerial },
      /** next_id()'s extra time per insert, and the part of it spent planning. */
      extraUs: insertNextId - insertSerial,
      extraPlanningUs: planNextId - planSerial,
      lockedShare: lockedCalls / (INSERTS * ROUNDS),
      /** Transaction ids and WAL bytes per insert (medians of the rounds). */
      xidsPerInsert: {
        nextId: median(required(written['insert next_id'], 'next_id').xids),
        bigserial: median(required(written['insert bigserial'], 'bigserial').xids),
      },
      walBytesPerInsert: {
        nextId: median(required(written['insert next_id'], 'next_id').walBytes),
        bigserial: median(required(written['insert bigserial'], 'bigserial').walBytes),
      },
    };
  });
}

const HEADERS = [
  'PostgreSQL',
  'per insert: next_id()',
  'bigserial',
  'ratio',
  'per plan: next_id()',
  'bigserial',
  'locked calls',
  'transaction ids per insert: next_id() / bigserial',
  'WAL per insert: next_id() / bigserial',
];

/** @param {Result} r */
function rowOf(r) {
  return [
    r.serverVersion,
    `${round(r.perInsertUs.nextId)} µs`,
    `${round(r.perInsertUs.bigserial)} µs`,
    `${round(r.perInsertUs.nextId / r.perInsertUs.bigserial, 2)}x`,
    `${round(r.perPlanUs.nextId)} µs`,
    `${round(r.perPlanUs.bigserial)} µs`,
    `${round(r.lockedShare * 100, 1)}%`,
    r.xidsPerInsert ? `${round(r.xidsPerInsert.nextId, 2)} / ${round(r.xidsPerInsert.bigserial, 2)}` : '—',
    r.walBytesPerInsert ? `${round(r.walBytesPerInsert.nextId)} B / ${round(r.walBytesPerInsert.bigserial)} B` : '—',
  ];
}

/** @param {Result} result */
export function table(result) {
  return `fleet-inserts: ${result.insertsPerRound} single-row inserts over ${result.shards} shards per round and side, medians of ${result.rounds} interleaved rounds (server time, one session, synchronous_commit off)\n${textTable(HEADERS, [rowOf(result)])}\nnext_id() adds ${round(result.extraUs)} µs per insert, of which planning ${round(result.extraPlanningUs)} µs`;
}

/** @param {Result[]} results */
export function markdown(results) {
  const first = results[0];
  return `${first ? `${first.insertsPerRound} single-row inserts over the ${first.shards} shards of one host per round and side, each in its own transaction; medians of ${first.rounds} interleaved rounds; server time in one session (synchronous_commit off).` : ''}\n\n${markdownTable(HEADERS, results.map(rowOf))}\n\n${results
    .map(
      (r) =>
        `PostgreSQL ${r.serverVersion}: next_id() adds ${round(r.extraUs)} µs per insert, ${round(r.extraPlanningUs)} µs of it planning (the inlined body).`,
    )
    .join(' ')}`;
}
