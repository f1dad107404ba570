/**
 * move-shard: one shard of 1,000,000 photos rows moved online from pg1 to pg2 while a client keeps
 * inserting into it, against the floor of copying the same schema by hand: `pg_dump -n insta1 |
 * psql` into an empty database on the target host (issue 4).
 *
 * The fleet (8 shards, 0-3 on pg1 and 4-7 on pg2; the rows loaded into shard 1, then VACUUM
 * ANALYZE) is built once into a template database on both hosts. Every run, the move's or the
 * floor's, starts from a fresh copy of it on both hosts (CREATE DATABASE … TEMPLATE, then
 * CHECKPOINT) and from the config file as init left it, so every move is the first move of the
 * same fleet and nothing (an old copy, gc, rows written by an earlier run) carries over. The floor
 * restores into a freshly created empty database. The runs alternate which side goes first.
 *
 * The move: a writer (the application) inserts into the shard one row per statement, routed by
 * ShardMap and following the move on SQLSTATE SC100 as docs/moves.md tells applications to, from
 * before the move starts until after it ends; moveShard() runs in-process and its durationMs and
 * writeBlockedMs are the figures. After each run every id the writer had acknowledged must be on
 * the target, the target must hold exactly the loaded rows plus those, and no replication object
 * may be left behind; otherwise the run fails, so a fast run that lost rows never counts.
 *
 * pg_dump refuses servers newer than itself: the floor runs only with a pg_dump at least as new as
 * the server (Debian's 15 here; the embedded 18 binaries ship none). Elsewhere the move is reported
 * without a ratio.
 */
import { readFile, writeFile } from 'node:fs/promises';
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
  required,
  resetDatabases,
  round,
  roundOrder,
  summarize,
  textTable,
  verdict,
} from './lib.js';
import { floorTools, replicationObjectsLeft, startWriter, timeDumpRestore, underWriter } from './moving.js';

export const description = 'online move of one shard (--rows photos) under a writer vs pg_dump -n | psql';

export const BASE_DATABASE = 'bench_move_base';
const DATABASE = 'bench_move';
const DUMP_DATABASE = 'bench_move_dump';
/** The fleet: 8 shards over 2 hosts, 0-3 on pg1 and 4-7 on pg2; shard 1 moves to pg2. */
export const SHARDS = 8;
export const HOSTS = 2;
export const SHARD = 1;
export const TARGET_HOST = 'pg2';
const TARGET_BLOCKED_MS = 1000;
const TARGET_RATIO = 2;

/** @typedef {Awaited<ReturnType<typeof run>>} Result */

/**
 * @param {import('./run.js').BenchContext} ctx
 * @param {string} major
 */
