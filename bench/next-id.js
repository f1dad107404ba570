/**
 * next-id: what an id costs, and whether ids stay unique when drawn fast or concurrently.
 *
 * Measures the real function: the SQL comes from the library's renderNextIdSql() with the default
 * layout, installed in schema insta5 (shard 5) of one local host. For reference, Instagram's
 * published function (BACKGROUND.md) runs in schema instagram5 beside it.
 *
 *  1. Cost: N ids in one statement, `select count(x) from (select f(...) x from
 *     generate_series(1, N)) s`, for each function; the runs are interleaved (the order rotates
 *     each round) so drift of the machine hits every function alike.
 *  2. Uniqueness: 2,000,000 ids in one statement; count(distinct) must equal count. Drawn that
 *     fast, the 10-bit sequence field would wrap inside one millisecond if nothing prevented it.
 *  3. Concurrency: 8 sessions insert 200-row batches for 15 s into a copy of one shard's photos
 *     table without a primary key (so a repeated id is stored, not refused), then the duplicates
 *     are counted. It must be 0.
 */
import { DEFAULT_ID_LAYOUT } from '../dist/id/layout.js';
import { controlLocksSql, CONTROL_SCHEMA } from '../dist/fleet/control.js';
import { ID_FUNCTION_VERSION, renderNextIdControlSql, renderNextIdSql } from '../dist/id/sql.js';
import { tsImport } from 'tsx/esm/api';
import {
  connect,
  errorMessage,
  formatCount,
  formatMs,
  itemAt,
  log,
  markdownTable,
  processCpuMs,
  ratio,
  required,
  round,
  roundOrder,
  summarize,
  textTable,
  verdict,
  withClient,
} from './lib.js';

/** @typedef {import('./lib.js').Host} Host */
/** @typedef {import('./run.js').BenchOptions} BenchOptions */
/** @typedef {(typeof ID_FUNCTIONS)[number]} IdFunction */
/** @typedef {Awaited<ReturnType<typeof run>>} NextIdResult */

// The article's text, shared with the adopt tests (TypeScript, loaded through tsx).
/** @type {{ articleNextIdBody: typeof import('../test/fixtures/article-next-id.ts').articleNextIdBody }} */
const { articleNextIdBody } = await tsImport('../test/fixtures/article-next-id.ts', import.meta.url);

export const description = 'per-id cost of next_id() vs nextval(), uniqueness at speed and under concurrency';

const DATABASE = 'bench_nextid';
const SHARD = 5;
const SCHEMA = `insta${SHARD}`;
const REFERENCE_SCHEMA = `instagram${SHARD}`;
/** Steady drawing rates (ids per millisecond) at which the slow path's share is measured. */
const PACED_RATES = [1000, 500, 200, 100, 50, 20];
/**
 * The slowest steady rate the ≤ 0.5% target covers. A busy sequence is moved once per about 5 ms
 * of drawing, a share of about (1024 - r) / (5 · 1024 r) at r ids/ms (docs/ids.md): 0.18% at 100,
 * 0.39% at 50, 1% at 20. Slower rates are reported, not targeted: no bound on the ids' time allows
 * a small share at every rate.
 */
const TARGET_MIN_RATE = 100;
/** Milliseconds drawn at each paced rate. */
const PACED_MS = 1000;
const LAYOUT = DEFAULT_ID_LAYOUT;
/** Bits below the time field: an id's millisecond is id >> TIME_SHIFT. */
const TIME_SHIFT = LAYOUT.shardBits + LAYOUT.sequenceBits;
const SHARD_MASK = (1 << LAYOUT.shardBits) - 1;
/** Sorting millions of ids for count(distinct) in memory rather than on disk. */
const ANALYSIS_WORK_MEM = '512MB';

/**
 * Instagram's function as published (2012), with the Python-escaped `%%` written as `%`, in its
 * own schema so that it does not replace ours. Its bugs are the point of the comparison.
 */
const INSTAGRAM_FUNCTION = `
CREATE SCHEMA ${REFERENCE_SCHEMA};
CREATE SEQUENCE ${REFERENCE_SCHEMA}.table_id_seq;
CREATE OR REPLACE FUNCTION ${REFERENCE_SCHEMA}.next_id(OUT result bigint) AS $$
${articleNextIdBody(REFERENCE_SCHEMA, SHARD)}
$$ LANGUAGE PLPGSQL;`;

