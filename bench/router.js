/**
 * router: what the application side costs (issue 8), on its own fleet of 2048 shards over 2 hosts
 * (init once, untimed), in interleaved rounds (the order of the two sides alternates each round).
 *
 * 1. Routed single-row inserts: `router.withKey(userId, insert)` — a transaction on the shard's
 *    host with `SET LOCAL search_path` — against the same inserts sent by hand through a plain
 *    pg.Pool of the same size per host: the shard and host computed with shardForKey/hostForShard,
 *    the table schema-qualified, one autocommit statement. Same user ids, same number of callers
 *    (the pools' total size), same rows. Throughput in inserts per second; target ≥ 0.9x.
 * 2. `shardctl exec "select count(*) from photos"` over all 2048 shards (the CLI as a child
 *    process, start-up included, --json to a pipe) against one psql script per host, one
 *    `SELECT … UNION ALL …` over that host's shards, both hosts in parallel. Target ≤ 1.5x.
 *    Both must report the same total.
 */
import { writeFile } from 'node:fs/promises';
import path from 'node:path';
import pg from 'pg';
import { hostForShard, init, loadConfig, shardForKey, ShardRouter, shardSchemaName } from '../dist/index.js';
import {
  formatCount,
  formatMs,
  formatSample,
  log,
  markdownTable,
  ratio,
  round,
  summarize,
  textTable,
  timeCli,
  timePsqlScripts,
  verdict,
} from './lib.js';

export const description = 'withKey inserts vs a plain pg.Pool; exec count(*) over 2048 shards vs psql UNION ALL per host';

const DATABASE = 'bench_router';
const SHARDS = 2048;
const HOSTS = 2;
const POOL_SIZE = 10;
const INSERT_TARGET = 0.9;
const EXEC_TARGET = 1.5;

export async function run(ctx, major) {
  const { options } = ctx;
  const fleet = await ctx.fleet('router', major, { database: DATABASE, hostCount: HOSTS, shards: SHARDS });
  const config = await loadConfig(fleet.configFile);
  const serverVersion = await fleet.hosts[0].serverVersion();
  log(`router on PostgreSQL ${serverVersion}: init of ${SHARDS} shards over ${HOSTS} hosts (untimed)`);
  await Promise.all(fleet.hosts.map((host) => host.resetDatabase(DATABASE)));
  const built = await init(config);
  if (!built.ok) throw new Error('init of the router fleet failed');

  // --- 1. inserts ----------------------------------------------------------------------------
  const callers = POOL_SIZE * HOSTS;
  const userIds = Array.from({ length: options.inserts }, (_, i) => BigInt((i * 2654435761) % 1_000_000_007));
  const router = await ShardRouter.open(fleet.configFile, { poolSize: POOL_SIZE });
  const pools = new Map(config.hosts.map((h) => [h.name, new pg.Pool({ connectionString: h.url, max: POOL_SIZE })]));
  const routed = [];
  const plain = [];
  try {
    // Warm-up, untimed: both sides open their connections and the plans are cached.
    await insertRouted(router, userIds.slice(0, 2000), callers);
    await insertPlain(config, pools, userIds.slice(0, 2000), callers);
    for (let i = 0; i < options.routerRounds; i++) {
      const sides = [
        ['routed', () => insertRouted(router, userIds, callers), routed],
        ['plain', () => insertPlain(config, pools, userIds, callers), plain],
      ];
      if (i % 2 === 1) sides.reverse();
      for (const [name, fn, sink] of sides) {
        const started = performance.now();
        await fn();
        const ms = performance.now() - started;
        sink.push((options.inserts / ms) * 1000);
        log(`  inserts round ${i + 1}/${options.routerRounds} ${name}: ${formatCount(Math.round(sink.at(-1)))}/s`);
      }
    }
  } finally {
    await router.close();
    await Promise.all([...pools.values()].map((p) => p.end()));
  }
  // The warm-ups inserted 2000 rows on each side; every round `inserts` on each side.
  const expectedRows = 2 * 2000 + 2 * options.inserts * options.routerRounds;

  // --- 2. exec count(*) -----------------------------------------------------------------------
  const scripts = [];
  for (const host of fleet.hosts) {
    const shards = config.hosts.find((h) => h.name === host.name).shards;
    const sql = `${shards.map((s) => `select ${s} as shard, count(*) from "${shardSchemaName(config, s)}".photos`).join('\nunion all ')};\n`;
    const file = path.join(fleet.dir, `count-${host.name}.sql`);
    await writeFile(file, sql);
    scripts.push(file);
  }
  const exec = [];
  const floor = [];
  // The fixed part of exec's time: start-up, config, connecting, one shard.
  const oneShard = [];
  const execArgs = ['exec', '-c', fleet.configFile, '--json', 'select count(*) from photos'];
  // Warm-up, untimed, and the check: every shard answers and the counts add up to what was inserted.
  const check = await timeCli(execArgs, { cwd: fleet.dir });
  const counted = JSON.parse(check.stdout);
  const total = counted.reduce((sum, row) => sum + Number(row.count), 0);
  if (counted.length !== SHARDS || total !== expectedRows) {
    throw new Error(`exec returned ${counted.length} shards and ${total} rows; expected ${SHARDS} and ${expectedRows}`);
  }
  await timePsqlScripts(fleet.hosts, scripts, DATABASE, options.psql);
  for (let i = 0; i < options.routerRounds; i++) {
    const sides = [
      ['exec', async () => (await timeCli(execArgs, { cwd: fleet.dir })).ms, exec],
      ['psql', async () => (await timePsqlScripts(fleet.hosts, scripts, DATABASE, options.psql)).ms, floor],
      ['exec --shards 0', async () => (await timeCli(['exec', '-c', fleet.configFile, '--shards', '0', '--json', 'select count(*) from photos'], { cwd: fleet.dir })).ms, oneShard],
    ];
    if (i % 2 === 1) sides.reverse();
    for (const [name, fn, sink] of sides) {
      sink.push(await fn());
      log(`  exec round ${i + 1}/${options.routerRounds} ${name}: ${formatMs(sink.at(-1))}`);
    }
  }

  const routedSample = summarize(routed);
  const plainSample = summarize(plain);
  const execSample = summarize(exec);
  const floorSample = summarize(floor);
  const insertRatio = ratio(routedSample.median, plainSample.median);
  const execRatio = ratio(execSample.median, floorSample.median);
  return {
    benchmark: 'router',
    postgres: serverVersion,
    shards: SHARDS,
    hosts: HOSTS,
    poolSize: POOL_SIZE,
    callers,
    inserts: options.inserts,
    rounds: options.routerRounds,
    routedPerSecond: routedSample,
    plainPerSecond: plainSample,
    insertRatio,
    execMs: execSample,
    psqlMs: floorSample,
    execRatio,
    execOneShardMs: summarize(oneShard),
    totalRows: total,
    targets: {
      inserts: { wanted: `≥ ${INSERT_TARGET}x`, got: insertRatio, met: insertRatio >= INSERT_TARGET },
      exec: { wanted: `≤ ${EXEC_TARGET}x`, got: execRatio, met: execRatio <= EXEC_TARGET },
    },
  };
}

