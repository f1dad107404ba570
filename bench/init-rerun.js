/**
 * init-rerun: `shardctl init` again on a complete fleet, which must find nothing to do and take
 * at most 5% of the first run (it reads a few catalog rows per host and writes nothing).
 *
 * The first-run time is the init benchmark's median when it ran in the same invocation at the
 * same scale (its fleet is then complete); otherwise this benchmark times its own first runs.
 */
import { loadConfig, readMigrations } from '../dist/index.js';
import { INIT_DATABASE } from './init.js';
import {
  formatMs,
  formatRss,
  formatSample,
  itemAt,
  log,
  peakOf,
  markdownTable,
  ratio,
  resetDatabases,
  summarize,
  textTable,
  timeCli,
  verdict,
  verifyFleet,
} from './lib.js';

export const description = 'shardctl init again on a complete fleet (nothing to do) vs the first run';

const TARGET_RATIO = 0.05;

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
  const version = (await readMigrations(config.migrationsDir)).at(-1)?.version ?? 0;

  /** @type {import('./lib.js').Sample} */
  let first;
  /** @type {string} */
  let firstSource;
  const earlier = ctx.results.get(`init@${major}`);
  if (earlier) {
    first = earlier.shardctlMs;
    firstSource = 'the init benchmark of this run';
    log(`init-rerun on PostgreSQL ${serverVersion}: first run from the init benchmark (${formatMs(first.median)})`);
  } else {
    log(`init-rerun on PostgreSQL ${serverVersion}: timing ${options.runs} first runs of ${options.shards} shards`);
    /** @type {number[]} */
    const firstRuns = [];
    for (let i = 0; i < options.runs; i++) {
      await resetDatabases(fleet.hosts, INIT_DATABASE);
      firstRuns.push((await timeCli(['init', '-c', fleet.configFile], { cwd: fleet.dir })).ms);
      log(`  first run ${i + 1}/${options.runs}: ${formatMs(firstRuns.at(-1))}`);
    }
    first = summarize(firstRuns);
    firstSource = 'first runs timed by this benchmark';
  }
  await verifyFleet(config, fleet, { version });
  // The reruns start from flushed buffers, as the first runs did.
  await Promise.all(fleet.hosts.map((host) => host.query('postgres', 'checkpoint')));

  /** @type {number[]} */
  const reruns = [];
  /** @type {(number | null)[]} */
  const rss = [];
  for (let i = 0; i < options.rerunRuns; i++) {
    const timed = await timeCli(['init', '-c', fleet.configFile], { cwd: fleet.dir });
    if (!/0 shards created, 0 migrations applied/.test(timed.stdout + timed.stderr)) {
      throw new Error(`init on a complete fleet changed something:\n${timed.stdout}${timed.stderr}`);
    }
    reruns.push(timed.ms);
    rss.push(timed.peakRssKiB);
    log(`  rerun ${i + 1}/${options.rerunRuns}: ${formatMs(timed.ms)}`);
  }
  await verifyFleet(config, fleet, { version });

  const rerunSample = summarize(reruns);
  const measuredRatio = ratio(rerunSample.median, first.median);
  return {
    benchmark: 'init-rerun',
    postgres: serverVersion,
    shards: options.shards,
    hosts: fleet.hosts.length,
    firstMs: first,
    firstSource,
    rerunMs: rerunSample,
    ratio: measuredRatio,
    peakRssKiB: peakOf(rss),
    targets: {
      vsFirstRun: { wanted: `≤ ${TARGET_RATIO * 100}%`, got: measuredRatio, met: measuredRatio <= TARGET_RATIO },
    },
  };
}

const HEADERS = ['PostgreSQL', 'fleet', 'first run', 'rerun', 'rerun / first', 'target', 'peak RSS'];

/** @param {Result[]} results */
function rows(results) {
  return results.map((r) => [
    r.postgres,
    `${r.shards} shards, ${r.hosts} hosts`,
    formatSample(r.firstMs),
    formatSample(r.rerunMs),
    `${(r.ratio * 100).toFixed(1)}%`,
    `≤ ${TARGET_RATIO * 100}%: ${verdict(r.targets.vsFirstRun.met)}`,
    formatRss(r.peakRssKiB),
  ]);
}

/** @param {Result} result */
export function table(result) {
  return [
    `init-rerun: median (range) of ${result.rerunMs.runs.length} reruns; first run from ${result.firstSource}`,
    textTable(HEADERS, rows([result])),
  ].join('\n');
}

/** @param {Result[]} results */
export function markdown(results) {
  return [
    `Median (range) of ${itemAt(results, 0).rerunMs.runs.length} reruns on the complete fleet; the first run is the median from ${itemAt(results, 0).firstSource}.`,
    '',
    markdownTable(HEADERS, rows(results)),
  ].join('\n');
}
