/**
 * move-copy-parallel: the copy of one shard of --rows photos rows (move-shard's fleet) with
 * `--copy-parallel` 1, 2 and 4, against the hosts' own COPY of the same table, the physical floor
 * here: `psql -c "COPY … TO STDOUT (FORMAT binary)" | psql -c "COPY … FROM STDIN (FORMAT binary)"`
 * into a table of the same columns without constraints or indexes, then (timed apart) its primary
 * key built, as the move builds it after its COPY (issue 42).
 *
 * The move's copy is its `prepared → target-created` span (onStep): the target's schema, the
 * publication, the slot and the chunked copy with its per-chunk checksums, the index builds and the
 * final flush; no writer, so the figure is the copy's alone. Chunks of min(1,000,000, rows / 8)
 * rows, so that four pairs have chunks to share at any size. Every run starts from a fresh copy of
 * the template database on both hosts; the sides alternate in order from run to run. Each move
 * must end `moved` with every row on the target, and the floor must load every row.
 */
import { readFile, writeFile } from 'node:fs/promises';
import { loadConfig, moveShard } from '../dist/index.js';
import {
  formatCount,
  formatMs,
  formatSample,
  ident,
  itemAt,
  log,
  markdownTable,
  resetDatabases,
  round,
  roundOrder,
  summarize,
  textTable,
  timeCommand,
} from './lib.js';
import { buildBase, oneShardFleet, SHARD } from './move-shard.js';

export const description = 'copy of one shard (--rows photos) with --copy-parallel 1, 2, 4 vs COPY TO | COPY FROM';

const BASE_DATABASE = 'bench_copypar_base';
const DATABASE = 'bench_copypar';
const FLOOR_DATABASE = 'bench_copypar_floor';
const LIBRARY_CHUNK_ROWS = 1_000_000;
const PARALLEL = [1, 2, 4];
const FLOOR = 'floor';
const COPY_PIPE_SCRIPT = [
  'set -o pipefail',
  'psql=$1; out=$2; in=$3',
  'PGHOST=$FROM_PGHOST PGPORT=$FROM_PGPORT PGUSER=$FROM_PGUSER PGPASSWORD=$FROM_PGPASSWORD PGDATABASE=$FROM_PGDATABASE "$psql" -X -q -v ON_ERROR_STOP=1 -c "$out" |' +
    ' PGHOST=$TO_PGHOST PGPORT=$TO_PGPORT PGUSER=$TO_PGUSER PGPASSWORD=$TO_PGPASSWORD PGDATABASE=$TO_PGDATABASE "$psql" -X -q -v ON_ERROR_STOP=1 -c "$in" >/dev/null',
].join('\n');
const LIBPQ_SETTINGS = ['PGHOST', 'PGPORT', 'PGUSER', 'PGPASSWORD', 'PGDATABASE'];

/** @typedef {Awaited<ReturnType<typeof run>>} Result */
/** @typedef {import('./lib.js').Host} Host */

/**
 * @param {import('./run.js').BenchContext} ctx
 * @param {string} major
 */
