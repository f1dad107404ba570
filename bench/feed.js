/**
 * feed: a feed page across shards (issue 43). On its own fleet of 2048 shards over 2 hosts (init
 * once, untimed), 20 photos per shard written in 4 rounds (so the shards' ids interleave), the
 * page of the 20 newest photos of a set of users, and the page after it (cursor), two ways:
 *
 * - `router.queryPage(sql, { keys | all shards, limit: 20, cursor })`: one parameterised SELECT,
 *   each shard asked for at most 20 rows past the cursor, up to 64 shards of a host per round trip,
 *   merged by id in the router;
 * - the app-side merge the issue started from: `router.forEachShard` with the same SELECT and its
 *   bounds as parameters on each shard (a round trip per shard), merged and cut in the application.
 *
 * Over the shards of 500 users' keys (their photos) and over all 2048 shards (everyone's); each sample is one page (the first,
 * then the next four through the cursor, then the first again), the two sides alternating sample by
 * sample. Both sides must return the same ids. p50 and p99 of the pages' times.
 */
import { ShardRouter } from '../dist/index.js';
import { formatMs, initFleet, itemAt, log, markdownTable, median, ratio, round, textTable } from './lib.js';

export const description = 'a 20-row feed page over 500 keys’ shards and over all 2048: queryPage vs app-side merge';

const DATABASE = 'bench_feed';
const SHARDS = 2048;
const HOSTS = 2;
const POOL_SIZE = 10;
const LIMIT = 20;
const ROWS_PER_SHARD = 20;
const KEYS = 500;
/** Pages in a row through the cursor before starting again from the first. */
const PAGES_IN_A_ROW = 5;
/** The feed of a set of users (their keys' shards); over all shards, the newest photos of anyone. */
const FOLLOWED_SQL = 'select id, user_id, image_url from photos where user_id = any($1::bigint[])';
const EVERYONE_SQL = 'select id, user_id, image_url from photos where user_id >= $1';

/** @typedef {Awaited<ReturnType<typeof run>>} Result */

/**
 * @param {import('./run.js').BenchContext} ctx
 * @param {string} major
 */
