/**
 * move-resume: one shard of --rows photos rows moved online under a writer, killed with SIGKILL once
 * half of its chunks are committed and finished by `--resume`, against an uninterrupted move of the
 * same shard (issue 42: "a resume after a kill at half the copy takes ≤ 0.6x of an uninterrupted
 * move").
 *
 * The fleet is move-shard's (8 shards over 2 hosts, shard 1 to pg2), built once into a template
 * database; every run starts from a fresh copy of it and from the config file as init left it. The
 * table is copied in chunks of min(1,000,000, rows / 8) rows (the library's default is 1,000,000:
 * at 8.5M rows about 9 chunks), so that even a small run has chunks to resume from.
 *
 * The interrupted side: the CLI (`move-shard 1 --to pg2`, a child process) kills itself with SIGKILL
 * right after its (chunks / 2)-th chunk committed (SHARDCTL_FAULT_AFTER_CHUNKS, the tests' fault
 * hook: a deterministic point, where a timer would land anywhere in a chunk); then moveShard()
 * resumes it in-process. The writer runs through both. Figures: the resumed run alone and the
 * killed run plus it, each against the uninterrupted move's durationMs.
 *
 * Checked in every run, or it fails: the killed run committed half of the chunks; the resume
 * copied exactly the chunks the killed run had not (MoveResult.chunks, from the chunk records),
 * copied none again (the writer only inserts: its rows are in the last, open-ended chunk), and
 * streamed fewer bytes than the uninterrupted move; the target holds the loaded rows plus every
 * acknowledged write; the target's photos have no more dead rows than after the uninterrupted move;
 * no replication object is left.
 */
import { readFile, writeFile } from 'node:fs/promises';
import { loadConfig, moveShard, ShardMap } from '../dist/index.js';
import {
  CLI,
  formatCount,
  formatMs,
  formatSample,
  ident,
  itemAt,
  log,
  markdownTable,
  ratio,
  required,
  resetDatabases,
  round,
  roundOrder,
  runProcess,
  summarize,
  textTable,
  verdict,
} from './lib.js';
import { replicationObjectsLeft, underWriter } from './moving.js';
import { buildBase, oneShardFleet, rowsProblems, SHARD, startShardWriter } from './move-shard.js';

export const description =
  'a move killed (SIGKILL) at half its copy and resumed vs an uninterrupted move (--rows photos)';

const BASE_DATABASE = 'bench_resume_base';
const DATABASE = 'bench_resume';
/** The library's default chunk size (DEFAULT_COPY_CHUNK_ROWS). */
const LIBRARY_CHUNK_ROWS = 1_000_000;
const TARGET_RATIO = 0.6;

/** @typedef {Awaited<ReturnType<typeof run>>} Result */
/** @typedef {import('./lib.js').Host} Host */
/** @typedef {import('./lib.js').Fleet} Fleet */

/**
 * @param {import('./run.js').BenchContext} ctx
 * @param {string} major
 */
