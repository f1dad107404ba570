/**
 * pooled-inserts: routed single-row inserts through PgBouncer (transaction mode, the pooler production
 * fleets put in front of their hosts) and directly, each against a plain pg.Pool on the same path,
 * with the router's timeouts set (statementTimeoutMs, idleInTransactionTimeoutMs: SET LOCAL in the
 * write that carries BEGIN, so they hold through the pooler). Issue 40's targets: routed ≥ 0.9x
 * plain through PgBouncer, ≥ 0.95x directly. Durable commits (the server's default).
 *
 * One fleet of 512 shards over 2 hosts (init once, untimed), a PgBouncer per host (Debian's package,
 * pool of 10 server connections, test/helpers/pgbouncer.ts), 20 callers. The four sides run in
 * interleaved rounds (the order alternates each round); every pool is warmed on every shard first.
 */
import pg from 'pg';
import { tsImport } from 'tsx/esm/api';
import { loadConfig, ShardRouter } from '../dist/index.js';
import {
  formatCount,
  initFleet,
  itemAt,
  log,
  markdownTable,
  median,
  ratio,
  required,
  round,
  roundOrder,
  summarize,
  textTable,
  verdict,
} from './lib.js';
import { insertPlain, insertRouted, POOL_SIZE, warmUp } from './router.js';

/** @type {{ startPgBouncer: typeof import('../test/helpers/pgbouncer.ts').startPgBouncer }} */
const { startPgBouncer } = await tsImport('../test/helpers/pgbouncer.ts', import.meta.url);

export const description = 'withKey inserts vs a plain pg.Pool, through PgBouncer and directly, timeouts set';

const DATABASE = 'bench_pooled';
const SHARDS = 512;
const HOSTS = 2;
const TARGETS = { pgbouncer: 0.9, direct: 0.95 };
const ROUTER_OPTIONS = { statementTimeoutMs: 30_000, idleInTransactionTimeoutMs: 60_000 };

/** @typedef {Awaited<ReturnType<typeof run>>} Result */

/**
 * @param {import('./run.js').BenchContext} ctx
 * @param {string} major
 */