/**
 * The copy of photos (migrations/0001_photos.sql) the concurrency run fills: no primary key, so
 * duplicates are stored and counted; drawn_at records the clock when the row's id was drawn.
 * @param {string} schema
 * @param {string} idDefault
 */
function photosCopySql(schema, idDefault) {
  return `
CREATE TABLE ${schema}.photos_copy (
  id         bigint NOT NULL DEFAULT ${idDefault},
  user_id    bigint NOT NULL,
  image_url  text NOT NULL,
  caption    text,
  created_at timestamptz NOT NULL DEFAULT now(),
  drawn_at   timestamptz NOT NULL DEFAULT clock_timestamp()
);`;
}

/**
 * The functions timed. Each shardctl-style call gets its own sequence so that one test does not
 * move another's position. `none` and `plpgsql` are the floors: the statement without any call,
 * and a PL/pgSQL function that only returns nextval() (what any PL/pgSQL id function pays).
 */
const COST_VARIANTS = [
  { key: 'none', label: 'no call (generate_series alone)', call: 'g' },
  { key: 'nextval', label: 'bare nextval()', call: `nextval('${SCHEMA}.plain_seq')` },
  {
    key: 'plpgsql',
    label: 'PL/pgSQL floor: RETURN nextval(seq)',
    call: `${SCHEMA}.plpgsql_nextval('${SCHEMA}.floor_seq')`,
  },
  { key: 'shardctl', label: `shardctl ${SCHEMA}.next_id(seq)`, call: `${SCHEMA}.next_id('${SCHEMA}.cost_seq')` },
  { key: 'instagram', label: "Instagram's published next_id()", call: `${REFERENCE_SCHEMA}.next_id()` },
];

const ID_FUNCTIONS = [
  {
    key: 'shardctl',
    label: `shardctl ${SCHEMA}.next_id(seq)`,
    schema: SCHEMA,
    call: /** @param {string} seq */ (seq) => `${SCHEMA}.next_id('${SCHEMA}.${seq}')`,
  },
  {
    key: 'instagram',
    label: "Instagram's published next_id()",
    schema: REFERENCE_SCHEMA,
    call: /** @param {string} _seq */ (_seq) => `${REFERENCE_SCHEMA}.next_id()`,
  },
];

/**
 * @param {import('./run.js').BenchContext} ctx
 * @param {string} major
 */
