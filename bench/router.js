/**
 * router: what the application side costs (issue 8), on its own fleet of 2048 shards over 2 hosts
 * (init once, untimed), in interleaved rounds (the order of the two sides alternates each round).
 *
 * 1. Routed single-row inserts: `router.withKey(userId, (client) => client.query(insert))` — a
 *    transaction on the shard's host with `SET LOCAL search_path`, in one round trip because fn
 *    returns the insert's promise — against the same inserts sent by hand through a plain pg.Pool
 *    of the same size per host: the shard and host computed with shardForKey/hostForShard, the
 *    table schema-qualified, one autocommit statement. Same user ids, same number of callers (the
 *    pools' total size), same rows. Throughput in inserts per second; target ≥ 0.9x. Twice: with
 *    durable commits, then with synchronous_commit = off for the database (commits that do not
 *    wait for the disk: what is left is each side's own cost). Both sides' connections are warmed
 *    on every shard first, and their CPU per insert (server processes, Node) is recorded.
 * 2. `shardctl exec "select count(*) from photos"` over all 2048 shards (the CLI as a child
 *    process, start-up included, --json to a pipe) against one psql script per host, one
 *    `SELECT … UNION ALL …` over that host's shards, both hosts in parallel. Target ≤ 1.5x.
 *    Both must report the same total.
 */
import { writeFile } from 'node:fs/promises';
import path from 'node:path';
import pg from 'pg';
import { hostForShard, loadConfig, shardForKey, ShardRouter, shardSchemaName } from '../dist/index.js';
import {
  backendsCpuMs,
  backendsCpuSince,
  formatCount,
  formatMs,
  formatSample,
  initFleet,
  log,
  markdownTable,
  itemAt,
  ratio,
  required,
  round,
  summarize,
  textTable,
  timeCli,
  timePsqlScripts,
  verdict,
} from './lib.js';

export const description =
  'withKey inserts vs a plain pg.Pool; exec count(*) over 2048 shards vs psql UNION ALL per host';

const DATABASE = 'bench_router';
const SHARDS = 2048;
const HOSTS = 2;
export const POOL_SIZE = 10;
const INSERT_TARGET = 0.9;
const EXEC_TARGET = 1.5;
/** synchronous_commit for the insert comparison: durable first, then without the flush wait. */
const COMMIT_MODES = ['on', 'off'];
const ROUTER_APP = 'bench-router-withkey';
const PLAIN_APP = 'bench-router-plain';

/** @typedef {import('../dist/index.js').ShardctlConfig} ShardctlConfig */
/** @typedef {import('../dist/index.js').ShardRouter} ShardRouterType */
/** @typedef {import('./lib.js').Host} Host */
/** @typedef {import('./lib.js').Sample} Sample */
/** @typedef {Awaited<ReturnType<typeof run>>} RouterResult */
/** A plain pg.Pool per host name. @typedef {Map<string, pg.Pool>} Pools */

/**
 * @param {import('./run.js').BenchContext} ctx
 * @param {string} major
 */
