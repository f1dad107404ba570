/**
 * replica-reads: throughput of read-only routed calls spread over a host's primary and its standby
 * (`{ readOnly: true, replica: true }`, src/router/replicas.ts) against the primary alone (issue 41).
 *
 * A fresh primary and a streaming standby (`pg_basebackup -R`, PostgreSQL 15: the embedded binaries
 * ship no pg_basebackup), a fleet of 4 shards on that host whose URL lists both addresses, each
 * shard's photos filled with `--replica-rows` rows. CALLERS callers run `--replica-calls` calls per
 * side, each reading one user's 20 newest photos by key (`withKey`):
 *
 *   primary  `{ readOnly: true }`: every call on the primary
 *   spread   every other call `{ readOnly: true, replica: true }`: half on the standby
 *   standby  every call `{ readOnly: true, replica: true }`
 *
 * Sides alternate in each of `--replica-rounds` rounds (rotated, so none always goes first); the
 * figures are medians of calls per second, and spread/primary is the ratio. On one machine the
 * standby shares the cores with the primary, so the ratio shows the router's cost of a replica
 * read (its check on the standby) more than the capacity a second server adds.
 */
import { ShardRouter } from '../dist/index.js';
import { init, loadConfig } from '../dist/index.js';
import { formatCount, log, ratio, required, roundOrder, summarize, withClient, writeFleet } from './lib.js';
import { standbyPairSection, startPrimaryWithStandby } from './standby.js';

export const description = 'read-only calls spread over a primary and its standby vs the primary alone (PG 15)';

const CALLERS = 8;
const SHARDS = 4;
const DATABASE = 'bench_replica';
const SIDES = ['primary', 'spread', 'standby'];
const READ = 'SELECT id, image_url FROM photos WHERE user_id = $1 ORDER BY id DESC LIMIT 20';

/**
 * @typedef {{ median: number, min: number, max: number }} Sample
 * @typedef {{
 *   benchmark: 'replica-reads', major: string, callers: number, calls: number, rows: number,
 *   rounds: number, sides: Record<string, Sample>, spreadRatio: number | null,
 *   standbyRatio: number | null, replicaReads: number, replicaFallbacks: number,
 *   fallbackReasons: Record<string, number>,
 * }} ReplicaReadsResult
 */

/**
 * Calls per second of one side: CALLERS callers sharing `calls` calls.
 * @param {ShardRouter} router
 * @param {string} name
 * @param {number} calls
 * @param {number} users
 */
async function side(router, name, calls, users) {
  let next = 0;
  const started = performance.now();
  const callers = Array.from({ length: CALLERS }, async () => {
    while (next < calls) {
      const n = next++;
      const key = BigInt(n % users);
      const replica = name === 'standby' || (name === 'spread' && n % 2 === 1);
      await router.withKey(
        key,
        (/** @type {import('pg').PoolClient} */ client) => client.query(READ, [key.toString()]),
        {
          readOnly: true,
          ...(replica ? { replica: true } : {}),
        },
      );
    }
  });
  await Promise.all(callers);
  return (calls / (performance.now() - started)) * 1000;
}

/**
 * @param {import('./run.js').BenchContext} ctx
 * @param {string} major
 * @returns {Promise<ReplicaReadsResult>}
 */