export async function run(ctx, major) {
  const { options } = ctx;
  const host = itemAt(await ctx.hosts(major, 1), 0);
  const serverVersion = await host.serverVersion();
  log(`next-id on PostgreSQL ${serverVersion}: installing the functions in database ${DATABASE}`);
  await host.resetDatabase(DATABASE);
  try {
    await withClient(host.url(DATABASE), async (client) => {
      await client.query(`CREATE SCHEMA ${SCHEMA}`);
      // The slow path's lock rows live in the control schema.
      await client.query(controlLocksSql());
      // The host's slow path, shared by its shards.
      await client.query(renderNextIdControlSql(LAYOUT, 'insta'));
      await client.query(renderNextIdSql(SCHEMA, SHARD, LAYOUT));
      for (const seq of ['plain_seq', 'floor_seq', 'cost_seq', 'unique_seq', 'photos_id_seq']) {
        await client.query(`CREATE SEQUENCE ${SCHEMA}.${seq}`);
      }
      await client.query(
        `CREATE FUNCTION ${SCHEMA}.plpgsql_nextval(seq regclass) RETURNS bigint LANGUAGE plpgsql AS $$ BEGIN RETURN nextval(seq); END $$`,
      );
      await client.query(photosCopySql(SCHEMA, `${SCHEMA}.next_id('${SCHEMA}.photos_id_seq')`));
      await client.query(`CREATE SEQUENCE ${SCHEMA}.slow_seq`);
      await client.query(PACED_FUNCTION);
      await client.query(INSTAGRAM_FUNCTION);
      await client.query(photosCopySql(REFERENCE_SCHEMA, `${REFERENCE_SCHEMA}.next_id()`));
    });
    const settings = await host.query(
      DATABASE,
      `select current_setting('fsync') as fsync, current_setting('synchronous_commit') as synchronous_commit, current_setting('shared_buffers') as shared_buffers`,
    );

    const cost = await measureCost(host, options);
    const slowPath = await measureSlowPath(host, options);
    const uniqueness = [];
    for (const fn of ID_FUNCTIONS) uniqueness.push(await measureUniqueness(host, fn, options));
    const concurrency = [];
    for (const fn of ID_FUNCTIONS) concurrency.push(await measureConcurrency(host, fn, options));

    const ours = required(
      uniqueness.find((u) => u.function === 'shardctl'),
      'uniqueness result of shardctl',
    );
    const oursConcurrent = required(
      concurrency.find((c) => c.function === 'shardctl'),
      'concurrency result of shardctl',
    );
    /** @param {string} key */
    const costOf = (key) =>
      required(
        cost.functions.find((f) => f.function === key),
        `cost result of ${key}`,
      );
    const floor = costOf('plpgsql').ms.median;
    const oursCost = costOf('shardctl').ms.median;
    /** @param {(typeof slowPath)[number]} s */
    const targeted = (s) => s.function === 'shardctl' && (s.idsPerMs === null || s.idsPerMs >= TARGET_MIN_RATE);
    const worstShare = Math.max(...slowPath.map((s) => (targeted(s) ? s.sharePercent : 0)));
    const [floorCpu, oursCpu] = [costOf('plpgsql').cpuNsPerId, costOf('shardctl').cpuNsPerId];
    const cpuRatio = floorCpu && oursCpu !== null ? ratio(oursCpu, floorCpu) : null;
    const targets = {
      uniqueAtSpeed: {
        wanted: '0 duplicates',
        got: ours.duplicates,
        met: ours.duplicates === 0 && ours.wrongShard === 0 && ours.nonPositive === 0,
      },
      uniqueConcurrent: {
        wanted: '0 duplicates, 0 errors',
        got: oursConcurrent.duplicates,
        met: oursConcurrent.duplicates === 0 && oursConcurrent.errors === 0,
      },
      vsFloor: {
        wanted: '≤ 1.2x the PL/pgSQL floor',
        got: ratio(oursCost, floor),
        cpu: cpuRatio,
        // On a shared machine a statement's wall time includes waiting for a core, which can flatter
        // either side; the target counts as met only when the backend's CPU time agrees.
        met: ratio(oursCost, floor) <= 1.2 && (floorCpu ? cpuRatio !== null && cpuRatio <= 1.2 : true),
      },
      slowPath: {
        wanted: `≤ 0.5% of calls (full speed, and steady rates ≥ ${TARGET_MIN_RATE} ids/ms)`,
        got: worstShare,
        met: worstShare <= 0.5,
      },
    };
    return {
      benchmark: 'next-id',
      postgres: serverVersion,
      settings: required(settings[0], 'row of the server settings'),
      cost,
      slowPath,
      uniqueness,
      concurrency,
      targets,
    };
  } finally {
    // The concurrency tables hold millions of rows; later benchmarks share this host.
    await host.dropDatabase(DATABASE).catch(() => undefined);
  }
}

/**
 * CPU time (user + system, ms) of a local server backend so far, from /proc; null where there is
 * no /proc. On a shared machine the wall time of a statement includes waiting for a core; the
 * backend's CPU time does not, so both are reported.
 * @param {number} pid
 */
function backendCpuMs(pid) {
  try {
    return processCpuMs(pid);
  } catch {
    return null;
  }
}

/**
 * @param {Host} host
 * @param {BenchOptions} options
 */