export async function run(ctx, major) {
  const { options } = ctx;
  const { base, fleet, schema, source, target, serverVersion } = await oneShardFleet(ctx, major, 'move-shard', {
    database: DATABASE,
    baseDatabase: BASE_DATABASE,
  });
  const floor = floorTools(major, serverVersion, options);
  if (floor.skipped) log(`move-shard on PostgreSQL ${serverVersion}: no floor, ${floor.skipped}`);

  log(
    `move-shard on PostgreSQL ${serverVersion}: loading ${formatCount(options.rows)} rows into ${schema}.photos on ${source.name} (untimed)`,
  );
  await buildBase(base, source, schema, options.rows, BASE_DATABASE, options.captionBytes);
  const [size] = await source.query(
    BASE_DATABASE,
    `select pg_table_size($1::regclass)::float8 as heap, pg_indexes_size($1::regclass)::float8 as indexes`,
    [`${ident(schema)}.photos`],
  );
  const tableBytes = Number(size?.heap);
  const indexBytes = Number(size?.indexes);
  log(
    `  ${schema}.photos: ${formatCount(Math.round(tableBytes / 2 ** 20))} MiB of heap, ${formatCount(Math.round(indexBytes / 2 ** 20))} MiB of index`,
  );
  // What every run starts from; each move rewrites the file.
  const initialMap = await readFile(fleet.configFile, 'utf8');

  const moves = [];
  const dumps = [];
  for (let turn = 0; turn < options.runs; turn++) {
    for (const who of roundOrder(floor.skipped ? ['move'] : ['move', 'pg_dump'], turn)) {
      await resetDatabases(fleet.hosts, DATABASE, { template: BASE_DATABASE });
      await writeFile(fleet.configFile, initialMap);
      if (who === 'move') {
        const moved = await timeMove(fleet, {
          source,
          target,
          schema,
          rows: options.rows,
          copyChunkRows: options.copyChunkRows,
        });
        moves.push(moved);
        log(
          `  run ${turn + 1}/${options.runs}: move ${formatMs(moved.durationMs)}, writes blocked ${formatMs(moved.writeBlockedMs)}, ` +
            `longest gap between acknowledged writes ${formatMs(moved.longestGapMs)}; ${formatCount(moved.acknowledged)} writes acknowledged ` +
            `(${formatCount(moved.onSource)} on ${source.name}, ${formatCount(moved.onTarget)} on ${target.name}), ${formatCount(moved.fenceErrors)} fence errors`,
        );
      } else {
        dumps.push(
          await timeDump({ source, target, schema, rows: options.rows, pgDump: floor.pgDump, psql: options.psql }),
        );
        log(`  run ${turn + 1}/${options.runs}: pg_dump | psql ${formatMs(dumps.at(-1))}`);
      }
    }
  }

  const moveMs = summarize(moves.map((m) => m.durationMs));
  const writeBlockedMs = summarize(moves.map((m) => required(m.writeBlockedMs, "a move's write-blocked time")));
  const pgDumpMs = floor.skipped ? null : summarize(dumps);
  const measuredRatio = pgDumpMs ? ratio(moveMs.median, pgDumpMs.median) : null;
  return {
    benchmark: 'move-shard',
    postgres: serverVersion,
    shards: SHARDS,
    hosts: HOSTS,
    shard: SHARD,
    source: source.name,
    target: target.name,
    mode: 'online',
    rows: options.rows,
    captionBytes: options.captionBytes,
    copyChunkRows: options.copyChunkRows,
    tableBytes,
    indexBytes,
    moveMs,
    writeBlockedMs,
    longestGapMs: summarize(moves.map((m) => m.longestGapMs)),
    pgDumpMs,
    pgDumpVersion: floor.version,
    floorSkipped: floor.skipped,
    ratio: measuredRatio,
    runs: moves,
    targets: {
      // Per cut-over: a single run over the limit is a miss, whatever the median says.
      writeBlocked: {
        wanted: `< ${TARGET_BLOCKED_MS} ms in every run`,
        got: writeBlockedMs.max,
        met: writeBlockedMs.max < TARGET_BLOCKED_MS,
      },
      vsPgDump: {
        wanted: `≤ ${TARGET_RATIO}x`,
        got: measuredRatio,
        met: measuredRatio === null ? null : measuredRatio <= TARGET_RATIO,
      },
    },
  };
}

/** @typedef {import('./lib.js').Host} Host */
/** @typedef {import('./lib.js').Fleet} Fleet */
/**
 * The one-shard fleet of move-shard, move-resume and move-copy-parallel: SHARDS shards over HOSTS
 * hosts in `database` and in its template `baseDatabase` (`name` and `${name}-base`), shard SHARD
 * on its source and moved to TARGET_HOST.
 * @param {import('./run.js').BenchContext} ctx
 * @param {string} major
 * @param {string} name
 * @param {{ database: string, baseDatabase: string }} databases
 */
export async function oneShardFleet(ctx, major, name, { database, baseDatabase }) {
  const base = await ctx.fleet(`${name}-base`, major, { database: baseDatabase, hostCount: HOSTS, shards: SHARDS });
  const fleet = await ctx.fleet(name, major, { database, hostCount: HOSTS, shards: SHARDS });
  const config = await loadConfig(fleet.configFile);
  const schema = shardSchemaName(config, SHARD);
  const source = fleet.hosts.find((h) => h.name === hostForShard(config, SHARD)?.name);
  const target = fleet.hosts.find((h) => h.name === TARGET_HOST);
  if (!source || !target || source === target)
    throw new Error(`the fleet must hold shard ${SHARD} on a host other than ${TARGET_HOST}`);
  return { base, fleet, schema, source, target, serverVersion: await source.serverVersion() };
}

/**
 * What is wrong with the moved shard's photos on the target: acknowledged rows missing, or a total
 * other than the loaded rows plus the acknowledged ones.
 * @param {Host} target
 * @param {string} database
 * @param {string} schema
 * @param {number} rows
 * @param {string[]} ids
 */
export async function rowsProblems(target, database, schema, rows, ids) {
  const problems = [];
  const photos = `${ident(schema)}.photos`;
  const [found] = await target.query(
    database,
    `select count(*)::int as n from unnest($1::bigint[]) a(id) join ${photos} p using (id)`,
    [ids],
  );
  if (found?.n !== ids.length)
    problems.push(`${ids.length - (found?.n ?? 0)} of ${ids.length} acknowledged rows are missing on ${target.name}`);
  const [total] = await target.query(database, `select count(*)::int as n from ${photos}`);
  if (total?.n !== rows + ids.length)
    problems.push(`${target.name} holds ${total?.n} photos rows, expected ${rows} loaded + ${ids.length} acknowledged`);
  return problems;
}