export async function run(ctx, major) {
  const { options } = ctx;
  const { base, fleet, schema, source, target, serverVersion } = await oneShardFleet(ctx, major, 'move-resume', {
    database: DATABASE,
    baseDatabase: BASE_DATABASE,
  });
  const chunkRows = Math.min(LIBRARY_CHUNK_ROWS, Math.ceil(options.rows / 8));
  log(
    `move-resume on PostgreSQL ${serverVersion}: loading ${formatCount(options.rows)} rows into ${schema}.photos on ${source.name} (untimed); chunks of ${formatCount(chunkRows)} rows`,
  );
  await buildBase(base, source, schema, options.rows, BASE_DATABASE, options.captionBytes);
  const initialMap = await readFile(fleet.configFile, 'utf8');
  const scenario = { fleet, source, target, schema, rows: options.rows, chunkRows };

  /** @type {Awaited<ReturnType<typeof uninterrupted>>[]} */
  const wholes = [];
  /** @type {Awaited<ReturnType<typeof killedAndResumed>>[]} */
  const resumes = [];
  for (let turn = 0; turn < options.runs; turn++) {
    for (const who of roundOrder(['whole', 'resumed'], turn)) {
      await resetDatabases(fleet.hosts, DATABASE, { template: BASE_DATABASE });
      await writeFile(fleet.configFile, initialMap);
      if (who === 'whole') {
        wholes.push(await uninterrupted(scenario));
        const w = itemAt(wholes, wholes.length - 1);
        log(
          `  run ${turn + 1}/${options.runs}: uninterrupted move ${formatMs(w.durationMs)}, ${formatCount(w.chunks)} chunks, ` +
            `${formatCount(w.bytes)} bytes streamed, ${formatCount(w.deadRows)} dead rows on ${target.name}`,
        );
      } else {
        resumes.push(await killedAndResumed(scenario));
        const r = itemAt(resumes, resumes.length - 1);
        log(
          `  run ${turn + 1}/${options.runs}: killed after ${formatMs(r.killedMs)} with ${r.copiedBefore}/${r.chunks} chunks committed; ` +
            `resume ${formatMs(r.resumeMs)} (${r.copiedByResume} chunks copied, ${r.recopied} again, ${r.fromLog} settled from the log, ${r.compared} read; ${formatCount(r.bytes)} bytes streamed), ` +
            `${formatCount(r.deadRows)} dead rows on ${target.name}`,
        );
      }
    }
  }
  const maxDead = Math.max(...wholes.map((w) => w.deadRows));
  const moreDead = resumes.filter((r) => r.deadRows > maxDead);
  if (moreDead.length > 0)
    throw new Error(
      `a resumed move left ${moreDead.map((r) => r.deadRows).join(', ')} dead rows on ${target.name}, the uninterrupted moves at most ${maxDead}`,
    );

  const wholeMs = summarize(wholes.map((w) => w.durationMs));
  const resumeMs = summarize(resumes.map((r) => r.resumeMs));
  const killedPlusResumeMs = summarize(resumes.map((r) => r.killedMs + r.resumeMs));
  const measured = ratio(resumeMs.median, wholeMs.median);
  return {
    benchmark: 'move-resume',
    postgres: serverVersion,
    shard: SHARD,
    source: source.name,
    target: target.name,
    rows: options.rows,
    captionBytes: options.captionBytes,
    chunkRows,
    wholeMs,
    resumeMs,
    killedPlusResumeMs,
    ratio: measured,
    wholes,
    resumes,
    targets: {
      resumeVsWhole: { wanted: `≤ ${TARGET_RATIO}x`, got: measured, met: measured <= TARGET_RATIO },
    },
  };
}

/**
 * @typedef {{ fleet: Fleet, source: Host, target: Host, schema: string, rows: number, chunkRows: number }} Scenario
 */

/**
 * The pre-fence checksums' ms as the move's notice reports them ("checksummed before the fence in
 * … ms"), summed over its waves; and whether a table's figures came from the copy.
 */