async function measureCost(host, { ids, idRuns }) {
  /**
   * @param {(typeof COST_VARIANTS)[number]} variant
   * @param {number} n
   */
  const sqlOf = (variant, n) => `select count(x) from (select ${variant.call} as x from generate_series(1, ${n}) g) s`;
  /** variant → wall ms of each run @type {Map<string, number[]>} */
  const times = new Map(COST_VARIANTS.map((v) => [v.key, []]));
  /** variant → backend CPU ms of each run @type {Map<string, number[]>} */
  const cpu = new Map(COST_VARIANTS.map((v) => [v.key, []]));
  await withClient(host.url(DATABASE), async (client) => {
    /** @type {number} */
    const pid = required((await client.query('select pg_backend_pid() as pid')).rows[0], 'row of pg_backend_pid()').pid;
    // Untimed warm-up: plans, function caches, sequence pages.
    for (const variant of COST_VARIANTS) await client.query(sqlOf(variant, Math.max(1, Math.floor(ids / 10))));
    for (let round = 0; round < idRuns; round++) {
      const order = roundOrder(COST_VARIANTS, round);
      for (const variant of order) {
        const started = performance.now();
        const cpuBefore = backendCpuMs(pid);
        const result = await client.query(sqlOf(variant, ids));
        times.get(variant.key)?.push(performance.now() - started);
        const cpuAfter = backendCpuMs(pid);
        if (cpuBefore !== null && cpuAfter !== null) cpu.get(variant.key)?.push(cpuAfter - cpuBefore);
        const counted = result.rows[0]?.count;
        if (Number(counted) !== ids) throw new Error(`${variant.label}: counted ${counted} ids, drew ${ids}`);
      }
      log(
        `  cost round ${round + 1}/${idRuns}: ${order.map((v) => `${v.key} ${formatMs(times.get(v.key)?.at(-1))}`).join(', ')}`,
      );
    }
  });
  const medians = Object.fromEntries([...times].map(([key, values]) => [key, summarize(values)]));
  const cpuMedians = Object.fromEntries(
    [...cpu].map(([key, values]) => [key, values.length > 0 ? summarize(values) : null]),
  );
  const none = required(medians.none, 'cost sample of no call').median;
  const nextval = required(medians.nextval, 'cost sample of nextval()').median;
  return {
    ids,
    runs: idRuns,
    functions: COST_VARIANTS.map((variant) => {
      const sample = required(medians[variant.key], `cost sample of ${variant.key}`);
      const cpuSample = cpuMedians[variant.key];
      return {
        function: variant.key,
        label: variant.label,
        ms: sample,
        nsPerId: round((sample.median * 1e6) / ids, 0),
        // The server backend's CPU time per id (10 ms resolution over the whole statement).
        cpuNsPerId: cpuSample ? round((cpuSample.median * 1e6) / ids, 0) : null,
        // Gross: whole statements compared, as the issue's figures are.
        vsNextval: ratio(sample.median, nextval),
        // Net: the statement's own cost (generate_series, count) taken out of both.
        netVsNextval: variant.key === 'none' ? null : ratio(sample.median - none, nextval - none),
      };
    }),
  };
}

/**
 * Draws ids at a steady rate: perMs ids at the start of every millisecond for ms milliseconds
 * (busy-waiting in between, so the rate does not depend on the timer's resolution).
 */
const PACED_FUNCTION = `
CREATE FUNCTION public.draw_paced(fn text, seq regclass, per_ms int, ms int) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
  started timestamptz := clock_timestamp();
BEGIN
  FOR tick IN 1..ms LOOP
    EXECUTE format('SELECT count(%s.next_id($1)) FROM generate_series(1, $2)', fn) USING seq, per_ms;
    WHILE clock_timestamp() < started + tick * interval '1 millisecond' LOOP END LOOP;
  END LOOP;
END $$`;

/**
 * How often the locked slow path runs, from the function statistics of one transaction
 * (track_functions = 'pl' counts PL/pgSQL calls: next_id_locked once per slow call), against the
 * ids drawn (next_id() calls no PL/pgSQL function for an id on the fast path, so there is no per-id call
 * to count; the statements below draw a known number). At full speed (--ids × 4 ids in one statement, as
 * in the issue) and at steady rates from 1000 down to 20 ids per millisecond, each on a new sequence
 * that starts at the clock.
 * @param {Host} host
 * @param {BenchOptions} options
 */
