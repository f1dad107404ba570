/**
 * migrate: `shardctl migrate` of one migration (a column and an index on photos) over the whole
 * fleet against two floors, the same SQL as plain psql scripts per host, hosts in parallel: one
 * transaction per shard (exactly what shardctl sends: the library's plan, `migrate(config,
 * { dryRun: true })`), and 64 shards per transaction (issue #9's floor: what a DBA would script by
 * hand). Two fleet shapes: a quarter of --shards on half of --hosts (2048 on 2 at the reference
 * scale), and the whole (8192 on 4). Then, on the current fleet, the fixed cost every run pays:
 * `shardctl migrate --check`, its parts (bench/check-parts.js, bundled as the CLI is), and
 * `shardctl --help` against `node -e 0`.
 *
 * The fleet before the migration is built once by init into a template database; every run starts
 * from a copy of it (CREATE DATABASE … TEMPLATE, then CHECKPOINT), so every side migrates identical
 * fleets. Each run records its wall time, the client's CPU time (GNU time: user + system) and the
 * servers' CPU time (the backends' CPU as the postmasters count it when they end): on a shared
 * machine wall time also measures waiting for a core, CPU time does not.
 */
import path from 'node:path';
import { loadConfig, migrate } from '../dist/index.js';
import { bundle } from '../scripts/bundle-cli.js';
import {
  backendsGone,
  formatMs,
  formatRss,
  formatSample,
  initFleet,
  itemAt,
  log,
  peakOf,
  markdownTable,
  ratio,
  REPO_ROOT,
  required,
  resetDatabases,
  roundOrder,
  runProcess,
  sampleOrNull,
  serverCpuMs,
  summarize,
  textTable,
  timeCli,
  timeCommand,
  timePsqlScripts,
  verdict,
  verifyFleet,
  writePlanScripts,
} from './lib.js';

export const description =
  'shardctl migrate (column + index) vs the same SQL as parallel psql scripts; migrate --check and --help';

const BASE_DATABASE = 'bench_migrate_base';
const DATABASE = 'bench_migrate';
const MIGRATION_FILE = '0004_photos_filter.sql';
const MIGRATION_SQL = `-- bench/migrate.js: one column and one index on one table, on every shard.
ALTER TABLE photos ADD COLUMN filter text;
CREATE INDEX photos_filter_idx ON photos (filter);
`;
const SCHEMAS_PER_TRANSACTION = 64;
const TARGET_RATIO = 1.15;
const TARGET_CHECK_MS = 500;
const TARGET_HELP_MS = 150;
/** @typedef {'shardctl' | 'psql' | 'psql64'} Side */
/** @type {Side[]} */
const SIDES = ['shardctl', 'psql', 'psql64'];
/** @typedef {import('./lib.js').Fleet} Fleet */
/** @typedef {import('./lib.js').Sample} Sample */
/** @typedef {import('./run.js').BenchContext} BenchContext */
/** @typedef {Awaited<ReturnType<typeof run>>} MigrateResult */

/**
 * One value per side, in SIDES's order.
 * @template T
 * @param {(side: Side) => T} valueOf
 * @returns {Record<Side, T>}
 */
function bySide(valueOf) {
  return { shardctl: valueOf('shardctl'), psql: valueOf('psql'), psql64: valueOf('psql64') };
}

/** Per host: every shard's photos has the column and the index, or the run did not do its work. */
const MIGRATED_CHECK = `
  select count(*) filter (where a.attname is null) = 0 and count(*) filter (where i.indexrelid is null) = 0 as ok,
         count(*) filter (where a.attname is null) || ' photos tables without filter, '
           || count(*) filter (where i.indexrelid is null) || ' without photos_filter_idx' as detail
    from pg_class c
    join pg_namespace n on n.oid = c.relnamespace
    left join pg_attribute a on a.attrelid = c.oid and a.attname = 'filter' and not a.attisdropped
    left join pg_index i on i.indrelid = c.oid
         and i.indexrelid = (select oid from pg_class where relname = 'photos_filter_idx' and relnamespace = n.oid)
   where c.relname = 'photos' and c.relkind = 'r' and n.nspname ~ '^insta[0-9]+$'`;

/**
 * @param {BenchContext} ctx
 * @param {string} major
 */