export async function run(ctx, major) {
  const { options } = ctx;
  const fleet = await ctx.fleet('feed', major, { database: DATABASE, hostCount: HOSTS, shards: SHARDS });
  const serverVersion = await itemAt(fleet.hosts, 0).serverVersion();
  log(`feed on PostgreSQL ${serverVersion}: init of ${SHARDS} shards over ${HOSTS} hosts (untimed)`);
  await initFleet(fleet);
  const router = await ShardRouter.open(fleet.configFile, { poolSize: POOL_SIZE, idleTimeoutMs: 0 });
  try {
    // Shard s holds users s, s + 2048, s + 4096, s + 6144 (key mod shards), 5 photos each.
    for (let round = 0; round < 4; round++) {
      await router.queryEachShard(
        `insert into photos (user_id, image_url)
         select (substring(current_schema() from '[0-9]+$'))::bigint + $1::bigint, 'p' from generate_series(1, $2::int)`,
        { params: [round * SHARDS, ROWS_PER_SHARD / 4] },
      );
    }
    const users = Array.from({ length: KEYS }, (_, i) => BigInt((i * 2654435761) % (SHARDS * 4)));
    /** @type {{ name: string, keys: bigint[] | undefined, sql: string, params: unknown[] }[]} */
    const scenarios = [
      { name: `${KEYS} keys`, keys: users, sql: FOLLOWED_SQL, params: [users.map(String)] },
      { name: `all ${SHARDS} shards`, keys: undefined, sql: EVERYONE_SQL, params: ['0'] },
    ];
    const results = [];
    for (const scenario of scenarios) {
      const { sql, params } = scenario;
      const shards = scenario.keys
        ? [...new Set(scenario.keys.map((k) => Number(k % BigInt(SHARDS))))]
        : Array.from({ length: SHARDS }, (_, i) => i);
      /**
       * @param {string | null} cursor
       * @returns {Promise<import('../dist/index.js').Page<{ id: bigint }>>}
       */
      const page = (cursor) =>
        router.queryPage(sql, { ...(scenario.keys ? { keys: scenario.keys } : {}), params, limit: LIMIT, cursor });
      /** @param {bigint | undefined} after */
      const appPage = async (after) => {
        const bound = after === undefined ? '' : ' and id < $2';
        const limit = after === undefined ? '$2' : '$3';
        const values = after === undefined ? [...params, LIMIT] : [...params, after.toString(), LIMIT];
        const perShard = await router.forEachShard(
          async (client) =>
            (await client.query(`${sql}${bound} order by id desc limit ${limit}`, values)).rows.map(
              /** @returns {Record<string, unknown> & { id: bigint }} */ (r) => ({
                ...r,
                id: BigInt(r.id),
              }),
            ),
          { readOnly: true, shards },
        );
        const rows = perShard
          .flatMap((r) => r.value)
          .sort((a, b) => (a.id < b.id ? 1 : a.id > b.id ? -1 : 0))
          .slice(0, LIMIT);
        return { rows, after: rows.length === LIMIT ? (rows.at(-1)?.id ?? null) : null };
      };
      // Warm-up, untimed, and the check: the same pages both ways.
      /** @type {string | null} */
      let cursor = null;
      /** @type {bigint | undefined} */
      let after;
      for (let i = 0; i < PAGES_IN_A_ROW; i++) {
        const a = await page(cursor);
        const b = await appPage(after);
        /** @param {{ id: bigint }[]} rows */
        const ids = (rows) => rows.map((r) => r.id.toString()).join(',');
        if (ids(a.rows) !== ids(b.rows) || a.rows.length !== LIMIT)
          throw new Error(`${scenario.name}: page ${i + 1} differs between queryPage and the app-side merge`);
        cursor = a.cursor;
        after = b.after ?? undefined;
      }
      /** @type {number[]} */
      const routed = [];
      /** @type {number[]} */
      const app = [];
      cursor = null;
      after = undefined;
      for (let i = 0; i < options.feedPages; i++) {
        if (i % PAGES_IN_A_ROW === 0) {
          cursor = null;
          after = undefined;
        }
        const sides = [
          async () => {
            const t = performance.now();
            cursor = (await page(cursor)).cursor;
            routed.push(performance.now() - t);
          },
          async () => {
            const t = performance.now();
            after = (await appPage(after)).after ?? undefined;
            app.push(performance.now() - t);
          },
        ];
        if (i % 2 === 1) sides.reverse();
        for (const side of sides) await side();
      }
      const result = {
        scenario: scenario.name,
        shards: shards.length,
        queryPage: percentiles(routed),
        appMerge: percentiles(app),
        ratioP50: ratio(median(routed), median(app)),
      };
      log(
        `  ${scenario.name} (${shards.length} shards): queryPage p50 ${formatMs(result.queryPage.p50)} p99 ${formatMs(result.queryPage.p99)}; ` +
          `app-side merge p50 ${formatMs(result.appMerge.p50)} p99 ${formatMs(result.appMerge.p99)}`,
      );
      results.push(result);
    }
    return {
      benchmark: 'feed',
      postgres: serverVersion,
      shards: SHARDS,
      hosts: HOSTS,
      poolSize: POOL_SIZE,
      limit: LIMIT,
      pages: options.feedPages,
      scenarios: results,
    };
  } finally {
    await router.close();
  }
}

/** @param {number[]} values */
function percentiles(values) {
  const sorted = [...values].sort((a, b) => a - b);
  /** @param {number} q */
  const at = (q) => sorted[Math.min(sorted.length - 1, Math.ceil(q * sorted.length) - 1)] ?? NaN;
  return {
    p50: round(median(values)),
    p99: round(at(0.99)),
    max: round(sorted.at(-1) ?? NaN),
    runs: values.map((v) => round(v)),
  };
}

const HEADERS = ['PostgreSQL', 'page over', 'shards', 'queryPage p50', 'p99', 'app-side merge p50', 'p99', 'p50 ratio'];

/** @param {Result[]} results */
function rows(results) {
  return results.flatMap((r) =>
    r.scenarios.map((s) => [
      r.postgres,
      s.scenario,
      String(s.shards),
      formatMs(s.queryPage.p50),
      formatMs(s.queryPage.p99),
      formatMs(s.appMerge.p50),
      formatMs(s.appMerge.p99),
      `${s.ratioP50}x`,
    ]),
  );
}

/** @param {Result} result */
export function table(result) {
  return [
    `feed: ${result.pages} pages of ${result.limit} rows each side, alternating`,
    textTable(HEADERS, rows([result])),
  ].join('\n');
}

/** @param {Result[]} results */
export function markdown(results) {
  const first = itemAt(results, 0);
  return [
    `${first.pages} pages of ${first.limit} rows each side (the first page, then four through the cursor, again), the sides alternating; ${first.shards} shards over ${first.hosts} hosts, pool of ${first.poolSize} per host.`,
    '',
    markdownTable(HEADERS, rows(results)),
  ].join('\n');
}