async function measureSlowPath(host, { ids }) {
  // next_id in the shard's schema; its slow path is the control schema's (one function per host).
  const variants = [{ function: 'shardctl', schema: SCHEMA, slowPathSchema: CONTROL_SCHEMA }];
  /**
   * @type {{
   *   function: string,
   *   idsPerMs: number | null,
   *   calls: number,
   *   lockedCalls: number,
   *   sharePercent: number,
   *   lockedUsPerCall: number | null,
   *   ms: number,
   * }[]}
   */
  const results = [];
  await withClient(host.url(DATABASE), async (client) => {
    /**
     * @param {(typeof variants)[number]} variant
     * @param {number | null} idsPerMs
     * @param {string} sql
     * @param {number} ids
     */
    const measure = async (variant, idsPerMs, sql, ids) => {
      await client.query(`BEGIN; SET LOCAL track_functions = 'pl'`);
      try {
        const started = performance.now();
        await client.query(sql);
        const ms = performance.now() - started;
        const stats = await client.query(
          `SELECT funcname, calls, total_time FROM pg_stat_xact_user_functions WHERE schemaname = $1 AND funcname = 'next_id_locked'`,
          [variant.slowPathSchema],
        );
        /** @param {string} name */
        const stat = (name) => stats.rows.find((r) => r.funcname === name) ?? { calls: 0, total_time: 0 };
        const calls = ids;
        const locked = Number(stat('next_id_locked').calls);
        results.push({
          function: variant.function,
          idsPerMs,
          calls,
          lockedCalls: locked,
          sharePercent: round((100 * locked) / calls, 3),
          lockedUsPerCall: locked > 0 ? round((1000 * Number(stat('next_id_locked').total_time)) / locked, 1) : null,
          ms: round(ms),
        });
      } finally {
        await client.query('COMMIT');
      }
    };
    for (const variant of variants) {
      const full = ids * 4;
      log(`  slow path: ${formatCount(full)} ids at full speed, then steady rates, ${variant.function}`);
      await measure(
        variant,
        null,
        `select count(${variant.schema}.next_id('${variant.schema}.slow_seq')) from generate_series(1, ${full})`,
        full,
      );
      for (const rate of PACED_RATES) {
        // A new sequence for each rate, moved to the clock by one untimed id: the statement at full
        // speed leaves slow_seq seconds ahead of the clock, which the faster rates would only use up.
        const seq = `${variant.schema}.paced_seq`;
        await client.query(
          `DROP SEQUENCE IF EXISTS ${seq}; CREATE SEQUENCE ${seq}; SELECT ${variant.schema}.next_id('${seq}')`,
        );
        await measure(
          variant,
          rate,
          `select public.draw_paced('${variant.schema}', '${seq}', ${rate}, ${PACED_MS})`,
          rate * PACED_MS,
        );
      }
    }
  });
  return results;
}

/**
 * @param {Host} host
 * @param {IdFunction} fn
 * @param {BenchOptions} options
 */
async function measureUniqueness(host, fn, { uniqueIds }) {
  log(`  uniqueness: ${formatCount(uniqueIds)} ids from ${fn.label} in one statement`);
  const sql = `
    select count(*) as n,
           count(distinct x) as distinct_ids,
           count(*) filter (where x <= 0) as non_positive,
           count(*) filter (where (x >> ${LAYOUT.sequenceBits}) & ${SHARD_MASK} <> ${SHARD}) as wrong_shard,
           max(((x >> ${TIME_SHIFT}) + ${LAYOUT.epochMs}) - floor(date_part('epoch', drawn_at) * 1000)::bigint) as ahead_ms
      from (select ${fn.call('unique_seq')} as x, clock_timestamp() as drawn_at from generate_series(1, ${uniqueIds})) s`;
  const started = performance.now();
  const rows = await host.query(DATABASE, `set work_mem = '${ANALYSIS_WORK_MEM}'; ${sql}`);
  const ms = performance.now() - started;
  const row = required(rows[0], 'row of the uniqueness count');
  const n = Number(row.n);
  const distinct = Number(row.distinct_ids);
  return {
    function: fn.key,
    label: fn.label,
    ids: n,
    distinct,
    duplicates: n - distinct,
    nonPositive: Number(row.non_positive),
    wrongShard: Number(row.wrong_shard),
    // How far an id's time field ran ahead of the clock that drew it: a burst borrows
    // milliseconds from the future instead of repeating.
    maxIdAheadOfClockMs: Number(row.ahead_ms),
    ms: round(ms),
  };
}

/**
 * @param {Host} host
 * @param {IdFunction} fn
 * @param {BenchOptions} options
 */