/** `callers` concurrent loops taking the next user id until none is left. */
async function drain(userIds, callers, insert) {
  let next = 0;
  await Promise.all(
    Array.from({ length: callers }, async () => {
      while (next < userIds.length) {
        const userId = userIds[next++];
        await insert(userId);
      }
    }),
  );
}

function insertRouted(router, userIds, callers) {
  return drain(userIds, callers, (userId) =>
    router.withKey(userId, (client) =>
      client.query('insert into photos (user_id, image_url) values ($1, $2)', [userId.toString(), 'https://cdn.example.com/p.jpg']),
    ),
  );
}

function insertPlain(config, pools, userIds, callers) {
  return drain(userIds, callers, (userId) => {
    const shard = shardForKey(userId, config.shards);
    const host = hostForShard(config, shard);
    return pools
      .get(host.name)
      .query(`insert into "${shardSchemaName(config, shard)}".photos (user_id, image_url) values ($1, $2)`, [
        userId.toString(),
        'https://cdn.example.com/p.jpg',
      ]);
  });
}

const HEADERS = ['PostgreSQL', 'what', 'shardctl', 'floor', 'ratio', 'target'];

function rows(results) {
  return results.flatMap((r) => [
    [
      r.postgres,
      `${formatCount(r.inserts)} single-row inserts, ${r.callers} callers, pool ${r.poolSize}/host`,
      `withKey: ${formatCount(Math.round(r.routedPerSecond.median))}/s (${formatCount(Math.round(r.routedPerSecond.min))}–${formatCount(Math.round(r.routedPerSecond.max))})`,
      `pg.Pool: ${formatCount(Math.round(r.plainPerSecond.median))}/s (${formatCount(Math.round(r.plainPerSecond.min))}–${formatCount(Math.round(r.plainPerSecond.max))})`,
      `${round(r.insertRatio, 2)}x`,
      `${r.targets.inserts.wanted}: ${verdict(r.targets.inserts.met)}`,
    ],
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

export function table(result) {
  return [`router: median (range) of ${result.rounds} interleaved rounds each`, textTable(HEADERS, rows([result]))].join('\n');
}

export function markdown(results) {
  return [`Median (range) of ${results[0].rounds} interleaved rounds each.`, '', markdownTable(HEADERS, rows(results))].join('\n');
}