export async function run(ctx, major) {
  const { options } = ctx;
  const fleet = await ctx.fleet('router', major, { database: DATABASE, hostCount: HOSTS, shards: SHARDS });
  const config = await loadConfig(fleet.configFile);
  const serverVersion = await itemAt(fleet.hosts, 0).serverVersion();
  log(`router on PostgreSQL ${serverVersion}: init of ${SHARDS} shards over ${HOSTS} hosts (untimed)`);
  await initFleet(fleet);

  // --- 1. inserts ----------------------------------------------------------------------------
  // Twice: with durable commits (the server's default: every commit waits for its WAL flush, which
  // on this machine's disk dominates and varies), then with synchronous_commit = off for the
  // database (set before the pools connect), where what is left is what each side itself costs:
  // round trips, statements, Node.
  const callers = POOL_SIZE * HOSTS;
  const userIds = Array.from({ length: options.inserts }, (_, i) => BigInt((i * 2654435761) % 1_000_000_007));
  const inserts = [];
  for (const commit of COMMIT_MODES) {
    await Promise.all(
      fleet.hosts.map((host) => host.query(DATABASE, `alter database ${DATABASE} set synchronous_commit = ${commit}`)),
    );
    log(`  inserts with synchronous_commit = ${commit}`);
    inserts.push({
      commit,
      ...(await compareInserts(config, fleet.hosts, fleet.configFile, userIds, callers, options.routerRounds)),
    });
  }
  await Promise.all(
    fleet.hosts.map((host) => host.query(DATABASE, `alter database ${DATABASE} reset synchronous_commit`)),
  );
  const expectedRows = inserts.reduce((sum, measured) => sum + measured.rows, 0);

  // --- 2. exec count(*) -----------------------------------------------------------------------
  /** @type {string[]} */
  const scripts = [];
  for (const host of fleet.hosts) {
    const shards = required(
      config.hosts.find((h) => h.name === host.name),
      `host ${host.name} in ${fleet.configFile}`,
    ).shards;
    const sql = `${shards.map((s) => `select ${s} as shard, count(*) from "${shardSchemaName(config, s)}".photos`).join('\nunion all ')};\n`;
    const file = path.join(fleet.dir, `count-${host.name}.sql`);
    await writeFile(file, sql);
    scripts.push(file);
  }
  /** @type {number[]} */
  const exec = [];
  /** @type {number[]} */
  const floor = [];
  // The fixed part of exec's time: start-up, config, connecting, one shard.
  /** @type {number[]} */
  const oneShard = [];
  const execArgs = ['exec', '-c', fleet.configFile, '--json', 'select count(*) from photos'];
  // Warm-up, untimed, and the check: every shard answers and the counts add up to what was inserted.
  const check = await timeCli(execArgs, { cwd: fleet.dir });
  /** @type {{ count: string | number }[]} */
  const counted = JSON.parse(check.stdout);
  const total = counted.reduce((sum, row) => sum + Number(row.count), 0);
  if (counted.length !== SHARDS || total !== expectedRows) {
    throw new Error(`exec returned ${counted.length} shards and ${total} rows; expected ${SHARDS} and ${expectedRows}`);
  }
  await timePsqlScripts(fleet.hosts, scripts, DATABASE, options.psql);
  for (let i = 0; i < options.routerRounds; i++) {
    /** @type {[string, () => Promise<number>, number[]][]} */
    const sides = [
      ['exec', async () => (await timeCli(execArgs, { cwd: fleet.dir })).ms, exec],
      ['psql', async () => (await timePsqlScripts(fleet.hosts, scripts, DATABASE, options.psql)).ms, floor],
      [
        'exec --shards 0',
        async () =>
          (
            await timeCli(['exec', '-c', fleet.configFile, '--shards', '0', '--json', 'select count(*) from photos'], {
              cwd: fleet.dir,
            })
          ).ms,
        oneShard,
      ],
    ];
    if (i % 2 === 1) sides.reverse();
    for (const [name, fn, sink] of sides) {
      sink.push(await fn());
      log(`  exec round ${i + 1}/${options.routerRounds} ${name}: ${formatMs(sink.at(-1))}`);
    }
  }

  const execSample = summarize(exec);
  const floorSample = summarize(floor);
  const insertRuns = Object.fromEntries(
    inserts.map(({ commit, ...measured }) => {
      const routed = summarize(measured.routed);
      const plain = summarize(measured.plain);
      const r = ratio(routed.median, plain.median);
      /** @param {'routed' | 'plain'} side */
      const perInsert = (side) => ({
        serverCpuUs: summarize(measured.cpu[side].server),
        nodeCpuUs: summarize(measured.cpu[side].node),
      });
      return [
        commit,
        {
          routedPerSecond: routed,
          plainPerSecond: plain,
          routedCpu: perInsert('routed'),
          plainCpu: perInsert('plain'),
          // The router's own Node CPU against the plain pool's, round by round (the pair shares the
          // round's conditions: the server's speed changes how many answers one read brings).
          nodeCpuRatio: summarize(
            measured.cpu.routed.node.map((us, i) => us / (measured.cpu.plain.node[i] ?? Number.NaN)),
          ),
          ratio: r,
          target: { wanted: `≥ ${INSERT_TARGET}x`, got: r, met: r >= INSERT_TARGET },
        },
      ];
    }),
  );
  const execRatio = ratio(execSample.median, floorSample.median);
  return {
    benchmark: 'router',
    postgres: serverVersion,
    shards: SHARDS,
    hosts: HOSTS,
    poolSize: POOL_SIZE,
    callers,
    insertsPerRound: options.inserts,
    rounds: options.routerRounds,
    inserts: insertRuns,
    execMs: execSample,
    psqlMs: floorSample,
    execRatio,
    execOneShardMs: summarize(oneShard),
    totalRows: total,
    targets: {
      exec: { wanted: `≤ ${EXEC_TARGET}x`, got: execRatio, met: execRatio <= EXEC_TARGET },
    },
  };
}

/**
 * withKey against the plain pools, interleaved rounds, on fresh pools (so they see the database's settings).
 * @param {ShardctlConfig} config
 * @param {Host[]} hosts
 * @param {string} configFile
 * @param {bigint[]} userIds
 * @param {number} callers
 * @param {number} rounds
 */