export async function run(ctx, major) {
  const { replicaRounds: rounds, replicaCalls: calls, replicaRows: rows } = ctx.options;
  const pair = await startPrimaryWithStandby(major, 'replica-reads', DATABASE);
  /** @type {ShardRouter | undefined} */
  let router;
  /** @type {import('./lib.js').Fleet<import('./lib.js').FleetHost> | undefined} */
  let fleet;
  try {
    fleet = await writeFleet({ name: 'replica-reads', hosts: [pair.host], shards: SHARDS, database: DATABASE });
    if (!(await init(await loadConfig(fleet.configFile))).ok) throw new Error('init failed');
    router = await ShardRouter.open(fleet.configFile, { poolSize: CALLERS });
    // Users 0..users-1, each with rows/100 photos in the shard of its key.
    const users = Math.max(SHARDS, Math.ceil(rows / 100) * SHARDS);
    await router.forEachShard((client, shard) =>
      client.query(
        `INSERT INTO photos (user_id, image_url) SELECT (g % $2::int) * ${SHARDS} + $1::int, 'x' FROM generate_series(1, $3::int) g`,
        [shard, users / SHARDS, rows],
      ),
    );
    await withClient(pair.nodeUrl(pair.primary, DATABASE), (c) => c.query('CHECKPOINT'));
    // The standby has everything before the first round.
    const lsn = await withClient(
      pair.nodeUrl(pair.primary, DATABASE),
      async (c) => (await c.query('SELECT pg_current_wal_lsn()::text AS l')).rows[0].l,
    );
    for (let i = 0; ; i += 1) {
      const ok = await withClient(
        pair.nodeUrl(pair.standby, DATABASE),
        async (c) => (await c.query('SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn AS ok', [lsn])).rows[0].ok,
      );
      if (ok) break;
      if (i > 600) throw new Error('the standby did not catch up within 30 s');
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
    // Warm both servers' caches and the router's pools.
    for (const name of SIDES) await side(router, name, Math.min(calls, 500), users);
    /** @type {Record<string, number[]>} */
    const perSide = Object.fromEntries(SIDES.map((name) => [name, []]));
    for (let turn = 0; turn < rounds; turn++) {
      for (const name of roundOrder(SIDES, turn)) {
        const rate = await side(router, name, calls, users);
        perSide[name]?.push(rate);
        log(`  round ${turn + 1}, ${name}: ${Math.round(rate)} calls/s`);
      }
    }
    const stats = router.stats().find((s) => s.host === 'pg1');
    /** @type {Record<string, Sample>} */
    const summary = Object.fromEntries(SIDES.map((name) => [name, summarize(perSide[name] ?? [])]));
    const median = (/** @type {string} */ name) => required(summary[name], `the ${name} side's figures`).median;
    return {
      benchmark: 'replica-reads',
      major,
      callers: CALLERS,
      calls,
      rows,
      rounds,
      sides: summary,
      spreadRatio: ratio(median('spread'), median('primary')),
      standbyRatio: ratio(median('standby'), median('primary')),
      replicaReads: stats?.replicaReads ?? 0,
      replicaFallbacks: stats?.replicaFallbacks ?? 0,
      fallbackReasons: stats?.replicaFallbackReasons ?? {},
    };
  } finally {
    await router?.close();
    await fleet?.remove();
    await pair.dispose();
  }
}

const HEADERS = ['side', 'calls/s (median)', 'min', 'max', 'rounds', 'vs primary'];

/** @param {ReplicaReadsResult} result */
function rows(result) {
  return SIDES.map((name) => {
    const s = required(result.sides[name], `the ${name} side's figures`);
    return [
      name,
      String(Math.round(s.median)),
      String(Math.round(s.min)),
      String(Math.round(s.max)),
      String(result.rounds),
      name === 'primary'
        ? '1.00x'
        : `${(ratio(s.median, required(result.sides['primary'], 'the primary side').median) ?? 0).toFixed(2)}x`,
    ];
  });
}

/** @param {ReplicaReadsResult} result */
function footer(result) {
  const reasons = Object.entries(result.fallbackReasons)
    .map(([reason, n]) => `${reason} ${n}`)
    .join(', ');
  return `${result.callers} callers, ${formatCount(result.calls)} calls per side and round, ${formatCount(result.rows)} photos per shard; replica reads on the standby: ${formatCount(result.replicaReads)}, on the primary instead: ${result.replicaFallbacks}${reasons ? ` (${reasons})` : ''}.`;
}

const section = standbyPairSection({ name: 'replica-reads', shards: SHARDS, headers: HEADERS, rows, footer });

/** The text table of one run. */
export const table = section.table;

/** The markdown of the runs, one section per PostgreSQL major. */
export const markdown = section.markdown;