export async function run(ctx, major) {
  const { options } = ctx;
  const { base, fleet, schema, source, target, serverVersion } = await oneShardFleet(ctx, major, 'move-copy-parallel', {
    database: DATABASE,
    baseDatabase: BASE_DATABASE,
  });
  const chunkRows = Math.min(LIBRARY_CHUNK_ROWS, Math.ceil(options.rows / 8));
  log(
    `move-copy-parallel on PostgreSQL ${serverVersion}: loading ${formatCount(options.rows)} rows into ${schema}.photos on ${source.name} (untimed); chunks of ${formatCount(chunkRows)} rows`,
  );
  await buildBase(base, source, schema, options.rows, BASE_DATABASE, options.captionBytes);
  const [size] = await source.query(BASE_DATABASE, `select pg_table_size($1::regclass)::float8 as bytes`, [
    `${ident(schema)}.photos`,
  ]);
  const tableBytes = Number(size?.bytes);
  const initialMap = await readFile(fleet.configFile, 'utf8');
  const columns = await columnDefinitions(source, schema);

  /** @type {Map<string, number[]>} */
  const copyMs = new Map([...PARALLEL.map(String), FLOOR].map((side) => [side, /** @type {number[]} */ ([])]));
  /** @type {number[]} */
  const keyMs = [];
  for (let turn = 0; turn < options.runs; turn++) {
    for (const side of roundOrder([...PARALLEL.map(String), FLOOR], turn)) {
      await resetDatabases(fleet.hosts, DATABASE, { template: BASE_DATABASE });
      await writeFile(fleet.configFile, initialMap);
      if (side === FLOOR) {
        const floor = await timeFloor({ source, target, schema, columns, rows: options.rows, psql: options.psql });
        copyMs.get(FLOOR)?.push(floor.copyMs);
        keyMs.push(floor.keyMs);
        log(
          `  run ${turn + 1}/${options.runs}: COPY TO | COPY FROM ${formatMs(floor.copyMs)}, primary key ${formatMs(floor.keyMs)}`,
        );
      } else {
        const ms = await timeMoveCopy({
          configFile: fleet.configFile,
          target,
          schema,
          rows: options.rows,
          chunkRows,
          parallel: Number(side),
        });
        copyMs.get(side)?.push(ms);
        log(`  run ${turn + 1}/${options.runs}: move's copy with --copy-parallel ${side}: ${formatMs(ms)}`);
      }
    }
  }
  const floorMs = summarize(copyMs.get(FLOOR) ?? []);
  const floorWithKeyMs = summarize((copyMs.get(FLOOR) ?? []).map((ms, i) => ms + itemAt(keyMs, i)));
  return {
    benchmark: 'move-copy-parallel',
    postgres: serverVersion,
    shard: SHARD,
    rows: options.rows,
    captionBytes: options.captionBytes,
    chunkRows,
    tableBytes,
    parallel: PARALLEL.map((n) => {
      const sample = summarize(copyMs.get(String(n)) ?? []);
      return {
        copyParallel: n,
        copyMs: sample,
        mbPerSecond: mbPerSecond(tableBytes, sample.median),
        vsFloor: round(sample.median / floorMs.median, 2),
      };
    }),
    floorMs,
    floorMbPerSecond: mbPerSecond(tableBytes, floorMs.median),
    floorWithKeyMs,
  };
}

/**
 * @param {number} bytes
 * @param {number} ms
 */
function mbPerSecond(bytes, ms) {
  return round(bytes / 1024 / 1024 / (ms / 1000), 1);
}

/**
 * The table's stored columns as `name type`, for the floor's bare table.
 * @param {Host} source
 * @param {string} schema
 */
async function columnDefinitions(source, schema) {
  const [row] = await source.query(
    BASE_DATABASE,
    `select string_agg(format('%I %s', attname, format_type(atttypid, atttypmod)), ', ' order by attnum) as columns
       from pg_attribute where attrelid = $1::regclass and attnum > 0 and not attisdropped and attgenerated = ''`,
    [`${ident(schema)}.photos`],
  );
  return String(row?.columns);
}

/**
 * One move with no writer; the ms from `prepared` to `target-created` (the copy).
 * @param {{ configFile: string, target: Host, schema: string, rows: number, chunkRows: number, parallel: number }} scenario
 */
async function timeMoveCopy({ configFile, target, schema, rows, chunkRows, parallel }) {
  /** @type {Map<string, number>} */
  const at = new Map();
  const result = await moveShard(await loadConfig(configFile), SHARD, target.name, {
    configFile,
    copyChunkRows: chunkRows,
    copyParallel: parallel,
    onStep: (step) => at.set(step, performance.now()),
  });
  if (result.outcome !== 'moved') throw new Error(`the move with --copy-parallel ${parallel} ended ${result.outcome}`);
  const [count] = await target.query(DATABASE, `select count(*)::int as n from ${ident(schema)}.photos`);
  if (count?.n !== rows) throw new Error(`the move left ${count?.n} photos rows on ${target.name}, expected ${rows}`);
  const from = at.get('prepared');
  const to = at.get('target-created');
  if (from === undefined || to === undefined) throw new Error('the move reported no prepared or target-created step');
  return round(to - from, 0);
}