async function compareInserts(config, hosts, configFile, userIds, callers, rounds) {
  // No idle timeout on either side: a pool left idle while the other side runs (or warms up) must
  // not close its warmed connections (pg.Pool's default closes them after 10 s, the router's 30 s).
  const router = await ShardRouter.open(configFile, {
    poolSize: POOL_SIZE,
    applicationName: ROUTER_APP,
    idleTimeoutMs: 0,
  });
  const pools = new Map(
    config.hosts.map((h) => [
      h.name,
      // An idle connection's error (the hosts stopped after a failure) would end the process before
      // the benchmark's own error is reported.
      new pg.Pool({ connectionString: h.url, max: POOL_SIZE, application_name: PLAIN_APP, idleTimeoutMillis: 0 }).on(
        'error',
        () => undefined,
      ),
    ]),
  );
  /** @type {number[]} */
  const routed = [];
  /** @type {number[]} */
  const plain = [];
  // CPU per insert (µs): the side's server processes (from /proc), and this Node process.
  /** @typedef {{ server: number[], node: number[] }} CpuRuns */
  /** @type {{ routed: CpuRuns, plain: CpuRuns }} */
  const cpu = { routed: { server: [], node: [] }, plain: { server: [], node: [] } };
  let rows = 0;
  try {
    // Warm-up, untimed: every connection of both sides inserts one row into every shard of its
    // host, so each server process has built its caches for every shard's table and compiled every
    // shard's next_id() (otherwise the first rounds measure that, a cost both sides share, and the
    // rounds get faster one after the other), as in an application that has been running a while.
    await warmUp(config, router, pools);
    // And the code paths of both sides in Node (the JIT), as in the rounds.
    const jitWarmUp = userIds.slice(0, 2000);
    await insertRouted(router, jitWarmUp, callers);
    await insertPlain(config, pools, jitWarmUp, callers);
    // Rows inserted, for the check after exec: a row per shard for each connection of either side,
    // the JIT warm-up on each side, then every round's on each side.
    rows = 2 * POOL_SIZE * config.shards + 2 * jitWarmUp.length + 2 * userIds.length * rounds;
    for (let i = 0; i < rounds; i++) {
      /** @type {['routed' | 'plain', () => Promise<void>, number[]][]} */
      const sides = [
        ['routed', () => insertRouted(router, userIds, callers), routed],
        ['plain', () => insertPlain(config, pools, userIds, callers), plain],
      ];
      if (i % 2 === 1) sides.reverse();
      for (const [name, fn, sink] of sides) {
        const app = name === 'routed' ? ROUTER_APP : PLAIN_APP;
        const serverBefore = await backendsCpuMs(hosts, DATABASE, app);
        const nodeBefore = process.cpuUsage();
        const started = performance.now();
        await fn();
        const ms = performance.now() - started;
        const node = process.cpuUsage(nodeBefore);
        const server = backendsCpuSince(serverBefore, await backendsCpuMs(hosts, DATABASE, app));
        const perSecond = (userIds.length / ms) * 1000;
        const serverUs = (server * 1000) / userIds.length;
        const nodeUs = (node.user + node.system) / userIds.length;
        sink.push(perSecond);
        cpu[name].server.push(serverUs);
        cpu[name].node.push(nodeUs);
        log(
          `  inserts round ${i + 1}/${rounds} ${name}: ${formatCount(Math.round(perSecond))}/s, ` +
            `server CPU ${Math.round(serverUs)} µs and Node CPU ${Math.round(nodeUs)} µs per insert`,
        );
      }
    }
  } finally {
    await router.close();
    await Promise.all([...pools.values()].map((p) => p.end()));
  }
  return { routed, plain, cpu, rows };
}

/**
 * Each of a host's POOL_SIZE connections, on both sides, inserts a row into each of the host's
 * shards (the plain pool's in one multi-statement round trip, the router's in one call per shard).
 * All connections of a pool are held at once, so each is a different one.
 * @param {ShardctlConfig} config
 * @param {ShardRouterType} router
 * @param {Pools} pools
 */
export async function warmUp(config, router, pools) {
  await Promise.all(
    config.hosts.map(async (host) => {
      const text = host.shards
        .map((s) => `insert into "${shardSchemaName(config, s)}".photos (user_id, image_url) values (${s}, 'warm-up')`)
        .join(';\n');
      // Plain pool: check out every connection, then run the script on each.
      const pool = poolOf(pools, host.name);
      const clients = await Promise.all(Array.from({ length: POOL_SIZE }, () => pool.connect()));
      try {
        await Promise.all(clients.map((c) => c.query(text)));
      } finally {
        clients.forEach((c) => c.release());
      }
      // Router: for each shard, POOL_SIZE calls at once, each holding its connection until all have
      // one, so each of the host's connections inserts into each shard under its search_path (as the
      // rounds will; fn itself may not change the search_path).
      for (const shard of host.shards) {
        let arrived = 0;
        /** @type {() => void} */
        let allIn = () => undefined;
        /** @type {Promise<void>} */
        const barrier = new Promise((resolve) => (allIn = resolve));
        await Promise.all(
          Array.from({ length: POOL_SIZE }, () =>
            router.withShard(shard, async (client) => {
              if (++arrived === POOL_SIZE) allIn();
              await barrier;
              await client.query(`insert into photos (user_id, image_url) values (${shard}, 'warm-up')`);
            }),
          ),
        );
      }
    }),
  );
}