/** @typedef {{ source: Host, target: Host, schema: string, rows: number }} Scenario */
/** @typedef {Awaited<ReturnType<typeof timeMove>>} Moved */

/**
 * The base fleet, once, untimed: init on both hosts, the rows in the shard's photos, VACUUM ANALYZE
 * (move-resume.js builds its own the same way, in its own database).
 * @param {Fleet} base
 * @param {Host} source
 * @param {string} schema
 * @param {number} rows
 * @param {string} [database]
 * @param {number} [captionBytes] each caption padded to this many bytes (--caption-bytes; 1: not padded)
 */
export async function buildBase(base, source, schema, rows, database = BASE_DATABASE, captionBytes = 1) {
  await initFleet(base);
  await source.query(
    database,
    `insert into ${ident(schema)}.photos (user_id, image_url, caption)
     select g % 10000, 'https://cdn.example.com/p/' || g || '.jpg',
            rpad('caption ' || g, greatest($2::int, length('caption ' || g)), ' lorem ipsum dolor sit amet')
       from generate_series(1, $1::int) g`,
    [rows, captionBytes],
  );
  await source.query(database, `vacuum analyze ${ident(schema)}.photos`);
  const [row] = await source.query(database, `select count(*)::int as n from ${ident(schema)}.photos`);
  if (row?.n !== rows) throw new Error(`${schema}.photos holds ${row?.n} rows after the load, expected ${rows}`);
}

/**
 * One online move under the writer, checked afterwards.
 * @param {Fleet} fleet
 * @param {Scenario & { copyChunkRows: number }} scenario
 */
async function timeMove(fleet, { source, target, schema, rows, copyChunkRows }) {
  const config = await loadConfig(fleet.configFile);
  const writer = startShardWriter(await ShardMap.load(fleet.configFile), schema);
  /** @type {{ step: string, atMs: number }[]} */
  const steps = [];
  const { result, written } = await underWriter(writer, () => {
    const started = performance.now();
    return moveShard(config, SHARD, target.name, {
      configFile: fleet.configFile,
      copyChunkRows,
      onStep: (step) => steps.push({ step, atMs: round(performance.now() - started, 0) }),
    });
  });
  const ids = required(written.acks.get(SHARD), `the writer's acknowledged writes to shard ${SHARD}`);
  const moved = {
    durationMs: result.durationMs,
    writeBlockedMs: result.writeBlockedMs,
    longestGapMs: round(written.longestGapMs),
    acknowledged: ids.length,
    onSource: written.byHost.get(source.name) ?? 0,
    onTarget: written.byHost.get(target.name) ?? 0,
    fenceErrors: written.fenceErrors,
    rowsMoved: result.rowsMoved,
    steps,
  };
  await checkMove(fleet, { source, target, schema, rows, result, moved, ids });
  return moved;
}

/**
 * The application: inserts into the shard's photos one row per statement, as fast as acknowledged; the ids are kept.
 * @param {import('../dist/index.js').ShardMap} map
 * @param {string} schema
 */
export function startShardWriter(map, schema) {
  const insert = `insert into ${ident(schema)}.photos (user_id, image_url, caption) values ($1, $2, $3) returning id`;
  return startWriter(map, {
    shards: [SHARD],
    write: async (client, _shard, n) =>
      /** @type {string} */ (
        (await client.query(insert, [n % 10000, `https://cdn.example.com/p/w${n}.jpg`, `written during the move ${n}`]))
          .rows[0].id
      ),
  });
}

/**
 * @param {Fleet} fleet
 * @param {Scenario & {
 *   result: import('../dist/index.js').MoveResult,
 *   moved: { onSource: number, onTarget: number },
 *   ids: string[],
 * }} outcome
 */
async function checkMove(fleet, { source, target, schema, rows, result, moved, ids }) {
  const problems = [];
  if (result.outcome !== 'moved') problems.push(`the move ended ${result.outcome}`);
  if (typeof result.writeBlockedMs !== 'number') problems.push('the move reported no write-blocked time');
  const owner = (await ShardMap.load(fleet.configFile)).hostForShard(SHARD).name;
  if (owner !== target.name) problems.push(`the map puts shard ${SHARD} on ${owner}, expected ${target.name}`);
  // A writer that never wrote on one side did not write through the cut-over.
  if (moved.onSource === 0 || moved.onTarget === 0) {
    problems.push(
      `the writer was acknowledged ${moved.onSource} inserts on ${source.name} and ${moved.onTarget} on ${target.name}; it must write on both`,
    );
  }
  problems.push(...(await rowsProblems(target, DATABASE, schema, rows, ids)));
  // Verified after the fence: the loaded rows and exactly the writes the source had acknowledged.
  if (result.rowsMoved !== String(rows + moved.onSource)) {
    problems.push(
      `the move verified ${result.rowsMoved} rows, expected ${rows} loaded + ${moved.onSource} acknowledged by ${source.name}`,
    );
  }
  for (const host of [source, target]) {
    const left = await replicationObjectsLeft(host, DATABASE);
    if (left !== 0)
      problems.push(`${host.name}: ${left} replication objects (publication, subscription, slot) left behind`);
  }
  if (problems.length > 0)
    throw new Error(`the move did not leave what it should have:\n  - ${problems.join('\n  - ')}`);
}