export async function run(ctx, major) {
  const { options } = ctx;
  const fleet = await ctx.fleet('pooled-inserts', major, { database: DATABASE, hostCount: HOSTS, shards: SHARDS });
  const serverVersion = await itemAt(fleet.hosts, 0).serverVersion();
  log(`pooled-inserts on PostgreSQL ${serverVersion}: init of ${SHARDS} shards over ${HOSTS} hosts (untimed)`);
  await initFleet(fleet);
  const direct = await loadConfig(fleet.configFile);
  const poolers = await Promise.all(
    fleet.hosts.map((host) => startPgBouncer(host.url(DATABASE), { poolSize: POOL_SIZE })),
  );
  try {
    const pooledConfig = {
      ...direct,
      hosts: direct.hosts.map((h, i) => ({ ...h, url: itemAt(poolers, i).url(h.url), directUrl: h.url })),
    };
    /** @type {['direct' | 'pgbouncer', import('../dist/index.js').ShardctlConfig][]} */
    const paths = [
      ['direct', direct],
      ['pgbouncer', pooledConfig],
    ];
    const callers = POOL_SIZE * HOSTS;
    const userIds = Array.from({ length: options.inserts }, (_, i) => BigInt((i * 2654435761) % 1_000_000_007));
    /** @type {Record<string, { run: () => Promise<unknown>, rates: number[], close: () => Promise<unknown> }>} */
    const sides = {};
    /** @param {string} name */
    const sideOf = (name) => required(sides[name], `side ${name}`);
    for (const [name, config] of paths) {
      const router = await ShardRouter.openConfig(config, {
        ...ROUTER_OPTIONS,
        poolSize: POOL_SIZE,
        idleTimeoutMs: 0,
        applicationName: `bench-pooled-${name}-router`,
      });
      const pools = new Map(
        config.hosts.map(
          (h) =>
            /** @type {[string, pg.Pool]} */ ([
              h.name,
              new pg.Pool({
                connectionString: h.url,
                max: POOL_SIZE,
                application_name: `bench-pooled-${name}-plain`,
                idleTimeoutMillis: 0,
                // An idle connection's error (the hosts stopped after a failure) would end the process
                // before the benchmark's own error is reported.
              }).on('error', () => undefined),
            ]),
        ),
      );
      await warmUp(config, router, pools);
      const jit = userIds.slice(0, 2000);
      await insertRouted(router, jit, callers);
      await insertPlain(config, pools, jit, callers);
      sides[`${name} routed`] = {
        run: () => insertRouted(router, userIds, callers),
        rates: [],
        close: () => router.close(),
      };
      sides[`${name} plain`] = {
        run: () => insertPlain(config, pools, userIds, callers),
        rates: [],
        close: () => Promise.all([...pools.values()].map((p) => p.end())),
      };
    }
    try {
      for (let i = 0; i < options.routerRounds; i++) {
        for (const name of roundOrder(Object.keys(sides), i)) {
          const side = sideOf(name);
          const started = performance.now();
          await side.run();
          const perSecond = (userIds.length / (performance.now() - started)) * 1000;
          side.rates.push(perSecond);
          log(`  round ${i + 1}/${options.routerRounds} ${name}: ${formatCount(Math.round(perSecond))}/s`);
        }
      }
    } finally {
      for (const side of Object.values(sides)) await side.close();
    }
    const paired = Object.fromEntries(
      paths.map(([name]) => {
        const [routedRates, plainRates] = [sideOf(`${name} routed`).rates, sideOf(`${name} plain`).rates];
        const routed = summarize(routedRates);
        const plain = summarize(plainRates);
        // Per round, routed over plain: the rounds' conditions drift (disk, other load), a pair shares them.
        const ratios = routedRates.map((r, i) => r / itemAt(plainRates, i));
        const perRound = {
          median: round(median(ratios), 3),
          min: round(Math.min(...ratios), 3),
          max: round(Math.max(...ratios), 3),
          runs: ratios.map((r) => round(r, 3)),
        };
        const r = round(perRound.median, 2);
        return [
          name,
          {
            routedPerSecond: routed,
            plainPerSecond: plain,
            ratioOfMedians: ratio(routed.median, plain.median),
            ratio: r,
            perRoundRatio: perRound,
            target: { wanted: `≥ ${TARGETS[name]}x`, got: r, met: r >= TARGETS[name] },
          },
        ];
      }),
    );
    return {
      benchmark: 'pooled-inserts',
      postgres: serverVersion,
      shards: SHARDS,
      hosts: HOSTS,
      poolSize: POOL_SIZE,
      callers,
      insertsPerRound: options.inserts,
      rounds: options.routerRounds,
      routerOptions: ROUTER_OPTIONS,
      paths: paired,
    };
  } finally {
    await Promise.all(poolers.map((p) => p.stop()));
  }
}

const HEADERS = ['PostgreSQL', 'path', 'withKey (timeouts set)', 'pg.Pool', 'ratio (median of rounds)', 'target'];

/** @param {Result[]} results */
function rows(results) {
  return results.flatMap((r) =>
    Object.entries(r.paths).map(([name, m]) => [
      r.postgres,
      name === 'pgbouncer' ? 'through PgBouncer 1.18 (transaction mode)' : 'directly',
      `${formatCount(Math.round(m.routedPerSecond.median))}/s (${formatCount(Math.round(m.routedPerSecond.min))}–${formatCount(Math.round(m.routedPerSecond.max))})`,
      `${formatCount(Math.round(m.plainPerSecond.median))}/s (${formatCount(Math.round(m.plainPerSecond.min))}–${formatCount(Math.round(m.plainPerSecond.max))})`,
      `${m.ratio}x (${round(m.perRoundRatio.min, 2)}–${round(m.perRoundRatio.max, 2)})`,
      `${m.target.wanted}: ${verdict(m.target.met)}`,
    ]),
  );
}

/** @param {Result} result */
export function table(result) {
  return [
    `pooled-inserts: ${formatCount(result.insertsPerRound)} single-row inserts per round and side, ${result.callers} callers, ${result.rounds} interleaved rounds`,
    textTable(HEADERS, rows([result])),
  ].join('\n');
}

/** @param {Result[]} results */
export function markdown(results) {
  const first = itemAt(results, 0);
  return [
    `${formatCount(first.insertsPerRound)} single-row inserts per round and side, ${first.callers} callers, pool ${first.poolSize}/host (PgBouncer's pool the same size), durable commits, ${first.rounds} interleaved rounds; median (range).`,
    '',
    markdownTable(HEADERS, rows(results)),
  ].join('\n');
}