/**
 * The plain pool of a host; every host of the config has one.
 * @param {Pools} pools
 * @param {string} name
 */
function poolOf(pools, name) {
  return required(pools.get(name), `pool of host ${name}`);
}

/**
 * `callers` concurrent loops taking the next user id until none is left.
 * @param {bigint[]} userIds
 * @param {number} callers
 * @param {(userId: bigint) => Promise<unknown>} insert
 */
async function drain(userIds, callers, insert) {
  let next = 0;
  await Promise.all(
    Array.from({ length: callers }, async () => {
      while (next < userIds.length) {
        // next < length: the id is there.
        const userId = /** @type {bigint} */ (userIds[next++]);
        await insert(userId);
      }
    }),
  );
}

/**
 * @param {ShardRouterType} router
 * @param {bigint[]} userIds
 * @param {number} callers
 */
export function insertRouted(router, userIds, callers) {
  return drain(userIds, callers, (userId) =>
    router.withKey(userId, (client) =>
      client.query('insert into photos (user_id, image_url) values ($1, $2)', [
        userId.toString(),
        'https://cdn.example.com/p.jpg',
      ]),
    ),
  );
}

/**
 * @param {ShardctlConfig} config
 * @param {Pools} pools
 * @param {bigint[]} userIds
 * @param {number} callers
 */
export function insertPlain(config, pools, userIds, callers) {
  return drain(userIds, callers, (userId) => {
    const shard = shardForKey(userId, config.shards);
    const host = hostForShard(config, shard);
    if (!host) throw new Error(`no host in the config holds shard ${shard}`);
    return poolOf(pools, host.name).query(
      `insert into "${shardSchemaName(config, shard)}".photos (user_id, image_url) values ($1, $2)`,
      [userId.toString(), 'https://cdn.example.com/p.jpg'],
    );
  });
}

const HEADERS = ['PostgreSQL', 'what', 'shardctl', 'floor', 'ratio', 'target'];

/** @param {RouterResult[]} results */
function rows(results) {
  return results.flatMap((r) => [
    ...Object.entries(r.inserts).map(([commit, m]) => [
      r.postgres,
      `${formatCount(r.insertsPerRound)} single-row inserts, ${r.callers} callers, pool ${r.poolSize}/host, synchronous_commit = ${commit}`,
      `withKey: ${formatCount(Math.round(m.routedPerSecond.median))}/s (${formatCount(Math.round(m.routedPerSecond.min))}–${formatCount(Math.round(m.routedPerSecond.max))}); CPU per insert: server ${Math.round(m.routedCpu.serverCpuUs.median)} µs, Node ${Math.round(m.routedCpu.nodeCpuUs.median)} µs (${round(m.nodeCpuRatio.median, 2)}x the plain pool's, median of the rounds' ratios)`,
      `pg.Pool: ${formatCount(Math.round(m.plainPerSecond.median))}/s (${formatCount(Math.round(m.plainPerSecond.min))}–${formatCount(Math.round(m.plainPerSecond.max))}); CPU per insert: server ${Math.round(m.plainCpu.serverCpuUs.median)} µs, Node ${Math.round(m.plainCpu.nodeCpuUs.median)} µs`,
      `${round(m.ratio, 2)}x`,
      `${m.target.wanted}: ${verdict(m.target.met)}`,
    ]),
    [
      r.postgres,
      `count(*) over ${r.shards} shards, ${r.hosts} hosts`,
      `exec: ${formatSample(r.execMs)}; of which start-up, config, connect and 1 shard (exec --shards 0): ${formatSample(r.execOneShardMs)}`,
      `psql UNION ALL/host: ${formatSample(r.psqlMs)}`,
      `${round(r.execRatio, 2)}x`,
      `${r.targets.exec.wanted}: ${verdict(r.targets.exec.met)}`,
    ],
  ]);
}

/** @param {RouterResult} result */
export function table(result) {
  return [
    `router: median (range) of ${result.rounds} interleaved rounds each`,
    textTable(HEADERS, rows([result])),
  ].join('\n');
}

/** @param {RouterResult[]} results */
export function markdown(results) {
  return [
    `Median (range) of ${itemAt(results, 0).rounds} interleaved rounds each.`,
    '',
    markdownTable(HEADERS, rows(results)),
  ].join('\n');
}