export async function run(ctx, major) {
  const { options } = ctx;
  const shapes = [
    { shards: Math.max(1, Math.floor(options.shards / 4)), hosts: Math.max(1, Math.floor(options.hosts / 2)) },
    { shards: options.shards, hosts: options.hosts },
  ];
  const migrations = [];
  for (const shape of shapes) migrations.push(await runShape(ctx, major, shape));
  const last = required(migrations.at(-1), 'fleet shape measured');
  const fixed = await fixedCost(ctx, last.fleet);
  return {
    benchmark: 'migrate',
    postgres: last.postgres,
    migration: MIGRATION_SQL.split('\n')
      .filter((line) => line && !line.startsWith('--'))
      .join(' '),
    schemasPerTransaction: SCHEMAS_PER_TRANSACTION,
    ...(process.env.SHARDCTL_BENCH_CLI ? { cli: process.env.SHARDCTL_BENCH_CLI } : {}),
    shapes: migrations.map(({ fleet, ...result }) => result),
    ...fixed,
    targets: {
      vsPsql64: migrations.map((m) => ({
        fleet: `${m.shards}/${m.hosts}`,
        wanted: `≤ ${TARGET_RATIO}x`,
        got: m.ratio64,
        met: m.ratio64 <= TARGET_RATIO,
      })),
      check: {
        wanted: `< ${TARGET_CHECK_MS} ms`,
        got: fixed.check.wallMs.median,
        met: fixed.check.wallMs.median < TARGET_CHECK_MS,
      },
      help: {
        wanted: `< ${TARGET_HELP_MS} ms`,
        got: fixed.help.wallMs.median,
        met: fixed.help.wallMs.median < TARGET_HELP_MS,
      },
    },
  };
}

/**
 * One fleet shape: build it once, then rounds of shardctl and both floors, the order rotating.
 * @param {BenchContext} ctx
 * @param {string} major
 * @param {{ shards: number, hosts: number }} shape
 */
async function runShape(ctx, major, shape) {
  const { options } = ctx;
  const name = `${shape.shards}x${shape.hosts}`;
  const base = await ctx.fleet(`migrate-base-${name}`, major, {
    database: BASE_DATABASE,
    shards: shape.shards,
    hostCount: shape.hosts,
  });
  const fleet = await ctx.fleet(`migrate-${name}`, major, {
    database: DATABASE,
    shards: shape.shards,
    hostCount: shape.hosts,
    extraMigrations: { [MIGRATION_FILE]: MIGRATION_SQL },
  });
  const hosts = fleet.hosts;
  const serverVersion = await itemAt(hosts, 0).serverVersion();
  log(
    `migrate on PostgreSQL ${serverVersion}: building the base fleet (${shape.shards} shards on ${shape.hosts} hosts, untimed)`,
  );

  const baseConfig = await loadConfig(base.configFile);
  const built = await initFleet(base);
  await verifyFleet(baseConfig, base, { version: built.targetVersion });

  const config = await loadConfig(fleet.configFile);
  await resetDatabases(hosts, DATABASE, { template: BASE_DATABASE });
  const dryRun = await migrate(config, { dryRun: true });
  const pending = dryRun.plan.hosts.reduce((n, h) => n + h.jobs.length, 0);
  if (pending !== shape.shards) throw new Error(`the migrate plan covers ${pending} shards, expected ${shape.shards}`);
  const scripts = {
    psql: await writePlanScripts(dryRun.plan, hosts, fleet.dir, 'migrate'),
    psql64: await writePlanScripts(dryRun.plan, hosts, fleet.dir, 'migrate64', {
      schemasPerTransaction: SCHEMAS_PER_TRANSACTION,
    }),
  };

  const runs = bySide(() => ({
    /** @type {number[]} */ wallMs: [],
    /** @type {(number | null)[]} */ cpuMs: [],
    /** @type {(number | null)[]} */ serverCpuMs: [],
    /** @type {(number | null)[]} */ rss: [],
  }));
  for (let round = 0; round < options.runs; round++) {
    const order = roundOrder(SIDES, round);
    for (const side of order) {
      await resetDatabases(hosts, DATABASE, { template: BASE_DATABASE });
      await backendsGone(hosts, DATABASE);
      const serverBefore = serverCpuMs(hosts);
      /** @type {{ ms: number, cpuMs?: number | null, peakRssKiB?: number | null }} */
      const timed =
        side === 'shardctl'
          ? await timeCli(['migrate', '-c', fleet.configFile], { cwd: fleet.dir })
          : await timePsqlScripts(hosts, scripts[side], DATABASE, options.psql);
      await backendsGone(hosts, DATABASE);
      const serverAfter = serverCpuMs(hosts);
      const r = runs[side];
      r.wallMs.push(timed.ms);
      r.cpuMs.push(timed.cpuMs ?? null);
      r.rss.push(timed.peakRssKiB ?? null);
      r.serverCpuMs.push(serverBefore === null || serverAfter === null ? null : serverAfter - serverBefore);
      await verifyFleet(config, fleet, { version: dryRun.targetVersion, extraCheck: MIGRATED_CHECK });
      log(`  ${name} round ${round + 1}/${options.runs}: ${side} ${formatMs(timed.ms)}`);
    }
  }
  const sides = bySide((side) => ({
    wallMs: summarize(runs[side].wallMs),
    cpuMs: sampleOrNull(runs[side].cpuMs),
    serverCpuMs: sampleOrNull(runs[side].serverCpuMs),
  }));
  return {
    fleet,
    postgres: serverVersion,
    shards: shape.shards,
    hosts: shape.hosts,
    concurrency: config.concurrency,
    sides,
    ratio: ratio(sides.shardctl.wallMs.median, sides.psql.wallMs.median),
    ratio64: ratio(sides.shardctl.wallMs.median, sides.psql64.wallMs.median),
    peakRssKiB: peakOf(runs.shardctl.rss),
  };
}