/**
 * The floor, from the source's fresh copy into a new empty database on the target host; checked.
 * @param {Scenario & { pgDump: string, psql: string }} scenario
 */
async function timeDump({ source, target, schema, rows, pgDump, psql }) {
  const ms = await timeDumpRestore({
    source,
    sourceDb: DATABASE,
    target,
    targetDb: DUMP_DATABASE,
    schemas: [schema],
    pgDump,
    psql,
  });
  const [row] = await target.query(DUMP_DATABASE, `select count(*)::int as n from ${ident(schema)}.photos`);
  if (row?.n !== rows) throw new Error(`pg_dump | psql left ${row?.n} photos rows on ${target.name}, expected ${rows}`);
  return ms;
}

const HEADERS = ['PostgreSQL', 'shard moved', 'move-shard (online)', 'pg_dump -n | psql (floor)', 'ratio', 'target'];
const CUTOVER_HEADERS = [
  'PostgreSQL',
  'writes blocked',
  'target',
  'longest gap between acked writes',
  'writes acked per run',
  'fence errors per run',
];

/** @param {Result[]} results */
function rows(results) {
  return results.map((r) => [
    r.postgres,
    `shard ${r.shard}, ${formatCount(r.rows)} photos rows, ${r.source} → ${r.target}`,
    formatSample(r.moveMs),
    r.pgDumpMs ? formatSample(r.pgDumpMs) : `n/a (pg_dump ${r.pgDumpVersion ?? 'missing'})`,
    r.ratio === null ? 'n/a' : `${r.ratio.toFixed(2)}x`,
    `≤ ${TARGET_RATIO}x: ${r.targets.vsPgDump.met === null ? 'not measured' : verdict(r.targets.vsPgDump.met)}`,
  ]);
}

/** @param {Result[]} results */
function cutoverRows(results) {
  return results.map((r) => [
    r.postgres,
    formatSample(r.writeBlockedMs),
    `< ${TARGET_BLOCKED_MS / 1000} s every run: ${verdict(r.targets.writeBlocked.met)}`,
    formatSample(r.longestGapMs),
    r.runs.map((m) => formatCount(m.acknowledged)).join(' / '),
    r.runs.map((m) => formatCount(m.fenceErrors)).join(' / '),
  ]);
}

/** @param {Result[]} results */
function skippedNotes(results) {
  return results.filter((r) => r.floorSkipped).map((r) => `PostgreSQL ${r.postgres}: no floor, ${r.floorSkipped}.`);
}

/**
 * "median (range) of 3 runs each, interleaved": what a table's figures are.
 * @param {Result[]} results
 */
function sampleNote(results) {
  const runs = itemAt(results, 0).moveMs.runs.length;
  const withFloor = results.some((r) => r.pgDumpMs);
  return `median (range) of ${runs} run${runs === 1 ? '' : 's'}${withFloor ? ' each, interleaved with the floor' : ''}`;
}

/** @param {Result} result */
export function table(result) {
  return [
    `move-shard: ${sampleNote([result])}; a writer inserts into the shard throughout every move`,
    textTable(HEADERS, rows([result])),
    '',
    "cut-over: writes blocked = from the fence until the map named the target (moveShard); gap = the writer's own view",
    textTable(CUTOVER_HEADERS, cutoverRows([result])),
    ...skippedNotes([result]).map((note) => `\n${note}`),
  ].join('\n');
}

/** @param {Result[]} results */
export function markdown(results) {
  const note = sampleNote(results);
  return [
    `${note.charAt(0).toUpperCase()}${note.slice(1)}; every run on a fresh copy of the same fleet, a writer inserting into the shard throughout every move.`,
    '',
    markdownTable(HEADERS, rows(results)),
    '',
    "Cut-over: writes blocked as moveShard reports it (from the fence until the map named the target), the longest wait between two acknowledged inserts as the writer saw it, and the writer's acknowledged inserts and fence errors (SQLSTATE SC100) per run:",
    '',
    markdownTable(CUTOVER_HEADERS, cutoverRows(results)),
    ...skippedNotes(results).flatMap((note) => ['', note]),
  ].join('\n');
}
