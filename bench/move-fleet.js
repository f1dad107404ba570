/**
 * move-fleet: fleet scale (issue 7; issue 42 on PostgreSQL 15), on one PostgreSQL major.
 *
 * --fleet-shards empty shards over 4 hosts (pg1-pg4), moved onto 8: the upper half of each host's
 * shards to pg5-pg8, one `shardctl move-shard <shards> --to <host>` CLI per target, all four at
 * once (disjoint host pairs). Total wall time, the longest any shard refused writes
 * (writeBlockedMs from each CLI's --json), the CLIs' peak RSS (GNU time). One run.
 * BENCH_FLEET_LINES=<file> writes each CLI's stderr lines with their times, to see where a run's
 * time went.
 */
import { readFile, writeFile } from 'node:fs/promises';
import { formatShardList, ShardMap } from '../dist/index.js';
import {
  formatCount,
  formatMs,
  formatRss,
  initFleet,
  itemAt,
  log,
  markdownTable,
  median,
  resetDatabases,
  round,
  textTable,
  timeCli,
  verdict,
} from './lib.js';
import { fencedStepsByWave, FENCED_STEPS } from './moving.js';

export const description = 'fleet scale: 8192 empty shards moved from 4 hosts onto 8 by 4 CLIs at once';

const FLEET_BASE = 'bench_fleet_base';
const FLEET_DB = 'bench_fleet';

const TARGET_FLEET_RSS_MIB = 300;
/** Issue 21's raised target: the fleet's longest write block. */
const TARGET_FLEET_BLOCKED_MS = 250;

/** @typedef {Awaited<ReturnType<typeof run>>} Result */

/**
 * @param {import('./run.js').BenchContext} ctx
 * @param {string} major
 */
export async function run(ctx, major) {
  return { benchmark: 'move-fleet', ...(await runFleet(ctx, major)) };
}

// ---------------------------------------------------------------------------------------------
// (d) fleet scale

/**
 * @param {import('./run.js').BenchContext} ctx
 * @param {string} major
 */
async function runFleet(ctx, major) {
  const { options } = ctx;
  const shards = options.fleetShards;
  const per = shards / 4;
  if (!Number.isInteger(per / 2)) throw new Error(`--fleet-shards ${shards}: must be a multiple of 8`);
  const ranges = [0, 1, 2, 3].map((i) => `${i * per}-${(i + 1) * per - 1}`).concat(['', '', '', '']);
  const base = await ctx.fleet('move-fleet-base', major, { database: FLEET_BASE, hostCount: 8, shards, ranges });
  const fleet = await ctx.fleet('move-fleet', major, { database: FLEET_DB, hostCount: 8, shards, ranges });
  if (fleet.hosts.length < 8) throw new Error(`move-fleet needs 8 hosts; the fleet has ${fleet.hosts.length}`);
  const postgres = await itemAt(fleet.hosts, 0).serverVersion();
  log(`move-fleet on PostgreSQL ${postgres}: init of ${formatCount(shards)} empty shards over 4 of 8 hosts (untimed)`);
  await initFleet(base);
  await resetDatabases(fleet.hosts, FLEET_DB, { template: FLEET_BASE });
  const initialMap = await readFile(fleet.configFile, 'utf8');
  const pairs = [0, 1, 2, 3].map((i) => ({
    source: itemAt(fleet.hosts, i).name,
    target: itemAt(fleet.hosts, i + 4).name,
    shards: `${i * per + per / 2}-${(i + 1) * per - 1}`,
  }));
  log(`  moving ${pairs.map((p) => `${p.shards} ${p.source} → ${p.target}`).join(', ')}: 4 CLIs at once`);
  const started = performance.now();
  const runs = await Promise.all(
    pairs.map((p) =>
      timeCli(['move-shard', p.shards, '--to', p.target, '--yes', '--json', '--config', fleet.configFile], {
        cwd: fleet.dir,
        progress: true,
      }),
    ),
  );
  const totalMs = performance.now() - started;
  // BENCH_FLEET_LINES=<file>: each CLI's stderr lines with their times, to see where a run's time went.
  if (process.env.BENCH_FLEET_LINES)
    await writeFile(
      process.env.BENCH_FLEET_LINES,
      JSON.stringify(
        runs.map((r, i) => ({ ...pairs[i], lines: r.lines })),
        null,
        1,
      ),
    );
  const moves = runs.map((r, i) => {
    /** @type {import('./moving.js').CliMoveOutput} */
    const json = JSON.parse(r.stdout);
    const list = 'moves' in json ? json.moves : [json];
    // Where the longest write block went: the steps of each CLI's longest fenced wave, as its progress lines arrived.
    const waves = fencedStepsByWave(r.lines);
    const longest = waves.reduce(
      (a, b) => ((b.fencedMs ?? 0) > (a?.fencedMs ?? 0) ? b : a),
      /** @type {(typeof waves)[number] | null} */ (null),
    );
    return {
      ...itemAt(pairs, i),
      durationMs: Math.max(...list.map((m) => m.durationMs)),
      writeBlockedMs: Math.max(...list.map((m) => m.writeBlockedMs ?? 0)),
      waves: list.reduce((n, m) => n + m.waves.length, 0),
      outcome: list.map((m) => m.outcome).join(','),
      wallMs: round(r.ms, 0),
      peakRssKiB: r.peakRssKiB,
      longestWave: longest,
      stepMedians: Object.fromEntries(
        FENCED_STEPS.slice(1).map((step) => [
          step,
          round(median(waves.map((w) => w.steps[step]).filter((ms) => ms !== undefined)), 0),
        ]),
      ),
    };
  });
  // Checked: the map puts every moved shard on its target, and each target holds their schemas.
  const map = await ShardMap.load(fleet.configFile);
  const problems = [];
  for (const [i, p] of pairs.entries()) {
    const lo = i * per + per / 2;
    /** @type {number[]} */
    const wrong = [];
    for (let s = lo; s < (i + 1) * per; s++) if (map.hostForShard(s).name !== p.target) wrong.push(s);
    if (wrong.length) problems.push(`the map does not put ${formatShardList(wrong)} on ${p.target}`);
    const [row] = await itemAt(fleet.hosts, i + 4).query(
      FLEET_DB,
      `select count(*)::int as n from shardctl.shards where state = 'active'`,
    );
    if (row?.n !== per / 2) problems.push(`${p.target} holds ${row?.n} active shards, expected ${per / 2}`);
  }
  if (problems.length)
    throw new Error(`the fleet-scale moves did not leave what they should have:\n  - ${problems.join('\n  - ')}`);
  await writeFile(fleet.configFile, initialMap);
  const rss = Math.max(...moves.map((m) => m.peakRssKiB ?? 0)) || null;
  const blocked = Math.max(...moves.map((m) => m.writeBlockedMs));
  log(`  fleet: ${formatMs(totalMs)} total, writes blocked at most ${formatMs(blocked)}, peak RSS ${formatRss(rss)}`);
  for (const m of moves)
    log(`  ${m.source} → ${m.target}: writes blocked ${formatMs(m.writeBlockedMs)}, ${describeWave(m)}`);
  return {
    postgres,
    shards,
    movedShards: shards / 2,
    totalMs: round(totalMs, 0),
    writeBlockedMs: blocked,
    peakRssKiB: rss,
    moves,
    targets: {
      peakRss: {
        wanted: `< ${TARGET_FLEET_RSS_MIB} MiB`,
        got: rss,
        met: rss === null ? null : rss / 1024 < TARGET_FLEET_RSS_MIB,
      },
      writeBlocked: {
        wanted: `≤ ${TARGET_FLEET_BLOCKED_MS} ms`,
        got: blocked,
        met: blocked <= TARGET_FLEET_BLOCKED_MS,
      },
    },
  };
}