/**
 * What every run pays, on the current fleet (the last run of each side applied the migration):
 * `migrate --check` and `--help` (each interleaved with `node -e 0`, the floor of any Node CLI),
 * and the parts of `migrate --check`, each measured in its own fresh process.
 * @param {BenchContext} ctx
 * @param {Fleet} fleet
 */
async function fixedCost(ctx, fleet) {
  const { options } = ctx;
  await Promise.all(fleet.hosts.map((host) => host.query('postgres', 'checkpoint')));
  /** @typedef {{ wallMs: number[], cpuMs: (number | null)[] }} Runs */
  /** @type {{ check: Runs, help: Runs, node: Runs }} */
  const samples = {
    check: { wallMs: [], cpuMs: [] },
    help: { wallMs: [], cpuMs: [] },
    node: { wallMs: [], cpuMs: [] },
  };
  /** Per run, part → its wall and CPU ms (bench/check-parts.js's output). @type {Record<string, { wallMs: number, cpuMs: number }>[]} */
  const parts = [];
  // The parts load the library as the CLI does, from a bundle (scripts/bundle-cli.js); bench/.bundle/
  // is two levels below the root, as dist/bundle/ is.
  const checkParts = path.join(REPO_ROOT, 'bench', '.bundle', 'check-parts.js');
  await bundle({ 'check-parts': path.join(REPO_ROOT, 'bench', 'check-parts.js') }, path.dirname(checkParts));
  for (let i = 0; i < options.checkRuns; i++) {
    const timed = {
      check: await timeCli(['migrate', '--check', '-c', fleet.configFile], { cwd: fleet.dir, expectCode: 0 }),
      help: await timeCli(['--help'], { cwd: fleet.dir }),
      node: await timeCommand(process.execPath, ['-e', '0']),
    };
    for (const what of /** @type {const} */ (['check', 'help', 'node'])) {
      samples[what].wallMs.push(timed[what].ms);
      samples[what].cpuMs.push(timed[what].cpuMs ?? null);
    }
    const run = await runProcess(process.execPath, [checkParts, fleet.configFile], { cwd: fleet.dir });
    if (run.code !== 0) throw new Error(`bench/check-parts.js exited ${run.code}: ${run.stderr}`);
    parts.push(JSON.parse(run.stdout).parts);
    log(
      `  fixed cost ${i + 1}/${options.checkRuns}: migrate --check ${formatMs(timed.check.ms)}, --help ${formatMs(timed.help.ms)}, node -e 0 ${formatMs(timed.node.ms)}`,
    );
  }
  /** @param {Runs} s */
  const summary = (s) => ({ wallMs: summarize(s.wallMs), cpuMs: sampleOrNull(s.cpuMs) });
  const partNames = Object.keys(required(parts[0], 'run of bench/check-parts.js'));
  /** @param {string} part */
  const partRuns = (part) => parts.map((p) => required(p[part], `part ${part} in bench/check-parts.js's output`));
  return {
    checkFleet: { shards: fleet.shards, hosts: fleet.hosts.length },
    check: summary(samples.check),
    help: summary(samples.help),
    node: summary(samples.node),
    checkParts: partNames.map((part) => ({
      part,
      wallMs: summarize(partRuns(part).map((p) => p.wallMs)),
      cpuMs: summarize(partRuns(part).map((p) => p.cpuMs)),
    })),
  };
}

const HEADERS = ['PostgreSQL', 'fleet', 'side', 'wall', 'client CPU', 'server CPU', 'wall vs psql64', 'peak RSS'];
/** @type {Record<Side, string>} */
const SIDE_NAMES = {
  shardctl: 'shardctl migrate',
  psql: 'psql, one transaction per shard (floor, as shardctl sends it)',
  psql64: `psql, ${SCHEMAS_PER_TRANSACTION} shards per transaction (floor, issue #9)`,
};