/**
 * The floor: the table's rows through two psql processes into a bare table of a fresh database on
 * the target, then its primary key; both timed.
 * @param {{ source: Host, target: Host, schema: string, columns: string, rows: number, psql: string }} scenario
 */
async function timeFloor({ source, target, schema, columns, rows, psql }) {
  await target.resetDatabase(FLOOR_DATABASE);
  await target.query(FLOOR_DATABASE, `create table photos (${columns})`);
  /**
   * @param {string} prefix
   * @param {NodeJS.ProcessEnv} env
   */
  const side = (prefix, env) => Object.fromEntries(LIBPQ_SETTINGS.map((name) => [`${prefix}_${name}`, env[name]]));
  const env = {
    ...process.env,
    ...side('FROM', source.psqlEnv(DATABASE)),
    ...side('TO', target.psqlEnv(FLOOR_DATABASE)),
  };
  const out = `COPY ${ident(schema)}.photos TO STDOUT (FORMAT binary)`;
  const timed = await timeCommand(
    'bash',
    ['-c', COPY_PIPE_SCRIPT, 'bash', psql, out, 'COPY photos FROM STDIN (FORMAT binary)'],
    {
      env,
    },
  );
  if (timed.code !== 0) throw new Error(`COPY TO | COPY FROM exited ${timed.code}:\n${timed.stderr.slice(-2000)}`);
  const started = performance.now();
  await target.query(FLOOR_DATABASE, 'alter table photos add primary key (id)');
  const keyMs = performance.now() - started;
  const [count] = await target.query(FLOOR_DATABASE, 'select count(*)::int as n from photos');
  if (count?.n !== rows) throw new Error(`the floor loaded ${count?.n} rows, expected ${rows}`);
  return { copyMs: round(timed.ms, 0), keyMs: round(keyMs, 0) };
}

const HEADERS = ['PostgreSQL', 'table', 'copy', 'time', 'rate', 'vs COPY TO | COPY FROM'];

/** @param {Result[]} results */
function rows(results) {
  return results.flatMap((r) => {
    const table = `${formatCount(r.rows)} photos rows, ${formatCount(Math.round(r.tableBytes / 1024 / 1024))} MB (chunks of ${formatCount(r.chunkRows)})`;
    return [
      ...r.parallel.map((p) => [
        r.postgres,
        table,
        `move, --copy-parallel ${p.copyParallel}`,
        formatSample(p.copyMs),
        `${p.mbPerSecond} MB/s`,
        `${p.vsFloor.toFixed(2)}x`,
      ]),
      [
        r.postgres,
        table,
        'COPY TO | COPY FROM (no index)',
        formatSample(r.floorMs),
        `${r.floorMbPerSecond} MB/s`,
        '1.00x',
      ],
      [
        r.postgres,
        table,
        'COPY TO | COPY FROM, then the primary key',
        formatSample(r.floorWithKeyMs),
        `${mbPerSecond(r.tableBytes, r.floorWithKeyMs.median)} MB/s`,
        `${round(r.floorWithKeyMs.median / r.floorMs.median, 2).toFixed(2)}x`,
      ],
    ];
  });
}

/** @param {Result[]} results */
function sampleNote(results) {
  const runs = itemAt(results, 0).floorMs.runs.length;
  return `median (range) of ${runs} run${runs === 1 ? '' : 's'} each, interleaved; no writer; the move's copy is its prepared → target-created span`;
}

/** @param {Result} result */
export function table(result) {
  return [`move-copy-parallel: ${sampleNote([result])}`, textTable(HEADERS, rows([result]))].join('\n');
}

/** @param {Result[]} results */
export function markdown(results) {
  const note = sampleNote(results);
  return [`${note.charAt(0).toUpperCase()}${note.slice(1)}.`, '', markdownTable(HEADERS, rows(results))].join('\n');
}
