/**
 * router-stall: do callers stop when connections serve many shards (issue 39)? One host with
 * --stall-shards shards (512 by default); 20 callers insert single rows into random shards, through
 * `router.withKey` (a pool of 20) and, in alternating rounds, through a plain pg.Pool of 20 sending
 * schema-qualified inserts. Quiet rounds first, then loaded ones: three busy loops beside the
 * benchmark (processes spinning on the 2 cores) and one session that runs `ANALYZE` on a random
 * shard's table every 100 ms, as autoanalyze does on a busy fleet: every ANALYZE sends a cache
 * invalidation that each backend processes (and, with a cached plan per shard, walks its plans).
 *
 * Per side and round: inserts per second and the longest call, p50 and p99. Targets: no call
 * longer than 1 s in any round, routed throughput ≥ 0.9x the plain pool's (medians of rounds).
 */
import { spawn } from 'node:child_process';
import pg from 'pg';
import { loadConfig, shardForKey, ShardRouter, shardSchemaName } from '../dist/index.js';
import {
  formatMs,
  initFleet,
  itemAt,
  log,
  markdownTable,
  ratio,
  required,
  round,
  summarize,
  textTable,
  verdict,
} from './lib.js';

export const description =
  '20 callers inserting over the 512 shards of a host: longest call and throughput, quiet and loaded';

const CALLERS = 20;
const LONGEST_TARGET_MS = 1000;
const THROUGHPUT_TARGET = 0.9;
const BUSY_LOOPS = 3;

/** @typedef {'quiet' | 'loaded'} Mode */
/** @typedef {'router' | 'plain'} Side */
/** @type {Mode[]} */
const MODES = ['quiet', 'loaded'];
/** @typedef {Awaited<ReturnType<typeof drive>>} Driven */

/**
 * @param {number[]} sorted
 * @param {number} p
 */
function percentile(sorted, p) {
  return sorted.length === 0 ? 0 : itemAt(sorted, Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length)));
}

/**
 * `CALLERS` loops calling `call(key)` for `seconds`; every call's duration.
 * @param {(key: bigint) => Promise<unknown>} call
 * @param {number} seconds
 */
async function drive(call, seconds) {
  /** @type {number[]} */
  const durations = [];
  const deadline = performance.now() + seconds * 1000;
  let key = BigInt(Math.floor(Math.random() * 1e9));
  await Promise.all(
    Array.from({ length: CALLERS }, async () => {
      while (performance.now() < deadline) {
        key += 7919n;
        const started = performance.now();
        await call(key);
        durations.push(performance.now() - started);
      }
    }),
  );
  durations.sort((a, b) => a - b);
  return {
    calls: durations.length,
    perSecond: durations.length / seconds,
    p50Ms: round(percentile(durations, 50), 2),
    p99Ms: round(percentile(durations, 99), 2),
    longestMs: round(durations.at(-1) ?? 0, 1),
  };
}

function startBusyLoops() {
  return Array.from({ length: BUSY_LOOPS }, () => spawn(process.execPath, ['-e', 'for (;;) {}'], { stdio: 'ignore' }));
}

/**
 * ANALYZE of a random shard's photos every 100 ms, until stopped.
 * @param {string} url
 * @param {import('../dist/index.js').ShardctlConfig} config
 */