/** @param {Sample | null} sample */
const cpu = (sample) => (sample ? formatSample(sample) : 'n/a');

/** @param {MigrateResult} result */
function rows(result) {
  return result.shapes.flatMap((shape) =>
    SIDES.map((side) => {
      const s = shape.sides[side];
      return [
        result.postgres,
        `${shape.shards} shards, ${shape.hosts} hosts, concurrency ${shape.concurrency}`,
        SIDE_NAMES[side],
        formatSample(s.wallMs),
        side === 'shardctl' ? cpu(s.cpuMs) : '',
        cpu(s.serverCpuMs),
        `${ratio(s.wallMs.median, shape.sides.psql64.wallMs.median).toFixed(2)}x`,
        side === 'shardctl' ? formatRss(shape.peakRssKiB) : '',
      ];
    }),
  );
}

const FIXED_HEADERS = ['what', 'wall', 'CPU (user + system)', 'target'];

/** @param {MigrateResult} result */
function fixedRows(result) {
  const { check, help, node, checkFleet } = result;
  return [
    [
      `shardctl migrate --check (current fleet, ${checkFleet.shards} shards, ${checkFleet.hosts} hosts)`,
      formatSample(check.wallMs),
      cpu(check.cpuMs),
      `< ${formatMs(TARGET_CHECK_MS)}: ${verdict(result.targets.check.met)}`,
    ],
    [
      'shardctl --help',
      formatSample(help.wallMs),
      cpu(help.cpuMs),
      `< ${formatMs(TARGET_HELP_MS)}: ${verdict(result.targets.help.met)}`,
    ],
    ['node -e 0 (the floor of any Node CLI)', formatSample(node.wallMs), cpu(node.cpuMs), ''],
  ];
}

const PART_HEADERS = ['part of migrate --check', 'wall', 'CPU (user + system)'];

/** @param {MigrateResult} result */
function partRows(result) {
  return result.checkParts.map((p) => [p.part, formatSample(p.wallMs), formatSample(p.cpuMs)]);
}

/** @param {MigrateResult} result */
function targetLine(result) {
  const shapes = result.targets.vsPsql64.map((t) => `${t.fleet}: ${t.got}x ${verdict(t.met)}`).join(', ');
  return (
    `Targets: migrate ≤ ${TARGET_RATIO}x the ${SCHEMAS_PER_TRANSACTION}-per-transaction psql floor (wall, median): ${shapes}; ` +
    `migrate --check < ${formatMs(TARGET_CHECK_MS)}: ${verdict(result.targets.check.met)}; --help < ${formatMs(TARGET_HELP_MS)}: ${verdict(result.targets.help.met)}.`
  );
}

/** @param {MigrateResult} result */
export function table(result) {
  const runs = itemAt(result.shapes, 0).sides.shardctl.wallMs.runs.length;
  return [
    `migrate (${result.migration}): median (range) of ${runs} interleaved rounds`,
    textTable(HEADERS, rows(result)),
    '',
    `fixed cost: median (range) of ${result.check.wallMs.runs.length} runs`,
    textTable(FIXED_HEADERS, fixedRows(result)),
    '',
    textTable(PART_HEADERS, partRows(result)),
    '',
    targetLine(result),
  ].join('\n');
}

/** @param {MigrateResult[]} results */
export function markdown(results) {
  return results
    .map((r) => {
      const runs = itemAt(r.shapes, 0).sides.shardctl.wallMs.runs.length;
      return [
        `Migration: \`${r.migration}\`. Median (range) of ${runs} interleaved rounds (the order of the three sides rotates); every run on a fresh copy of the same fleet. Client CPU: the shardctl process (user + system, GNU time); server CPU: every backend of the run, all hosts.`,
        '',
        markdownTable(HEADERS, rows(r)),
        '',
        `Fixed cost on the current fleet, median (range) of ${r.check.wallMs.runs.length} runs, each interleaved with the others:`,
        '',
        markdownTable(FIXED_HEADERS, fixedRows(r)),
        '',
        `The parts of \`migrate --check\` (bench/check-parts.js: the library's steps one by one in a fresh process), median (range) of ${itemAt(r.checkParts, 0).wallMs.runs.length} runs:`,
        '',
        markdownTable(PART_HEADERS, partRows(r)),
        '',
        targetLine(r),
      ].join('\n');
    })
    .join('\n\n');
}
