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
 *
 * Each round also records the CPU time per insert of each side: this Node process, the hosts'
 * server processes of the benchmark's database (only one side runs at a time) and the PgBouncers.
 * On a machine whose cores the client, the poolers and the servers share, a side's throughput is
 * bounded by the CPU an insert costs all of them, and that sum moves far less from round to round
 * than the throughput does: plain / routed CPU per insert is the ratio the rounds' noise hides.
 */
import { readFile, writeFile } from 'node:fs/promises';
import path from 'node:path';
import pg from 'pg';
import { tsImport } from 'tsx/esm/api';
import { loadConfig, ShardRouter } from '../dist/index.js';
import {
  backendsCpuMs,
  backendsCpuSince,
  formatCount,
  initFleet,
  itemAt,
  log,
  markdownTable,
  median,
  processCpuMs,
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
    // A config file of its own, as a fleet behind PgBouncer has (url the pooler, directUrl the
    // server). Before 2026-12-03 the router over a config changed in code re-read its file at the
    // map refresh (every 30 s) and went around the poolers from then on; the check below stays.
    const pooledFile = path.join(path.dirname(fleet.configFile), 'shardctl-pgbouncer.yaml');
    let pooledText = await readFile(fleet.configFile, 'utf8');
    for (const [i, h] of direct.hosts.entries()) {
      if (!pooledText.includes(`url: ${h.url}\n`)) throw new Error(`${fleet.configFile} has no url line for ${h.name}`);
      pooledText = pooledText.replace(
        `url: ${h.url}\n`,
        `url: ${itemAt(poolers, i).url(h.url)}\n    directUrl: ${h.url}\n`,
      );
    }
    await writeFile(pooledFile, pooledText, { mode: 0o600 });
    const pooledConfig = await loadConfig(pooledFile);
    /** @type {['direct' | 'pgbouncer', import('../dist/index.js').ShardctlConfig][]} */
    const paths = [
      ['direct', direct],
      ['pgbouncer', pooledConfig],
    ];
    const callers = POOL_SIZE * HOSTS;
    const userIds = Array.from({ length: options.inserts }, (_, i) => BigInt((i * 2654435761) % 1_000_000_007));
    /** @typedef {{ node: number, server: number, pooler: number }} Cpu CPU µs per insert */
    /** @type {Record<string, { run: () => Promise<unknown>, rates: number[], cpu: Cpu[], close: () => Promise<unknown> }>} */
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
        cpu: [],
        close: () => router.close(),
      };
      sides[`${name} plain`] = {
        run: () => insertPlain(config, pools, userIds, callers),
        rates: [],
        cpu: [],
        close: () => Promise.all([...pools.values()].map((p) => p.end())),
      };
    }
    try {
      for (let i = 0; i < options.routerRounds; i++) {
        for (const name of roundOrder(Object.keys(sides), i)) {
          const side = sideOf(name);
          const serverBefore = await backendsCpuMs(fleet.hosts, DATABASE);
          const poolerBefore = poolersCpuMs(poolers);
          const nodeBefore = process.cpuUsage();
          const started = performance.now();
          await side.run();
          const perSecond = (userIds.length / (performance.now() - started)) * 1000;
          const node = process.cpuUsage(nodeBefore);
          const perInsert = (/** @type {number} */ ms) => round((ms * 1000) / userIds.length, 1);
          const cpu = {
            node: perInsert((node.user + node.system) / 1000),
            server: perInsert(backendsCpuSince(serverBefore, await backendsCpuMs(fleet.hosts, DATABASE))),
            pooler: perInsert(poolersCpuMs(poolers) - poolerBefore),
          };
          // About 40 µs per insert when the calls go through the poolers; none means they went around.
          if (name.startsWith('pgbouncer') && cpu.pooler < 5)
            throw new Error(`${name}: PgBouncer used ${cpu.pooler} µs per insert; the calls did not go through it`);
          side.rates.push(perSecond);
          side.cpu.push(cpu);
          log(
            `  round ${i + 1}/${options.routerRounds} ${name}: ${formatCount(Math.round(perSecond))}/s; CPU per insert: ` +
              `Node ${cpu.node} µs, server ${cpu.server} µs, PgBouncer ${cpu.pooler} µs`,
          );
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
        // CPU per insert of all the processes a side uses, per round; plain / routed per round.
        const totals = (/** @type {string} */ side) =>
          sideOf(side).cpu.map((c) => c.node + c.server + (name === 'pgbouncer' ? c.pooler : 0));
        const [routedCpu, plainCpu] = [totals(`${name} routed`), totals(`${name} plain`)];
        const cpuRatios = routedCpu.map((c, i) => itemAt(plainCpu, i) / c);
        const cpuOf = (/** @type {string} */ side) => ({
          node: summarize(sideOf(side).cpu.map((c) => c.node)),
          server: summarize(sideOf(side).cpu.map((c) => c.server)),
          pooler: summarize(sideOf(side).cpu.map((c) => c.pooler)),
        });
        return [
          name,
          {
            routedPerSecond: routed,
            plainPerSecond: plain,
            ratioOfMedians: ratio(routed.median, plain.median),
            ratio: r,
            perRoundRatio: perRound,
            routedCpuUs: cpuOf(`${name} routed`),
            plainCpuUs: cpuOf(`${name} plain`),
            /** plain / routed CPU per insert (Node, servers and, through PgBouncer, the poolers), median of the rounds. */
            cpuRatio: {
              median: round(median(cpuRatios), 3),
              min: round(Math.min(...cpuRatios), 3),
              max: round(Math.max(...cpuRatios), 3),
            },
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

/** @param {{ pid: number | undefined }[]} poolers CPU time (ms) of the PgBouncer processes so far. */
function poolersCpuMs(poolers) {
  return poolers.reduce((sum, p) => sum + (p.pid === undefined ? 0 : processCpuMs(p.pid)), 0);
}

const HEADERS = [
  'PostgreSQL',
  'path',
  'withKey (timeouts set)',
  'pg.Pool',
  'ratio (median of rounds)',
  'target',
  'CPU per insert: Node + server (+ PgBouncer), routed / plain',
  'plain / routed CPU',
];

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
      `${cpuText(m.routedCpuUs, name)} / ${cpuText(m.plainCpuUs, name)}`,
      `${round(m.cpuRatio.median, 2)}x (${round(m.cpuRatio.min, 2)}–${round(m.cpuRatio.max, 2)})`,
    ]),
  );
}

/**
 * `62 + 240 + 44 µs`: medians of the rounds.
 * @param {{ node: { median: number }, server: { median: number }, pooler: { median: number } }} cpu
 * @param {string} path
 */
function cpuText(cpu, path) {
  const parts = [cpu.node.median, cpu.server.median, ...(path === 'pgbouncer' ? [cpu.pooler.median] : [])];
  return `${parts.map((p) => Math.round(p)).join(' + ')} µs`;
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