function preFence() {
  let ms = 0;
  let fromCopy = false;
  return {
    /** @param {string} message */
    onNotice: (message) => {
      const found = /checksummed before the fence in (\d+) ms/.exec(message);
      if (found) ms += Number(found[1]);
      if (/from the copy's chunk checksums/.test(message)) fromCopy = true;
    },
    figures: () => ({ preFenceMs: ms, preFenceFromCopy: fromCopy }),
  };
}

/**
 * The last `copy` progress event's bytes (streamed by this run; chunks kept from an earlier run are not counted).
 * @returns {{ onProgress: (event: import('../dist/index.js').MoveProgressEvent) => void, bytes: () => number }}
 */
function streamedBytes() {
  let bytes = 0;
  return {
    onProgress: (event) => {
      if (event.kind === 'copy') bytes = event.bytes;
    },
    bytes: () => bytes,
  };
}

/**
 * The move never interrupted, in-process under the writer.
 * @param {Scenario} scenario
 */
async function uninterrupted(scenario) {
  const { fleet, target, schema, chunkRows } = scenario;
  const config = await loadConfig(fleet.configFile);
  const writer = startShardWriter(await ShardMap.load(fleet.configFile), schema);
  const streamed = streamedBytes();
  const checksums = preFence();
  const { result, written } = await underWriter(writer, () =>
    moveShard(config, SHARD, target.name, {
      configFile: fleet.configFile,
      copyChunkRows: chunkRows,
      onProgress: streamed.onProgress,
      onNotice: checksums.onNotice,
    }),
  );
  const ids = required(written.acks.get(SHARD), `the writer's acknowledged writes to shard ${SHARD}`);
  await checkMoved(scenario, result, ids);
  const chunks = required(result.chunks, "the move's chunk counts").copied;
  return {
    durationMs: result.durationMs,
    chunks,
    bytes: streamed.bytes(),
    ...checksums.figures(),
    deadRows: await deadRows(target, schema),
    acknowledged: ids.length,
  };
}

/**
 * The CLI killed at half the copy, then the move resumed in-process; the writer through both.
 * @param {Scenario} scenario
 */
async function killedAndResumed(scenario) {
  const { fleet, target, schema, rows, chunkRows } = scenario;
  const writer = startShardWriter(await ShardMap.load(fleet.configFile), schema);
  const streamed = streamedBytes();
  const checksums = preFence();
  // Cut at the key's statistics (the table is analyzed): rows / chunkRows chunks; cut by reading
  // the keys, one more (every chunkRows-th key a bound, the last chunk open-ended).
  const plans = [Math.ceil(rows / chunkRows), Math.floor(rows / chunkRows) + 1];
  const half = Math.max(1, Math.floor(Math.ceil(rows / chunkRows) / 2));
  const { result, written } = await underWriter(writer, async () => {
    const started = performance.now();
    const killed = await runProcess(
      process.execPath,
      [
        CLI,
        'move-shard',
        String(SHARD),
        '--to',
        target.name,
        '--copy-chunk-rows',
        String(chunkRows),
        '--yes',
        '--json',
        '-c',
        fleet.configFile,
      ],
      { env: { ...process.env, NO_COLOR: '1', SHARDCTL_FAULT_AFTER_CHUNKS: String(half) } },
    );
    const killedMs = performance.now() - started;
    // A child killed by a signal closes with code 128 (runProcess).
    if (killed.code !== 128)
      throw new Error(`the move was to be killed after ${half} chunks; it exited ${killed.code}:\n${killed.stderr}`);
    const records = await chunkRecords(target, schema);
    const config = await loadConfig(fleet.configFile);
    const resumeStarted = performance.now();
    const resumed = await moveShard(config, SHARD, undefined, {
      configFile: fleet.configFile,
      resume: true,
      copyChunkRows: chunkRows,
      onProgress: streamed.onProgress,
      onNotice: checksums.onNotice,
    });
    return { killedMs, records, resumed, resumeWallMs: performance.now() - resumeStarted };
  });
  const { killedMs, records, resumed } = result;
  const ids = required(written.acks.get(SHARD), `the writer's acknowledged writes to shard ${SHARD}`);
  await checkMoved(scenario, resumed, ids);
  const copiedBefore = records.filter((r) => r.copied).length;
  const counts = required(resumed.chunks, "the resumed move's chunk counts");
  const problems = [];
  if (!plans.includes(records.length))
    problems.push(`the killed run planned ${records.length} chunks, expected ${plans.join(' or ')}`);
  if (copiedBefore !== half) problems.push(`the killed run committed ${copiedBefore} chunks, expected ${half}`);
  if (counts.copied !== records.length - copiedBefore)
    problems.push(`the resume copied ${counts.copied} chunks, expected the ${records.length - copiedBefore} left`);
  if (counts.recopied !== 0)
    problems.push(`the resume copied ${counts.recopied} chunks again (the writer only inserts)`);
  if (problems.length > 0)
    throw new Error(`the resumed move did not copy only what was left:\n  - ${problems.join('\n  - ')}`);
  return {
    killedMs: round(killedMs, 0),
    resumeMs: resumed.durationMs,
    chunks: records.length,
    copiedBefore,
    bytesBefore: records.reduce((sum, r) => sum + (r.bytes ?? 0), 0),
    copiedByResume: counts.copied,
    recopied: counts.recopied,
    fromLog: counts.fromLog ?? 0,
    compared: counts.compared ?? 0,
    bytes: streamed.bytes(),
    ...checksums.figures(),
    deadRows: await deadRows(target, schema),
    acknowledged: ids.length,
  };
}

/**
 * The photos table's chunk records on the target (between the kill and the resume).
 * @param {Host} target
 * @param {string} schema
 */
async function chunkRecords(target, schema) {
  const records = await target.query(
    DATABASE,
    `select chunk, copied, bytes::float8 as bytes from shardctl.move_chunks where table_name = $1 order by chunk`,
    [`${ident(schema)}.${ident('photos')}`],
  );
  return records.map((r) => ({
    chunk: Number(r.chunk),
    copied: r.copied === true,
    bytes: r.bytes === null ? null : Number(r.bytes),
  }));
}

/**
 * Dead rows of the target's photos, from a fresh VACUUM-free count: the statistics flushed first.
 * @param {Host} target
 * @param {string} schema
 */
async function deadRows(target, schema) {
  // The backends that wrote report their counts when they go idle; a second is enough here.
  await new Promise((resolve) => setTimeout(resolve, 1500));
  const [row] = await target.query(
    DATABASE,
    `select n_dead_tup::int as n from pg_stat_user_tables where schemaname = $1 and relname = 'photos'`,
    [schema],
  );
  return Number(row?.n ?? 0);
}

/**
 * The move's outcome, the rows on the target and what it left behind.
 * @param {Scenario} scenario
 * @param {import('../dist/index.js').MoveResult} result
 * @param {string[]} ids
 */
async function checkMoved({ source, target, schema, rows }, result, ids) {
  const problems = [];
  if (result.outcome !== 'moved') problems.push(`the move ended ${result.outcome}`);
  problems.push(...(await rowsProblems(target, DATABASE, schema, rows, ids)));
  for (const host of [source, target]) {
    const left = await replicationObjectsLeft(host, DATABASE);
    if (left !== 0) problems.push(`${host.name}: ${left} replication objects left behind`);
  }
  if (problems.length > 0)
    throw new Error(`the move did not leave what it should have:\n  - ${problems.join('\n  - ')}`);
}

const HEADERS = [
  'PostgreSQL',
  'shard moved',
  'uninterrupted move',
  'resume after a kill at half',
  'killed run + resume',
  'resume / uninterrupted',
  'target',
];
const DETAIL_HEADERS = [
  'PostgreSQL',
  'chunks',
  'committed before the kill',
  'copied by the resume',
  'chunks copied before: settled from the log / read',
  'bytes streamed (uninterrupted / resume)',
  'dead rows (uninterrupted / resumed)',
  'pre-fence checksums (uninterrupted / resumed)',
];

/** @param {Result[]} results */
function rows(results) {
  return results.map((r) => [
    r.postgres,
    `shard ${r.shard}, ${formatCount(r.rows)} photos rows (chunks of ${formatCount(r.chunkRows)}), ${r.source} → ${r.target}`,
    formatSample(r.wholeMs),
    formatSample(r.resumeMs),
    formatSample(r.killedPlusResumeMs),
    `${r.ratio.toFixed(2)}x`,
    `≤ ${TARGET_RATIO}x: ${verdict(r.targets.resumeVsWhole.met)}`,
  ]);
}

/** @param {Result[]} results */
function detailRows(results) {
  return results.map((r) => [
    r.postgres,
    String(itemAt(r.resumes, 0).chunks),
    r.resumes.map((x) => x.copiedBefore).join(' / '),
    r.resumes.map((x) => x.copiedByResume).join(' / '),
    r.resumes.map((x) => `${x.fromLog} / ${x.compared}`).join(', '),
    `${formatCount(summarize(r.wholes.map((w) => w.bytes)).median)} / ${formatCount(summarize(r.resumes.map((x) => x.bytes)).median)}`,
    `${r.wholes.map((w) => formatCount(w.deadRows)).join(' / ')} — ${r.resumes.map((x) => formatCount(x.deadRows)).join(' / ')}`,
    `${r.wholes.map(preFenceText).join(' / ')} — ${r.resumes.map(preFenceText).join(' / ')}`,
  ]);
}

/** @param {{ preFenceMs: number, preFenceFromCopy: boolean }} run */
function preFenceText(run) {
  return `${formatMs(run.preFenceMs)}${run.preFenceFromCopy ? ' (from the copy)' : ' (read whole)'}`;
}

/** @param {Result[]} results */
function sampleNote(results) {
  const runs = itemAt(results, 0).wholeMs.runs.length;
  return `median (range) of ${runs} run${runs === 1 ? '' : 's'} each, interleaved; a writer inserts into the shard throughout`;
}

/** @param {Result} result */
export function table(result) {
  return [
    `move-resume: ${sampleNote([result])}`,
    textTable(HEADERS, rows([result])),
    '',
    textTable(DETAIL_HEADERS, detailRows([result])),
  ].join('\n');
}

/** @param {Result[]} results */
export function markdown(results) {
  const note = sampleNote(results);
  return [
    `${note.charAt(0).toUpperCase()}${note.slice(1)}; every run on a fresh copy of the same fleet.`,
    '',
    markdownTable(HEADERS, rows(results)),
    '',
    markdownTable(DETAIL_HEADERS, detailRows(results)),
  ].join('\n');
}
