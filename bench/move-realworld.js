/**
 * move-realworld: one shard of the real-world schema (test/fixtures/realworld: identity and
 * generated columns, TOASTed text, deferrable cascades, RLS, a range-partitioned table, a table
 * without a primary key) moved online under a paced writer, against `pg_dump -n <schema> | psql`
 * of the same schema (issue 21, item 2). The figure that matters is the write pause
 * (writeBlockedMs): the tables the by-key check does not cover used to be checksummed whole while
 * fenced.
 *
 * As in move-shard: the fleet (4 shards, 0-1 on pg1 and 2-3 on pg2; --realworld-rows accounts, with
 * their posts, replies, events and audit rows, loaded into shard 1, then VACUUM ANALYZE) is built
 * once into a template database; every run starts from a fresh copy of it on both hosts. The
 * writer runs one transaction of the fixture's writer.sql (every kind of table written, a post
 * edited, a reply deleted) every PACE_MS, from before the move until after it, following the move
 * on SC100. After each run the move must have verified equal copies and left no replication
 * object behind, and the target must hold every account the writer was acknowledged.
 */
import { readdirSync, readFileSync } from 'node:fs';
import { readFile, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { hostForShard, loadConfig, moveShard, ShardMap, shardSchemaName } from '../dist/index.js';
import {
  formatCount,
  formatMs,
  formatSample,
  ident,
  initFleet,
  itemAt,
  log,
  markdownTable,
  ratio,
  REPO_ROOT,
  required,
  resetDatabases,
  roundOrder,
  summarize,
  textTable,
  verdict,
} from './lib.js';
import {
  fencedStepsByWave,
  floorTools,
  replicationObjectsLeft,
  startWriter,
  timeDumpRestore,
  underWriter,
} from './moving.js';

export const description =
  'online move of one real-world shard (--realworld-rows accounts) under a paced writer vs pg_dump -n | psql';

const FIXTURE = path.join(REPO_ROOT, 'test', 'fixtures', 'realworld');
const BASE_DATABASE = 'bench_realworld_base';
const DATABASE = 'bench_realworld';
const DUMP_DATABASE = 'bench_realworld_dump';
const SHARDS = 4;
const HOSTS = 2;
const SHARD = 1;
const TARGET_HOST = 'pg2';
/** Issue 21: the pause on any schema the move carries. */
const TARGET_BLOCKED_MS = 500;
/** One writer transaction per this many ms (about 100 per second when the host keeps up). */
const PACE_MS = 10;

/**
 * @param {string} file
 * @param {Record<string, string>} values
 */
function fixture(file, values) {
  return readFileSync(path.join(FIXTURE, file), 'utf8').replace(/\{\{(\w+)\}\}/g, (_, /** @type {string} */ key) => {
    const value = values[key];
    if (value === undefined) throw new Error(`${file}: no value for {{${key}}}`);
    return value;
  });
}

function migrations() {
  const dir = path.join(FIXTURE, 'migrations');
  // Prefixed so that they sort after the example migrations the bench fleets always carry.
  return Object.fromEntries(readdirSync(dir).map((name) => [`1${name}`, readFileSync(path.join(dir, name), 'utf8')]));
}

/** @typedef {Awaited<ReturnType<typeof run>>} Result */

/**
 * @param {import('./run.js').BenchContext} ctx
 * @param {string} major
 */
export async function run(ctx, major) {
  const { options } = ctx;
  const extraMigrations = migrations();
  const base = await ctx.fleet('move-realworld-base', major, {
    database: BASE_DATABASE,
    hostCount: HOSTS,
    shards: SHARDS,
    extraMigrations,
  });
  const fleet = await ctx.fleet('move-realworld', major, {
    database: DATABASE,
    hostCount: HOSTS,
    shards: SHARDS,
    extraMigrations,
  });
  const config = await loadConfig(fleet.configFile);
  const schema = shardSchemaName(config, SHARD);
  const source = fleet.hosts.find((h) => h.name === hostForShard(config, SHARD)?.name);
  const target = fleet.hosts.find((h) => h.name === TARGET_HOST);
  if (!source || !target || source === target)
    throw new Error(`the fleet must hold shard ${SHARD} on a host other than ${TARGET_HOST}`);
  const serverVersion = await source.serverVersion();
  const floor = floorTools(major, serverVersion, options);
  if (floor.skipped) log(`move-realworld on PostgreSQL ${serverVersion}: no floor, ${floor.skipped}`);

  const rows = options.realworldRows;
  log(
    `move-realworld on PostgreSQL ${serverVersion}: loading ${formatCount(rows)} accounts (and their rows) into ${schema} on ${source.name} (untimed)`,
  );
  await initFleet(base);
  await source.query(BASE_DATABASE, fixture('seed.sql', { schema, rows: String(rows) }));
  await source.query(BASE_DATABASE, 'vacuum analyze');
  const [size] = await source.query(
    BASE_DATABASE,
    `select pg_size_pretty(sum(pg_total_relation_size(c.oid))) as s from pg_class c where c.relnamespace = to_regnamespace($1)`,
    [schema],
  );
  log(`  ${schema}: ${size?.s}`);
  const initialMap = await readFile(fleet.configFile, 'utf8');

  const moves = [];
  const dumps = [];
  for (let turn = 0; turn < options.realworldRuns; turn++) {
    for (const who of roundOrder(floor.skipped ? ['move'] : ['move', 'pg_dump'], turn)) {
      await resetDatabases(fleet.hosts, DATABASE, { template: BASE_DATABASE });
      await writeFile(fleet.configFile, initialMap);
      if (who === 'move') {
        const moved = await timeMove(fleet, { source, target, schema });
        moves.push(moved);
        log(
          `  run ${turn + 1}/${options.realworldRuns}: move ${formatMs(moved.durationMs)}, writes blocked ${formatMs(moved.writeBlockedMs)}; ` +
            `${formatCount(moved.transactions)} writer transactions, ${moved.whole ?? 'n/a'} tables checksummed whole while fenced; ` +
            `after the fence: ${Object.entries(moved.fencedSteps)
              .map(([step, ms]) => `${step} +${ms} ms`)
              .join(', ')}`,
        );
      } else {
        dumps.push(
          await timeDumpRestore({
            source,
            sourceDb: DATABASE,
            target,
            targetDb: DUMP_DATABASE,
            schemas: [schema],
            pgDump: floor.pgDump,
            psql: options.psql,
          }),
        );
        log(`  run ${turn + 1}/${options.realworldRuns}: pg_dump | psql ${formatMs(dumps.at(-1))}`);
      }
    }
  }
  const moveMs = summarize(moves.map((m) => m.durationMs));
  const writeBlockedMs = summarize(moves.map((m) => required(m.writeBlockedMs, "a move's write-blocked time")));
  const pgDumpMs = floor.skipped ? null : summarize(dumps);
  const measuredRatio = pgDumpMs ? ratio(moveMs.median, pgDumpMs.median) : null;
  return {
    benchmark: 'move-realworld',
    postgres: serverVersion,
    shard: SHARD,
    source: source.name,
    target: target.name,
    accounts: rows,
    schemaSize: size?.s,
    moveMs,
    writeBlockedMs,
    pgDumpMs,
    pgDumpVersion: floor.version,
    floorSkipped: floor.skipped,
    ratio: measuredRatio,
    runs: moves,
    targets: {
      writeBlocked: {
        wanted: `< ${TARGET_BLOCKED_MS} ms (median)`,
        got: writeBlockedMs.median,
        met: writeBlockedMs.median < TARGET_BLOCKED_MS,
      },
    },
  };
}

/**
 * @param {import('./lib.js').Fleet} fleet
 * @param {{ source: import('./lib.js').Host, target: import('./lib.js').Host, schema: string }} scenario
 */
async function timeMove(fleet, { source, target, schema }) {
  const config = await loadConfig(fleet.configFile);
  const writer = startFixtureWriter(await ShardMap.load(fleet.configFile), schema);
  /** @type {import('./moving.js').TimedLine[]} */
  const lines = [];
  const { result, written } = await underWriter(writer, () =>
    moveShard(config, SHARD, target.name, {
      configFile: fleet.configFile,
      onStep: (_step, detail) => lines.push({ text: detail, atMs: performance.now() }),
    }),
  );
  const handles = required(written.acks.get(SHARD), `the writer's acknowledged writes to shard ${SHARD}`);
  const problems = [];
  if (result.outcome !== 'moved') problems.push(`the move ended ${result.outcome}`);
  if (!result.verification?.ok) problems.push('the verification did not pass');
  if (written.byHost.get(source.name) === undefined || written.byHost.get(target.name) === undefined)
    problems.push('the writer did not write on both hosts');
  const [found] = await target.query(
    DATABASE,
    `select count(*)::int as n from ${ident(schema)}.accounts where handle = any($1::text[])`,
    [handles],
  );
  if (found?.n !== handles.length)
    problems.push(
      `${handles.length - (found?.n ?? 0)} of ${handles.length} acknowledged accounts are missing on ${target.name}`,
    );
  for (const host of [source, target]) {
    if ((await replicationObjectsLeft(host, DATABASE)) !== 0)
      problems.push(`${host.name}: replication objects left behind`);
  }
  if (problems.length > 0)
    throw new Error(`the move did not leave what it should have:\n  - ${problems.join('\n  - ')}`);
  // Checked above: a move without a passed verification is a problem.
  const verification = required(result.verification, "the move's verification");
  return {
    durationMs: result.durationMs,
    writeBlockedMs: result.writeBlockedMs,
    transactions: handles.length,
    // Not reported by builds before the change logs (then n/a).
    whole: verification.whole?.length ?? null,
    byKey: verification.byKey,
    byLog: verification.byLog ?? null,
    // How long each step from the fence to the switch took, in ms: where the pause went.
    fencedSteps: fencedStepsByWave(lines)[0]?.steps ?? {},
  };
}

/**
 * The application: one writer.sql transaction every PACE_MS on the host the map names.
 * @param {import('../dist/index.js').ShardMap} map
 * @param {string} schema
 */
function startFixtureWriter(map, schema) {
  return startWriter(map, {
    shards: [SHARD],
    paceMs: PACE_MS,
    retryMs: 0,
    transaction: true,
    write: async (client, _shard, i) => {
      await client.query(fixture('writer.sql', { schema, i: String(i) }));
      return `writer-${i}`;
    },
  });
}

const HEADERS = [
  'PostgreSQL',
  'shard moved',
  'writes blocked',
  'target',
  'move-shard (online)',
  'pg_dump -n \\| psql',
  'ratio',
  'tables whole while fenced',
];

/** @param {Result[]} results */
function rows(results) {
  return results.map((r) => [
    r.postgres,
    `shard ${r.shard} (${r.schemaSize}), ${formatCount(r.accounts)} accounts, ${r.source} → ${r.target}`,
    formatSample(r.writeBlockedMs),
    `< ${TARGET_BLOCKED_MS} ms: ${verdict(r.targets.writeBlocked.met)}`,
    formatSample(r.moveMs),
    r.pgDumpMs ? formatSample(r.pgDumpMs) : `n/a (pg_dump ${r.pgDumpVersion ?? 'missing'})`,
    r.ratio === null ? 'n/a' : `${r.ratio.toFixed(2)}x`,
    r.runs.map((m) => m.whole ?? 'n/a').join(' / '),
  ]);
}

/** @param {Result} result */
export function table(result) {
  return [
    `move-realworld: median (range) of ${result.moveMs.runs.length} runs; a paced writer throughout every move`,
    textTable(
      HEADERS.map((h) => h.replace('\\|', '|')),
      rows([result]),
    ),
  ].join('\n');
}

/** @param {Result[]} results */
export function markdown(results) {
  return [
    `Median (range) of ${itemAt(results, 0).moveMs.runs.length} runs each, interleaved with the floor where there is one; a paced writer (writer.sql every ${PACE_MS} ms) throughout every move.`,
    '',
    markdownTable(HEADERS, rows(results)),
  ].join('\n');
}
