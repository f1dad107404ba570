/**
 * discovery: what it costs that the map lives in the fleet (issue 19), on a fleet of
 * --discovery-shards shards over --discovery-hosts hosts (init once, untimed).
 *
 * 1. Opening a router by discovery: `ShardRouter.open({ seeds: [one host] })` (the seed, then every
 *    host its registry names, in parallel: placement, registry, layout) and `ShardRouter.open(file)`
 *    (every host of the file at once), each followed by close(), alternating, --discovery-runs times.
 *    Target: < 200 ms.
 * 2. A stale process's first call after a switch: a router opened before any move keeps its map;
 *    shards are moved one by one from the first host to the second (`moveShards`, online, each
 *    reporting its write-blocked time); right after each move the router's first call to the moved
 *    shard (an insert) is timed: it meets the old copy's SC100, asks the named host whether it holds
 *    the shard, and runs there. Target: within 2x the move's write-blocked time (median of ratios).
 */
import { copyFile } from 'node:fs/promises';
import path from 'node:path';
import { loadConfig, moveShards, ShardRouter } from '../dist/index.js';
import {
  formatMs,
  formatSample,
  initFleet,
  itemAt,
  log,
  markdownTable,
  round,
  summarize,
  textTable,
  verdict,
} from './lib.js';

export const description =
  "router open by discovery (seed URL, file) at 8192 shards / 8 hosts; a stale router's first call after a switch";

const DATABASE = 'bench_discovery';
const OPEN_TARGET_MS = 200;
const STALE_TARGET = 2;

/**
 * @param {import('./run.js').BenchContext} ctx
 * @param {string} major
 */
export async function run(ctx, major) {
  const { options } = ctx;
  const hostCount = options.discoveryHosts;
  const shards = options.discoveryShards;
  const fleet = await ctx.fleet('discovery', major, { database: DATABASE, hostCount, shards });
  const firstHost = itemAt(fleet.hosts, 0);
  const serverVersion = await firstHost.serverVersion();
  log(`discovery on PostgreSQL ${serverVersion}: init of ${shards} shards over ${hostCount} hosts (untimed)`);
  await initFleet(fleet);
  const config = await loadConfig(fleet.configFile);

  // --- 1. open ---------------------------------------------------------------------------------
  const seed = firstHost.url(DATABASE);
  /** @type {number[]} */
  const seedMs = [];
  /** @type {number[]} */
  const fileMs = [];
  for (let i = 0; i < options.discoveryRuns; i++) {
    /** @type {['seed' | 'file', number[]][]} */
    const sides =
      i % 2 === 0
        ? [
            ['seed', seedMs],
            ['file', fileMs],
          ]
        : [
            ['file', fileMs],
            ['seed', seedMs],
          ];
    for (const [source, sample] of sides) {
      const started = performance.now();
      const router = await ShardRouter.open(source === 'seed' ? { seeds: [seed] } : fleet.configFile);
      sample.push(performance.now() - started);
      const placed = router.map.hosts.reduce((n, h) => n + h.shards.length, 0);
      await router.close();
      if (placed !== shards)
        throw new Error(`the router opened from the ${source} placed ${placed} of ${shards} shards`);
    }
  }
  log(`  open from one seed: ${formatSample(summarize(seedMs))}; from the file: ${formatSample(summarize(fileMs))}`);

  // --- 2. a stale router's first call after a switch -----------------------------------------
  const stale = path.join(fleet.dir, 'stale-copy.yaml');
  await copyFile(fleet.configFile, stale);
  const router = await ShardRouter.open(stale);
  if (config.hosts.length < 2)
    throw new Error(`discovery moves shards between two hosts; the fleet has ${config.hosts.length}`);
  const from = itemAt(config.hosts, 0);
  const to = itemAt(config.hosts, 1);
  /** @param {import('pg').PoolClient} client */
  const insert = (client) => client.query("insert into photos (user_id, image_url) values (1, 'stale')");
  /** @type {number[]} */
  const firstCallMs = [];
  /** @type {number[]} */
  const blockedMs = [];
  /** @type {number[]} */
  const ratios = [];
  if (from.shards.length < options.staleMoves)
    throw new Error(`--stale-moves ${options.staleMoves}: the first host has only ${from.shards.length} shards`);
  try {
    // Both hosts' pools connected, as in a running application.
    await router.withShard(itemAt(to.shards, 0), insert);
    for (let i = 0; i < options.staleMoves; i++) {
      const shard = itemAt(from.shards, i);
      await router.withShard(shard, insert);
      const moved = await moveShards(await loadConfig(fleet.configFile), [shard], to.name, {
        configFile: fleet.configFile,
      });
      const started = performance.now();
      const result = await router.withShard(shard, async (client) => {
        await insert(client);
        return client.query('select 1');
      });
      const ms = performance.now() - started;
      if (!result) throw new Error('the stale router returned nothing');
      const routedTo = router.hostForShard(shard).name;
      if (routedTo !== to.name) throw new Error(`the stale router still routes shard ${shard} to ${routedTo}`);
      firstCallMs.push(ms);
      blockedMs.push(moved.writeBlockedMs ?? 0);
      ratios.push(ms / Math.max(1, moved.writeBlockedMs ?? 1));
      log(
        `  shard ${shard}: write-blocked ${formatMs(moved.writeBlockedMs ?? 0)}, the stale router's first call ${formatMs(ms)}`,
      );
    }
  } finally {
    await router.close();
  }
  const open = { seed: summarize(seedMs), file: summarize(fileMs) };
  const staleRatio = summarize(ratios);
  return {
    benchmark: 'discovery',
    postgres: serverVersion,
    shards,
    hosts: hostCount,
    runs: options.discoveryRuns,
    openMs: open,
    staleFirstCallMs: summarize(firstCallMs),
    writeBlockedMs: summarize(blockedMs),
    staleRatio,
    targets: {
      open: {
        wanted: `< ${OPEN_TARGET_MS} ms`,
        met: open.seed.median < OPEN_TARGET_MS && open.file.median < OPEN_TARGET_MS,
      },
      stale: { wanted: `≤ ${STALE_TARGET}x the write-blocked time`, met: staleRatio.median <= STALE_TARGET },
    },
  };
}