async function measureConcurrency(host, fn, { sessions, batch, seconds }) {
  const table = `${fn.schema}.photos_copy`;
  log(`  concurrency: ${sessions} sessions × ${batch}-row batches for ${seconds} s into ${table} (${fn.label})`);
  await host.query(DATABASE, `truncate ${table}`);
  const insert = `insert into ${table} (user_id, image_url) select g, 'https://example.com/p/' || g || '.jpg' from generate_series(1, ${batch}) g`;
  /** @type {import('pg').Client[]} */
  const clients = [];
  /** @type {{ batches: number, errors: number, firstError: string | null }[]} */
  let sessionResults;
  /** @type {number} */
  let elapsedMs;
  try {
    for (let i = 0; i < sessions; i++) {
      clients.push(await connect(host.url(DATABASE)));
    }
    const started = performance.now();
    const deadline = started + seconds * 1000;
    sessionResults = await Promise.all(
      clients.map(async (client) => {
        let batches = 0;
        let errors = 0;
        /** @type {string | null} */
        let firstError = null;
        while (performance.now() < deadline) {
          try {
            await client.query(insert);
            batches += 1;
          } catch (error) {
            errors += 1;
            firstError ??= errorMessage(error);
          }
        }
        return { batches, errors, firstError };
      }),
    );
    elapsedMs = performance.now() - started;
  } finally {
    await Promise.all(clients.map((client) => client.end().catch(() => undefined)));
  }

  log(`  counting duplicates in ${table}`);
  const rows = await host.query(
    DATABASE,
    `set work_mem = '${ANALYSIS_WORK_MEM}';
     select (select count(*) from ${table}) as n,
            (select count(distinct id) from ${table}) as distinct_ids,
            (select max(c) from (select count(*) as c from ${table} group by date_trunc('milliseconds', drawn_at)) m) as max_per_clock_ms,
            (select max(c) from (select count(*) as c from ${table} group by id >> ${TIME_SHIFT}) m) as max_per_id_ms,
            (select max(((id >> ${TIME_SHIFT}) + ${LAYOUT.epochMs}) - floor(date_part('epoch', drawn_at) * 1000)::bigint) from ${table}) as max_ahead_ms`,
  );
  await host.query(DATABASE, `truncate ${table}`);
  const row = required(rows[0], `row of the duplicate count in ${table}`);
  const n = Number(row.n);
  const distinct = Number(row.distinct_ids);
  const errors = sessionResults.reduce((sum, s) => sum + s.errors, 0);
  return {
    function: fn.key,
    label: fn.label,
    sessions,
    batchRows: batch,
    seconds: round(elapsedMs / 1000, 2),
    ids: n,
    distinct,
    duplicates: n - distinct,
    errors,
    firstError: sessionResults.find((s) => s.firstError)?.firstError ?? null,
    idsPerSecond: Math.round(n / (elapsedMs / 1000)),
    // Rows whose id was drawn in the same clock millisecond (the load the layout had to absorb).
    maxIdsPerClockMs: Number(row.max_per_clock_ms),
    // Ids sharing one value of the id's time field: never above 2^sequenceBits for shardctl.
    maxIdsPerIdMs: Number(row.max_per_id_ms),
    maxIdAheadOfClockMs: Number(row.max_ahead_ms),
  };
}

// ---------------------------------------------------------------------------------------------
// Output

/** @param {NextIdResult} result */
function costRows(result) {
  return result.cost.functions.map((f) => [
    f.label,
    formatMs(f.ms.median),
    `${formatMs(f.ms.min)}–${formatMs(f.ms.max)}`,
    `${f.nsPerId} ns`,
    f.cpuNsPerId === null ? 'n/a' : `${f.cpuNsPerId} ns`,
    f.function === 'none' ? '' : `${f.vsNextval.toFixed(2)}x`,
    f.netVsNextval === null ? '' : `${f.netVsNextval.toFixed(2)}x`,
  ]);
}
const COST_HEADERS = ['function', 'median', 'range', 'per id', 'backend CPU per id', 'vs nextval', 'net vs nextval'];

/** @param {NextIdResult} result */
function uniquenessRows(result) {
  return result.uniqueness.map((u) => [
    u.label,
    formatCount(u.ids),
    formatCount(u.distinct),
    formatCount(u.duplicates),
    `${u.maxIdAheadOfClockMs} ms`,
    formatMs(u.ms),
  ]);
}
/** @param {NextIdResult} result */
function slowPathRows(result) {
  return result.slowPath.map((s) => [
    `shardctl next_id (v${ID_FUNCTION_VERSION})`,
    s.idsPerMs === null ? 'full speed, one statement' : `${s.idsPerMs} ids/ms`,
    formatCount(s.calls),
    formatCount(s.lockedCalls),
    `${s.sharePercent}%`,
    s.lockedUsPerCall === null ? '' : `${s.lockedUsPerCall} µs`,
  ]);
}
const SLOW_PATH_HEADERS = ['function', 'drawing rate', 'calls', 'locked calls', 'share', 'per locked call'];