function startInvalidations(url, config) {
  const client = new pg.Client({ connectionString: url, application_name: 'bench-stall-analyze' });
  let stopped = false;
  let analyzed = 0;
  const loop = (async () => {
    await client.connect();
    while (!stopped) {
      const shard = Math.floor(Math.random() * config.shards);
      await client.query(`ANALYZE "${shardSchemaName(config, shard)}".photos`);
      analyzed += 1;
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
    await client.end();
  })();
  return async () => {
    stopped = true;
    await loop;
    return analyzed;
  };
}

/** @typedef {Awaited<ReturnType<typeof run>>} Result */

/**
 * @param {import('./run.js').BenchContext} ctx
 * @param {string} major
 */
export async function run(ctx, major) {
  const { options } = ctx;
  const shards = options.stallShards;
  const database = `bench_stall_${shards}`;
  const fleet = await ctx.fleet('stall', major, { database, hostCount: 1, shards });
  const host = itemAt(fleet.hosts, 0);
  const serverVersion = await host.serverVersion();
  log(`router-stall on PostgreSQL ${serverVersion}: init of ${shards} shards on one host (untimed)`);
  await initFleet(fleet);
  const config = await loadConfig(fleet.configFile);
  const url = host.url(database);

  const router = await ShardRouter.open(fleet.configFile, { poolSize: CALLERS, idleTimeoutMs: 0 });
  const plain = new pg.Pool({ connectionString: url, max: CALLERS, idleTimeoutMillis: 0 });
  plain.on('error', () => undefined);
  /** @type {Record<Side, (key: bigint) => Promise<unknown>>} */
  const sides = {
    router: (key) =>
      router.withKey(key, (client) =>
        client.query('INSERT INTO photos (user_id, image_url) VALUES ($1, $2)', [key.toString(), 'x']),
      ),
    plain: (key) => {
      const schema = shardSchemaName(config, shardForKey(key, config.shards));
      return plain.query(`INSERT INTO "${schema}".photos (user_id, image_url) VALUES ($1, $2)`, [key.toString(), 'x']);
    },
  };
  /** @type {Record<Mode, Record<Side, Driven>[]>} */
  const rounds = { quiet: [], loaded: [] };
  try {
    // Warm-up, untimed: every connection of both sides through every shard (the state of a
    // long-running application).
    log(`  warming ${CALLERS} connections of each side over ${shards} shards`);
    await Promise.all(
      Array.from({ length: CALLERS }, async (_, caller) => {
        for (let shard = 0; shard < shards; shard++) {
          const key = BigInt(shard + caller * shards);
          await sides.router(key);
          await sides.plain(key);
        }
      }),
    );
    for (const mode of MODES) {
      const loops = mode === 'loaded' ? startBusyLoops() : [];
      const stopInvalidations = mode === 'loaded' ? startInvalidations(url, config) : null;
      try {
        for (let i = 0; i < options.stallRounds; i++) {
          /** @type {Side[]} */
          const order = i % 2 === 0 ? ['router', 'plain'] : ['plain', 'router'];
          /** @type {Partial<Record<Side, Driven>>} */
          const measured = {};
          for (const side of order) measured[side] = await drive(sides[side], options.stallSeconds);
          const round_ = {
            router: required(measured.router, 'router side of the round'),
            plain: required(measured.plain, 'plain side of the round'),
          };
          rounds[mode].push(round_);
          log(
            `  ${mode} round ${i + 1}/${options.stallRounds}: router ${Math.round(round_.router.perSecond)}/s (longest ${formatMs(round_.router.longestMs)}), plain ${Math.round(round_.plain.perSecond)}/s (longest ${formatMs(round_.plain.longestMs)})`,
          );
        }
      } finally {
        for (const loop of loops) loop.kill('SIGKILL');
        if (stopInvalidations) log(`  ${await stopInvalidations()} ANALYZE statements during the loaded rounds`);
      }
    }
  } finally {
    await router.close();
    await plain.end();
  }

  /** @param {Mode} mode */
  const summarizeMode = (mode) => {
    /**
     * @param {Side} side
     * @param {'perSecond' | 'longestMs' | 'p99Ms' | 'p50Ms'} field
     */
    const of = (side, field) => rounds[mode].map((r) => r[side][field]);
    const measured = {
      router: {
        perSecond: summarize(of('router', 'perSecond')),
        longestMs: Math.max(...of('router', 'longestMs')),
        p99Ms: summarize(of('router', 'p99Ms')),
        p50Ms: summarize(of('router', 'p50Ms')),
      },
      plain: {
        perSecond: summarize(of('plain', 'perSecond')),
        longestMs: Math.max(...of('plain', 'longestMs')),
        p99Ms: summarize(of('plain', 'p99Ms')),
        p50Ms: summarize(of('plain', 'p50Ms')),
      },
    };
    return { ...measured, ratio: ratio(measured.router.perSecond.median, measured.plain.perSecond.median) };
  };
  const summary = { quiet: summarizeMode('quiet'), loaded: summarizeMode('loaded') };
  const pass = MODES.every(
    (mode) =>
      summary[mode].router.longestMs <= LONGEST_TARGET_MS &&
      summary[mode].plain.longestMs <= LONGEST_TARGET_MS &&
      summary[mode].ratio >= THROUGHPUT_TARGET,
  );
  return { benchmark: 'router-stall', major, serverVersion, shards, rounds, summary, pass };
}

const HEADERS = ['', 'side', 'inserts/s (median)', 'p50', 'p99 (median)', 'longest call', 'routed/plain'];

/** @param {Result} result */
function rows(result) {
  return MODES.flatMap((mode) =>
    /** @type {Side[]} */ (['router', 'plain']).map((side) => {
      const s = result.summary[mode][side];
      return [
        side === 'router' ? mode : '',
        side === 'router' ? 'router.withKey' : 'plain pg.Pool',
        String(Math.round(s.perSecond.median)),
        `${s.p50Ms.median} ms`,
        `${s.p99Ms.median} ms`,
        formatMs(s.longestMs),
        side === 'router' ? `${result.summary[mode].ratio}x` : '',
      ];
    }),
  );
}

/** @param {Result} result */
export function table(result) {
  return `router-stall, PostgreSQL ${result.serverVersion}, ${result.shards} shards on one host, ${CALLERS} callers\n${textTable(HEADERS, rows(result))}\ntargets (no call > 1 s, routed ≥ 0.9x plain): ${verdict(result.pass)}`;
}

/** @param {Result[]} results */
export function markdown(results) {
  return results
    .map(
      (result) =>
        `PostgreSQL ${result.serverVersion}, ${result.shards} shards on one host, ${CALLERS} callers:\n\n${markdownTable(HEADERS, rows(result))}\n\nTargets (no call > 1 s, routed ≥ 0.9x plain): ${verdict(result.pass)}`,
    )
    .join('\n\n');
}