const HEADERS = ['PostgreSQL', 'what', 'measured', 'target'];

/** @typedef {Awaited<ReturnType<typeof run>>} DiscoveryResult */

/** @param {DiscoveryResult[]} results */
function rows(results) {
  return results.flatMap((r) => [
    [
      r.postgres,
      `ShardRouter.open({ seeds: [one host] }), ${r.shards} shards over ${r.hosts} hosts`,
      formatSample(r.openMs.seed),
      `${r.targets.open.wanted}: ${verdict(r.openMs.seed.median < OPEN_TARGET_MS)}`,
    ],
    [
      r.postgres,
      `ShardRouter.open(file), same fleet`,
      formatSample(r.openMs.file),
      `${r.targets.open.wanted}: ${verdict(r.openMs.file.median < OPEN_TARGET_MS)}`,
    ],
    [
      r.postgres,
      `a stale router's first call after a switch (${r.staleFirstCallMs.runs.length} moves of one shard)`,
      `${formatSample(r.staleFirstCallMs)}; the moves' write-blocked time ${formatSample(r.writeBlockedMs)}; ratio ${round(r.staleRatio.median, 2)}x (${round(r.staleRatio.min, 2)}–${round(r.staleRatio.max, 2)})`,
      `${r.targets.stale.wanted}: ${verdict(r.targets.stale.met)}`,
    ],
  ]);
}

/** @param {DiscoveryResult} result */
export function table(result) {
  return [`discovery: median (range) of ${result.runs} runs`, textTable(HEADERS, rows([result]))].join('\n');
}

/** @param {DiscoveryResult[]} results */
export function markdown(results) {
  return [
    `Median (range) of ${itemAt(results, 0).runs} alternating runs each; stale calls: one per move.`,
    '',
    markdownTable(HEADERS, rows(results)),
  ].join('\n');
}
