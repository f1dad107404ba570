/**
 * init: `shardctl init` of a whole fleet (default 8192 shards × the 3 example tables over 4 local
 * hosts) against the floor: the same SQL as plain psql scripts, one per host, run in parallel.
 *
 * The floor's SQL is the library's own plan (`init(config, { dryRun: true })`), so both sides
 * run identical DDL and the difference is shardctl's overhead: Node start-up, locking, catalog
 * reads, planning, round trips. Before every run each host's database is dropped and created
 * again, then checkpointed; the runs alternate (ours first, then psql first) so that drift of
 * the machine hits both alike. Every run is checked afterwards with the library's status().
 */
import { init, loadConfig } from '../dist/index.js';
import {
  EXAMPLE_TABLES,
  formatMs,
  formatRss,
  formatSample,
  itemAt,
  log,
  peakOf,
  markdownTable,
  ratio,
  resetDatabases,
  roundOrder,
  summarize,
  textTable,
  timeCli,
  timePsqlScripts,
  verdict,
  verifyFleet,
  writePlanScripts,
} from './lib.js';

export const description = 'shardctl init of the whole fleet vs the same SQL as parallel psql scripts';

/** The database init's fleet lives in on every host; init-rerun reuses it. */
export const INIT_DATABASE = 'bench_init';
/** ours/psql wall time must stay within this. */
const TARGET_RATIO = 1.1;

/** @typedef {Awaited<ReturnType<typeof run>>} Result */

/**
 * @param {import('./run.js').BenchContext} ctx
 * @param {string} major
 */
export async function run(ctx, major) {
  const { options } = ctx;
  const fleet = await ctx.fleet('init', major, { database: INIT_DATABASE });
  const config = await loadConfig(fleet.configFile);
  const serverVersion = await itemAt(fleet.hosts, 0).serverVersion();
  log(
    `init on PostgreSQL ${serverVersion}: ${options.shards} shards over ${fleet.hosts.length} hosts, ${options.runs} runs each`,
  );

  // The plan of a fresh fleet is the floor's SQL; it does not change between runs.
  await resetDatabases(fleet.hosts, INIT_DATABASE);
  const dryRun = await init(config, { dryRun: true });
  const scripts = await writePlanScripts(dryRun.plan, fleet.hosts, fleet.dir, 'init');

  /** @type {number[]} */
  const ours = [];
  /** @type {number[]} */
  const psql = [];
  /** @type {(number | null)[]} */
  const rss = [];
  for (let round = 0; round < options.runs; round++) {
    const order = roundOrder(['shardctl', 'psql'], round);
    for (const who of order) {
      await resetDatabases(fleet.hosts, INIT_DATABASE);
      if (who === 'shardctl') {
        const timed = await timeCli(['init', '-c', fleet.configFile], { cwd: fleet.dir });
        ours.push(timed.ms);
        rss.push(timed.peakRssKiB);
      } else {
        psql.push((await timePsqlScripts(fleet.hosts, scripts, INIT_DATABASE, options.psql)).ms);
      }
      await verifyFleet(config, fleet, { version: dryRun.targetVersion });
      log(`  run ${round + 1}/${options.runs}: ${who} ${formatMs((who === 'shardctl' ? ours : psql).at(-1))}`);
    }
  }

  const oursSample = summarize(ours);
  const psqlSample = summarize(psql);
  const measuredRatio = ratio(oursSample.median, psqlSample.median);
  const peakRssKiB = peakOf(rss);
  return {
    benchmark: 'init',
    postgres: serverVersion,
    shards: options.shards,
    hosts: fleet.hosts.length,
    tables: EXAMPLE_TABLES,
    concurrency: config.concurrency,
    shardctlMs: oursSample,
    psqlMs: psqlSample,
    ratio: measuredRatio,
    peakRssKiB,
    targets: { vsPsql: { wanted: `≤ ${TARGET_RATIO}x`, got: measuredRatio, met: measuredRatio <= TARGET_RATIO } },
  };
}

const HEADERS = ['PostgreSQL', 'fleet', 'shardctl init', 'psql scripts (floor)', 'ratio', 'target', 'peak RSS'];

/** @param {Result[]} results */
function rows(results) {
  return results.map((r) => [
    r.postgres,
    `${r.shards} shards × ${r.tables} tables, ${r.hosts} hosts, concurrency ${r.concurrency}`,
    formatSample(r.shardctlMs),
    formatSample(r.psqlMs),
    `${r.ratio.toFixed(2)}x`,
    `≤ ${TARGET_RATIO}x: ${verdict(r.targets.vsPsql.met)}`,
    formatRss(r.peakRssKiB),
  ]);
}

/** @param {Result} result */
export function table(result) {
  return [
    `init: median (range) of ${result.shardctlMs.runs.length} runs each, interleaved`,
    textTable(HEADERS, rows([result])),
  ].join('\n');
}

/** @param {Result[]} results */
export function markdown(results) {
  return [
    `Median (range) of ${itemAt(results, 0).shardctlMs.runs.length} runs each, interleaved; every run on freshly created databases.`,
    '',
    markdownTable(HEADERS, rows(results)),
  ].join('\n');
}