const UNIQUENESS_HEADERS = ['function', 'ids', 'distinct', 'duplicates', 'max id ahead of clock', 'time'];

/** @param {NextIdResult} result */
function concurrencyRows(result) {
  return result.concurrency.map((c) => [
    c.label,
    formatCount(c.ids),
    formatCount(c.duplicates),
    String(c.errors),
    formatCount(c.idsPerSecond),
    String(c.maxIdsPerClockMs),
    String(c.maxIdsPerIdMs),
    `${c.maxIdAheadOfClockMs} ms`,
  ]);
}
const CONCURRENCY_HEADERS = [
  'function',
  'ids',
  'duplicates',
  'errors',
  'ids/s',
  'max ids per clock ms',
  'max ids per id ms',
  'max id ahead of clock',
];

/** @param {NextIdResult} result */
export function table(result) {
  const c = itemAt(result.concurrency, 0);
  return [
    `next-id on PostgreSQL ${result.postgres} (fsync=${result.settings.fsync})`,
    '',
    `Cost: ${formatCount(result.cost.ids)} ids in one statement, median of ${result.cost.runs} interleaved runs`,
    textTable(COST_HEADERS, costRows(result)),
    '',
    `Locked slow path (track_functions = 'pl')`,
    textTable(SLOW_PATH_HEADERS, slowPathRows(result)),
    '',
    `Uniqueness: ids drawn in one statement`,
    textTable(UNIQUENESS_HEADERS, uniquenessRows(result)),
    '',
    `Concurrency: ${c.sessions} sessions inserting ${c.batchRows}-row batches for ${c.seconds} s (no primary key)`,
    textTable(CONCURRENCY_HEADERS, concurrencyRows(result)),
    '',
    `Targets: unique at speed ${verdict(result.targets.uniqueAtSpeed.met)}; unique under concurrency ${verdict(result.targets.uniqueConcurrent.met)}; ≤ 1.2x the PL/pgSQL floor ${verdict(result.targets.vsFloor.met)} (${result.targets.vsFloor.got}x); slow path ≤ 0.5% ${verdict(result.targets.slowPath.met)} (worst ${result.targets.slowPath.got}%)`,
  ].join('\n');
}

/** @param {NextIdResult[]} results */
export function markdown(results) {
  return results
    .map((result) => {
      const c = itemAt(result.concurrency, 0);
      return [
        `#### PostgreSQL ${result.postgres}`,
        '',
        `Cost: ${formatCount(result.cost.ids)} ids in one statement; median (and range) of ${result.cost.runs} interleaved runs.`,
        '',
        markdownTable(COST_HEADERS, costRows(result)),
        '',
        `Locked slow path: calls of next_id_locked among all calls (track_functions = 'pl', one transaction each; the steady rates draw that many ids at the start of every millisecond for ${PACED_MS} ms, each rate on a new sequence that starts at the clock). Time per locked call includes waiting for the lock.`,
        '',
        markdownTable(SLOW_PATH_HEADERS, slowPathRows(result)),
        '',
        'Uniqueness: ids drawn in one statement.',
        '',
        markdownTable(UNIQUENESS_HEADERS, uniquenessRows(result)),
        '',
        `Concurrency: ${c.sessions} sessions inserting ${c.batchRows}-row batches for ${c.seconds} s into a copy of photos without a primary key.`,
        '',
        markdownTable(CONCURRENCY_HEADERS, concurrencyRows(result)),
        '',
        `Targets: 0 duplicates at speed: ${verdict(result.targets.uniqueAtSpeed.met)}; 0 duplicates and 0 errors under concurrency: ${verdict(result.targets.uniqueConcurrent.met)}; next_id ≤ 1.2x the PL/pgSQL floor: ${verdict(result.targets.vsFloor.met)} (${result.targets.vsFloor.got}x wall, ${result.targets.vsFloor.cpu}x backend CPU); locked slow path ≤ 0.5% of calls at full speed and at steady rates of ${TARGET_MIN_RATE} ids/ms and more: ${verdict(result.targets.slowPath.met)} (worst ${result.targets.slowPath.got}%).`,
      ].join('\n');
    })
    .join('\n\n');
}
