/**
 * migrate: `shardctl migrate` of one migration (a column and an index on photos) over the whole
 * fleet against the floor: the same SQL as plain psql scripts per host in parallel; then
 * `shardctl migrate --check` on the current fleet.
 *
 * The fleet before the migration is built once by init into a template database; every run starts
 * from a copy of it (CREATE DATABASE … TEMPLATE, then CHECKPOINT), so shardctl and psql migrate
 * identical fleets. The floor's SQL is the library's plan (`migrate(config, { dryRun: true })`):
 * the migration and its record in one transaction per shard, exactly what shardctl sends.
 */
import { init, loadConfig, migrate } from '../dist/index.js';
import {
  formatMs,
  formatRss,
  formatSample,
  log,
  markdownTable,
  ratio,
  resetDatabases,
  summarize,
  textTable,
  timeCli,
  timePsqlScripts,
  verdict,
  verifyFleet,
  writePlanScripts,
} from './lib.js';

export const description = 'shardctl migrate (column + index) vs the same SQL as parallel psql scripts; migrate --check';

const BASE_DATABASE = 'bench_migrate_base';
const DATABASE = 'bench_migrate';
const MIGRATION_FILE = '0004_photos_filter.sql';
const MIGRATION_SQL = `-- bench/migrate.js: one column and one index on one table, on every shard.
ALTER TABLE photos ADD COLUMN filter text;
CREATE INDEX photos_filter_idx ON photos (filter);
`;
const TARGET_RATIO = 1.15;
const TARGET_CHECK_MS = 2000;

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

export async function run(ctx, major) {
  const { options } = ctx;
  const base = await ctx.fleet('migrate-base', major, { database: BASE_DATABASE });
  const fleet = await ctx.fleet('migrate', major, { database: DATABASE, extraMigrations: { [MIGRATION_FILE]: MIGRATION_SQL } });
  const hosts = fleet.hosts;
  const serverVersion = await hosts[0].serverVersion();
  log(`migrate on PostgreSQL ${serverVersion}: building the base fleet (${options.shards} shards, untimed)`);

  const baseConfig = await loadConfig(base.configFile);
  await resetDatabases(hosts, BASE_DATABASE);
  const built = await init(baseConfig);
  if (!built.ok) throw new Error('init of the base fleet failed');
  await verifyFleet(baseConfig, base, { version: built.targetVersion });

  const config = await loadConfig(fleet.configFile);
  await resetDatabases(hosts, DATABASE, { template: BASE_DATABASE });
  const dryRun = await migrate(config, { dryRun: true });
  const pending = dryRun.plan.hosts.reduce((n, h) => n + h.jobs.length, 0);
  if (pending !== options.shards) throw new Error(`the migrate plan covers ${pending} shards, expected ${options.shards}`);
  const scripts = await writePlanScripts(dryRun.plan, hosts, fleet.dir, 'migrate');

  const ours = [];
  const psql = [];
  const rss = [];
  for (let round = 0; round < options.runs; round++) {
    const order = round % 2 === 0 ? ['shardctl', 'psql'] : ['psql', 'shardctl'];
    for (const who of order) {
      await resetDatabases(hosts, DATABASE, { template: BASE_DATABASE });
      if (who === 'shardctl') {
        const timed = await timeCli(['migrate', '-c', fleet.configFile], { cwd: fleet.dir });
        ours.push(timed.ms);
        rss.push(timed.peakRssKiB);
      } else {
        psql.push((await timePsqlScripts(hosts, scripts, DATABASE, options.psql)).ms);
      }
      await verifyFleet(config, fleet, { version: dryRun.targetVersion, extraCheck: MIGRATED_CHECK });
      log(`  run ${round + 1}/${options.runs}: ${who} ${formatMs((who === 'shardctl' ? ours : psql).at(-1))}`);
    }
  }

  // The fleet is current now (the last run, whichever it was, applied and recorded the migration).
  await Promise.all(hosts.map((host) => host.query('postgres', 'checkpoint')));
  const checks = [];
  const checkRss = [];
  for (let i = 0; i < options.checkRuns; i++) {
    const timed = await timeCli(['migrate', '--check', '-c', fleet.configFile], { cwd: fleet.dir, expectCode: 0 });
    checks.push(timed.ms);
    checkRss.push(timed.peakRssKiB);
    log(`  migrate --check ${i + 1}/${options.checkRuns}: ${formatMs(timed.ms)}`);
  }

  const oursSample = summarize(ours);
  const psqlSample = summarize(psql);
  const checkSample = summarize(checks);
  const measuredRatio = ratio(oursSample.median, psqlSample.median);
  const peak = (values) => (values.every((r) => r !== null) ? Math.max(...values) : null);
  return {
    benchmark: 'migrate',
    postgres: serverVersion,
    shards: options.shards,
    hosts: hosts.length,
    concurrency: config.concurrency,
    migration: MIGRATION_SQL.split('\n').filter((line) => line && !line.startsWith('--')).join(' '),
    shardctlMs: oursSample,
    psqlMs: psqlSample,
    ratio: measuredRatio,
    peakRssKiB: peak(rss),
    checkMs: checkSample,
    checkPeakRssKiB: peak(checkRss),
    targets: {
      vsPsql: { wanted: `≤ ${TARGET_RATIO}x`, got: measuredRatio, met: measuredRatio <= TARGET_RATIO },
      check: { wanted: `< ${TARGET_CHECK_MS} ms`, got: checkSample.median, met: checkSample.median < TARGET_CHECK_MS },
    },
  };
}

const HEADERS = ['PostgreSQL', 'fleet', 'shardctl migrate', 'psql scripts (floor)', 'ratio', 'target', 'peak RSS'];
const CHECK_HEADERS = ['PostgreSQL', 'fleet', 'migrate --check', 'target', 'peak RSS'];

function rows(results) {
  return results.map((r) => [
    r.postgres,
    `${r.shards} shards, ${r.hosts} hosts, concurrency ${r.concurrency}`,
    formatSample(r.shardctlMs),
    formatSample(r.psqlMs),
    `${r.ratio.toFixed(2)}x`,
    `≤ ${TARGET_RATIO}x: ${verdict(r.targets.vsPsql.met)}`,
    formatRss(r.peakRssKiB),
  ]);
}

function checkRows(results) {
  return results.map((r) => [
    r.postgres,
    `${r.shards} shards, ${r.hosts} hosts`,
    formatSample(r.checkMs),
    `< ${formatMs(TARGET_CHECK_MS)}: ${verdict(r.targets.check.met)}`,
    formatRss(r.checkPeakRssKiB),
  ]);
}

export function table(result) {
  return [
    `migrate (${result.migration}): median (range) of ${result.shardctlMs.runs.length} runs each, interleaved`,
    textTable(HEADERS, rows([result])),
    '',
    `migrate --check on the current fleet: median (range) of ${result.checkMs.runs.length} runs`,
    textTable(CHECK_HEADERS, checkRows([result])),
  ].join('\n');
}

export function markdown(results) {
  const r = results[0];
  return [
    `Migration: \`${r.migration}\`. Median (range) of ${r.shardctlMs.runs.length} runs each, interleaved; every run on a fresh copy of the same fleet.`,
    '',
    markdownTable(HEADERS, rows(results)),
    '',
    `\`migrate --check\` on the current fleet (CLI wall time), median (range) of ${r.checkMs.runs.length} runs:`,
    '',
    markdownTable(CHECK_HEADERS, checkRows(results)),
  ].join('\n');
}