// ---------------------------------------------------------------------------------------------
// Output

/**
 * "longest wave 3 of 17: 212 ms (caught-up +40, sequences-carried +12, …); median per wave …".
 * From the progress lines: `switched` comes after the config file's rewrite and the step's record,
 * once writes have resumed, so its figure is more than the switch's share of the write block.
 * @param {Result['moves'][number]} m
 */
function describeWave(m) {
  /** @param {Record<string, number>} o */
  const steps = (o) =>
    Object.entries(o)
      .map(([step, ms]) => `${step} +${ms}`)
      .join(', ');
  if (!m.longestWave) return 'no fenced steps in its output';
  return `longest wave ${m.longestWave.wave} of ${m.waves}: ${m.longestWave.fencedMs} ms fenced → switched (${steps(m.longestWave.steps)}); median per wave: ${steps(m.stepMedians)}`;
}

const FLEET_HEADERS = [
  'PostgreSQL',
  'fleet',
  'total',
  'longest write block',
  'target ≤ 250 ms',
  'peak RSS (largest CLI)',
  'target < 300 MiB',
  'per CLI',
];

/** @param {Result[]} results */
function fleetRows(results) {
  return results.map((f) => [
    f.postgres,
    `${formatCount(f.shards)} empty shards, 4 → 8 hosts (${formatCount(f.movedShards)} moved by 4 CLIs at once)`,
    formatMs(f.totalMs),
    formatMs(f.writeBlockedMs),
    verdict(f.targets.writeBlocked.met),
    formatRss(f.peakRssKiB),
    f.targets.peakRss.met === null ? 'not measured' : verdict(f.targets.peakRss.met),
    f.moves.map((m) => `${m.source}→${m.target} ${formatMs(m.wallMs)}, ${m.waves} waves`).join('; '),
  ]);
}

/** @param {Result} result */
export function table(result) {
  return [
    'move-fleet: one run',
    textTable(FLEET_HEADERS, fleetRows([result])),
    ...result.moves.map((m) => `${m.source} → ${m.target}: ${describeWave(m)}`),
  ].join('\n');
}

/** @param {Result[]} results */
export function markdown(results) {
  return ['**Fleet scale** (one run):', '', markdownTable(FLEET_HEADERS, fleetRows(results))].join('\n');
}
