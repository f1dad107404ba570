/**
 * move-split: split a host (issue 7's batched moves; issue 21's CLI targets), on one PostgreSQL major.
 *
 * A fleet of 2 × --split-shards shards, all on pg1, pg2 new and empty (`shards: ""`), each shard
 * with --split-rows photos rows. The first --split-shards shards move online to pg2 in ONE
 * moveShards() call while a writer inserts into two of them (the first and the last moved),
 * following the move on SC100. Against the floor `pg_dump -n s0 -n s1 … | psql` of the same schemas
 * into an empty database on pg2. Interleaved rounds (the side that goes first alternates), medians.
 * Every move is checked: every acknowledged id on pg2, pg2 holding exactly the loaded rows plus
 * those, the move having verified the loaded rows plus those acknowledged by pg1, nothing of the
 * replication left. Then the one-by-one loop (moveShard per shard, no writer) over --loop-shards of
 * those shards, once, extrapolated to all of them.
 *
 * split-cli adds two sides to the same rounds: the move as a CLI process and the floor, both under a
 * paced writer; with SHARDCTL_BENCH_CLI_B=<another build's bin/shardctl.js> a third, that build's
 * CLI, so two builds are compared in the same rounds (the order rotating).
 *
 * pg_dump refuses servers newer than itself: with Debian's pg_dump 15 the floor runs on PostgreSQL
 * 15 only; on 18 the moves are reported without a pg_dump ratio.
 */
import { readFile, writeFile } from 'node:fs/promises';
import { formatShardList, loadConfig, moveShard, moveShards, ShardMap, shardSchemaName } from '../dist/index.js';
import {
  formatCount,
  formatMs,
  formatSample,
  ident,
  initFleet,
  itemAt,
  log,
  machineBusyMs,
  markdownTable,
  ratio,
  required,
  resetDatabases,
  sampleOrNull,
  round,
  roundOrder,
  summarize,
  textTable,
  timeCli,
  verdict,
  CLI,
  CLI_B,
} from './lib.js';
import {
  countRows,
  fencedStepsByWave,
  floorTools,
  replicationObjectsLeft,
  startWriter,
  timeDumpRestore,
  underWriter,
} from './moving.js';

export const description =
  'a host split (64 shards) moved online under a writer vs pg_dump | psql, as a library call and as a CLI process';

const SPLIT_BASE = 'bench_split_base';
const SPLIT_DB = 'bench_split';
const SPLIT_DUMP_DB = 'bench_split_dump';

const TARGET_SPLIT_RATIO = 1.5;
/** Issue 21's raised target: the split as a whole CLI process vs the floor under the same writer. */
const TARGET_SPLIT_CLI_RATIO = 1.0;
/** The paced writer of split-cli: one insert per this many ms at most, on both sides. */
const PACE_MS = 10;
/** Between two moves of the split on PostgreSQL 15: its default wal_retrieve_retry_interval (5 s) and a margin. */
const LAUNCHER_GAP_MS = 5_500;

/**
 * MOVE_SPLIT_PARTS=split,split-cli (default both) runs one of them. On PostgreSQL 15 each move side
 * starts at least LAUNCHER_GAP_MS after the previous one ended.
 */
const PARTS = new Set((process.env['MOVE_SPLIT_PARTS'] ?? 'split,split-cli').split(','));

/** @typedef {Awaited<ReturnType<typeof run>>} Result */

/**
 * @param {import('./run.js').BenchContext} ctx
 * @param {string} major
 */
export async function run(ctx, major) {
  const split = await runSplit(ctx, major);
  return { benchmark: 'move-split', postgres: split.postgres, split: split.result, splitCli: split.cli };
}

// ---------------------------------------------------------------------------------------------
// (a) split a host

/** @typedef {import('./lib.js').Host} Host */
/** @typedef {import('./lib.js').Fleet} Fleet */
/** @typedef {Awaited<ReturnType<typeof timeSplitCli>>} SplitCliRun */
/** @typedef {Awaited<ReturnType<typeof timeSplitMove>>} SplitMoveRun */
/**
 * The shards moved, those the writer writes to, and the rows loaded into each moved shard.
 * @typedef {{ source: Host, target: Host, moved: number[], written: number[], rows: number }} Split
 */
/** @typedef {{ source: Host, target: Host, schemas: string[], expectRows: number, pgDump: string, psql: string }} DumpArgs */

/**
 * @param {import('./run.js').BenchContext} ctx
 * @param {string} major
 */
async function runSplit(ctx, major) {
  const { options } = ctx;
  const n = options.splitShards;
  const total = 2 * n;
  const ranges = [`0-${total - 1}`, ''];
  const base = await ctx.fleet('move-split-base', major, {
    database: SPLIT_BASE,
    hostCount: 2,
    shards: total,
    ranges,
  });
  const fleet = await ctx.fleet('move-split', major, { database: SPLIT_DB, hostCount: 2, shards: total, ranges });
  const [source, target] = [itemAt(fleet.hosts, 0), itemAt(fleet.hosts, 1)];
  const postgres = await source.serverVersion();
  const floor = floorTools(major, postgres, options);
  if (floor.skipped) log(`move-split on PostgreSQL ${postgres}: no pg_dump floor, ${floor.skipped}`);
  const config = await loadConfig(base.configFile);
  const moved = Array.from({ length: n }, (_, i) => i);
  const schemas = moved.map((s) => shardSchemaName(config, s));
  const written = [itemAt(moved, 0), itemAt(moved, n - 1)];

  log(
    `move-split on PostgreSQL ${postgres}: ${total} shards on ${source.name}, ${formatCount(options.splitRows)} photos rows in each of ${n} (untimed)`,
  );
  await initFleet(base);
  await source.query(
    SPLIT_BASE,
    `do $$ declare s text; begin
       foreach s in array $1 loop
         execute format('insert into %I.photos (user_id, image_url, caption) select g %% 10000, ''https://cdn.example.com/p/'' || g || ''.jpg'', ''caption '' || g from generate_series(1, %s) g', s, ${Number(options.splitRows)});
       end loop; end $$`.replace('$1', `array[${schemas.map((s) => `'${s}'`).join(',')}]`),
  );
  await source.query(SPLIT_BASE, 'vacuum analyze');
  const initialMap = await readFile(fleet.configFile, 'utf8');

  const sides = [
    ...(PARTS.has('split') ? ['move', ...(floor.skipped ? [] : ['pg_dump'])] : []),
    ...(PARTS.has('split-cli')
      ? ['cli', ...(CLI_B ? ['cli-b'] : []), ...(floor.skipped ? [] : ['pg_dump+writer'])]
      : []),
  ];
  /** @type {SplitMoveRun[]} */
  const moves = [];
  /** @type {number[]} */
  const dumps = [];
  /** @type {SplitCliRun[]} */
  const clis = [];
  /** @type {SplitCliRun[]} */
  const clisB = [];
  /** @type {number[]} */
  const writerDumps = [];
  /** @type {(number | null)[]} */
  const writerDumpCpu = [];
  /** @type {DumpArgs} */
  const dumpArgs = {
    source,
    target,
    schemas,
    expectRows: n * options.splitRows,
    pgDump: floor.pgDump,
    psql: options.psql,
  };
  // PostgreSQL 15's launcher starts an apply worker at most once per wal_retrieve_retry_interval
  // (docs/moves.md): a move started within 5 s of the previous one waits for it. A split is one
  // command, not one of a series, so each move side starts that long after the previous one ended.
  let lastMoveEnded = -Infinity;
  const launcherGap = async () => {
    const wait = Number.parseInt(postgres, 10) <= 15 ? lastMoveEnded + LAUNCHER_GAP_MS - performance.now() : 0;
    if (wait > 0) await new Promise((resolve) => setTimeout(resolve, wait));
  };
  for (let turn = 0; turn < options.runs; turn++) {
    for (const who of roundOrder(sides, turn)) {
      await resetDatabases(fleet.hosts, SPLIT_DB, { template: SPLIT_BASE });
      await writeFile(fleet.configFile, initialMap);
      if (who === 'cli' || who === 'cli-b' || who === 'move') await launcherGap();
      if (who === 'cli' || who === 'cli-b') {
        const b = who === 'cli-b';
        const m = await timeSplitCli(fleet, {
          source,
          target,
          moved,
          written,
          rows: options.splitRows,
          cli: b ? required(CLI_B, 'SHARDCTL_BENCH_CLI_B') : CLI,
        });
        lastMoveEnded = performance.now();
        (b ? clisB : clis).push(m);
        log(
          `  split run ${turn + 1}/${options.runs}: shardctl move-shard (${n} shards)${b ? ' of build B' : ''} as a process ${formatMs(m.wallMs)} (the move reports ${formatMs(m.durationMs)}, ` +
            `first output at ${formatMs(m.firstOutputMs)}, exit ${formatMs(m.exitAfterLastOutputMs)} after the last), writes blocked ${formatMs(m.writeBlockedMs)}, ` +
            `${formatCount(m.acknowledged)} paced writes acked (${formatCount(m.onSource)} on ${source.name}, ${formatCount(m.onTarget)} on ${target.name}), machine CPU ${formatMs(m.machineCpuMs)}`,
        );
      } else if (who === 'pg_dump+writer') {
        const d = await timeDumpUnderWriter(fleet, { ...dumpArgs, written });
        writerDumps.push(d.ms);
        writerDumpCpu.push(d.machineCpuMs);
        log(
          `  split run ${turn + 1}/${options.runs}: pg_dump ${n} schemas | psql under the paced writer ${formatMs(d.ms)} (${formatCount(d.acknowledged)} writes acked), machine CPU ${formatMs(d.machineCpuMs)}`,
        );
      } else if (who === 'move') {
        const m = await timeSplitMove(fleet, { source, target, moved, written, rows: options.splitRows });
        lastMoveEnded = performance.now();
        moves.push(m);
        log(
          `  split run ${turn + 1}/${options.runs}: moveShards(${n} shards) ${formatMs(m.durationMs)}, writes blocked ${formatMs(m.writeBlockedMs)}, ` +
            `${formatCount(m.acknowledged)} writes acked (${formatCount(m.onSource)} on ${source.name}, ${formatCount(m.onTarget)} on ${target.name}), waves ${m.waves}`,
        );
      } else {
        const ms = await timeDumpSchemas(dumpArgs);
        dumps.push(ms);
        log(`  split run ${turn + 1}/${options.runs}: pg_dump ${n} schemas | psql ${formatMs(ms)}`);
      }
    }
  }

  const cli = PARTS.has('split-cli')
    ? splitCliResult({ postgres, n, rows: options.splitRows, written, clis, clisB, writerDumps, writerDumpCpu, floor })
    : null;
  if (!PARTS.has('split')) return { postgres, source, target, config, moved, result: null, cli };

  // The one-by-one loop, once: moveShard per shard, no writer.
  const loopShards = moved.slice(0, Math.min(options.loopShards, n));
  await resetDatabases(fleet.hosts, SPLIT_DB, { template: SPLIT_BASE });
  await writeFile(fleet.configFile, initialMap);
  /** @type {number[]} */
  const loop = [];
  for (const shard of loopShards) {
    const result = await moveShard(await loadConfig(fleet.configFile), shard, target.name, {
      configFile: fleet.configFile,
    });
    if (result.outcome !== 'moved') throw new Error(`moveShard(${shard}) ended ${result.outcome}`);
    loop.push(result.durationMs);
    log(`  one-by-one: shard ${shard} ${formatMs(result.durationMs)}`);
  }
  await writeFile(fleet.configFile, initialMap);

  const moveMs = summarize(moves.map((m) => m.durationMs));
  const writeBlockedMs = summarize(moves.map((m) => required(m.writeBlockedMs, "a move's write-blocked time")));
  const pgDumpMs = floor.skipped ? null : summarize(dumps);
  const measured = pgDumpMs ? ratio(moveMs.median, pgDumpMs.median) : null;
  const loopSample = summarize(loop);
  return {
    postgres,
    source,
    target,
    config,
    moved,
    cli,
    result: {
      postgres,
      shards: n,
      rowsPerShard: options.splitRows,
      writtenShards: written,
      moveMs,
      writeBlockedMs,
      pgDumpMs,
      pgDumpVersion: floor.version,
      floorSkipped: floor.skipped,
      ratio: measured,
      runs: moves,
      loop: { shards: loopShards, ms: loopSample, extrapolatedMs: round(loopSample.median * n, 0) },
      targets: {
        vsPgDump: {
          wanted: `≤ ${TARGET_SPLIT_RATIO}x`,
          got: measured,
          met: measured === null ? null : measured <= TARGET_SPLIT_RATIO,
        },
      },
    },
  };
}

/**
 * @param {{
 *   postgres: string,
 *   n: number,
 *   rows: number,
 *   written: number[],
 *   clis: SplitCliRun[],
 *   clisB: SplitCliRun[],
 *   writerDumps: number[],
 *   writerDumpCpu: (number | null)[],
 *   floor: ReturnType<typeof floorTools>,
 * }} runs
 */
function splitCliResult({ postgres, n, rows, written, clis, clisB, writerDumps, writerDumpCpu, floor }) {
  const wallMs = summarize(clis.map((m) => m.wallMs));
  const pgDumpMs = floor.skipped ? null : summarize(writerDumps);
  const measured = pgDumpMs ? ratio(wallMs.median, pgDumpMs.median) : null;
  const wallMsB = clisB.length > 0 ? summarize(clisB.map((m) => m.wallMs)) : null;
  return {
    // SHARDCTL_BENCH_CLI_B: another build timed in the same rounds, the order rotating.
    ...(wallMsB
      ? {
          buildB: {
            cli: CLI_B,
            wallMs: wallMsB,
            ratio: pgDumpMs ? ratio(wallMsB.median, pgDumpMs.median) : null,
            runs: clisB,
          },
        }
      : {}),
    postgres,
    shards: n,
    rowsPerShard: rows,
    writtenShards: written,
    paceMs: PACE_MS,
    wallMs,
    moveMs: summarize(clis.map((m) => m.durationMs)),
    firstOutputMs: summarize(clis.map((m) => m.firstOutputMs)),
    exitAfterLastOutputMs: summarize(clis.map((m) => m.exitAfterLastOutputMs)),
    writeBlockedMs: summarize(clis.map((m) => required(m.writeBlockedMs, "a CLI move's write-blocked time"))),
    pgDumpMs,
    // Busy CPU of the whole machine during each side (both servers, the writer, the client processes).
    machineCpuMs: sampleOrNull(clis.map((m) => m.machineCpuMs)),
    pgDumpMachineCpuMs: floor.skipped ? null : sampleOrNull(writerDumpCpu),
    pgDumpVersion: floor.version,
    floorSkipped: floor.skipped,
    ratio: measured,
    runs: clis,
    targets: {
      vsPgDump: {
        wanted: `≤ ${TARGET_SPLIT_CLI_RATIO}x`,
        got: measured,
        met: measured === null ? null : measured <= TARGET_SPLIT_CLI_RATIO,
      },
    },
  };
}

/**
 * @param {Fleet} fleet
 * @param {Split} split
 */
async function timeSplitMove(fleet, { source, target, moved, written, rows }) {
  const config = await loadConfig(fleet.configFile);
  const writer = startSplitWriter(await ShardMap.load(fleet.configFile), config, written);
  /** @type {{ step: string, detail: string, atMs: number }[]} */
  const steps = [];
  const { result, written: w } = await underWriter(writer, () => {
    const started = performance.now();
    return moveShards(config, moved, target.name, {
      configFile: fleet.configFile,
      onStep: (step, detail) => steps.push({ step, detail, atMs: round(performance.now() - started, 0) }),
    });
  });
  const m = {
    durationMs: result.durationMs,
    writeBlockedMs: result.writeBlockedMs,
    waves: result.moves.map((x) => x.waves.length).join('+'),
    acknowledged: w.total,
    onSource: w.byHost.get(source.name) ?? 0,
    onTarget: w.byHost.get(target.name) ?? 0,
    fenceErrors: w.fenceErrors,
    rowsMoved: result.rowsMoved,
    steps: steps.filter((s) => s.detail.startsWith('done:')).map((s) => ({ step: s.step, atMs: s.atMs })),
  };
  await checkSplit(fleet, { source, target, moved, rows, result, m, ids: w.acks, config });
  return m;
}

/**
 * split-cli's move: `shardctl move-shard <shards> --to <target>` as a child process, timed from
 * spawn to exit, while the paced writer runs in this process; checked as the in-process move is.
 * Its progress lines, timed as they arrive, show where the wall time goes: start-up until the
 * first line, the fenced steps, and the exit after the last line.
 * @param {Fleet} fleet
 * @param {Split & { cli: string }} split
 */
async function timeSplitCli(fleet, { source, target, moved, written, rows, cli }) {
  const config = await loadConfig(fleet.configFile);
  const writer = startSplitWriter(await ShardMap.load(fleet.configFile), config, written, PACE_MS);
  const busy = machineBusyMs();
  const { result: run, written: w } = await underWriter(writer, () =>
    timeCli(
      ['move-shard', formatShardList(moved), '--to', target.name, '--yes', '--json', '--config', fleet.configFile],
      { cwd: fleet.dir, progress: true, cli },
    ),
  );
  const busyAfter = machineBusyMs();
  const machineCpuMs = busy === null || busyAfter === null ? null : round(busyAfter - busy, 0);
  /** @type {import('./moving.js').CliMoveOutput} */
  const json = JSON.parse(run.stdout);
  // --json prints the one move of a single source host, or the batch with its moves.
  const result = 'moves' in json ? json : { ...json, moves: [json] };
  const waves = fencedStepsByWave(run.lines);
  const m = {
    wallMs: round(run.ms, 0),
    durationMs: result.durationMs ?? Math.max(...result.moves.map((x) => x.durationMs)),
    writeBlockedMs: result.writeBlockedMs,
    firstOutputMs: round(run.lines[0]?.atMs ?? NaN, 0),
    exitAfterLastOutputMs: round(run.ms - (run.lines.at(-1)?.atMs ?? NaN), 0),
    peakRssKiB: run.peakRssKiB,
    cpuMs: run.cpuMs,
    machineCpuMs,
    waves: waves.length,
    fencedSteps: waves,
    // Every step's completion, ms after the spawn: where the rest of the wall time goes.
    progress: run.lines
      .filter((l) => l.text.startsWith('done:'))
      .map((l) => ({ step: l.text.slice(6), atMs: round(l.atMs, 0) })),
    acknowledged: w.total,
    onSource: w.byHost.get(source.name) ?? 0,
    onTarget: w.byHost.get(target.name) ?? 0,
    fenceErrors: w.fenceErrors,
    rowsMoved: result.rowsMoved,
  };
  await checkSplit(fleet, { source, target, moved, rows, result, m, ids: w.acks, config });
  return m;
}

/**
 * split-cli's floor: `pg_dump | psql` of the same schemas while the same paced writer inserts into two of them on the source.
 * @param {Fleet} fleet
 * @param {DumpArgs & { written: number[] }} args
 */
async function timeDumpUnderWriter(fleet, { source, target, schemas, expectRows, pgDump, psql, written }) {
  const config = await loadConfig(fleet.configFile);
  const writer = startSplitWriter(await ShardMap.load(fleet.configFile), config, written, PACE_MS);
  const busy = machineBusyMs();
  const { result: ms, written: w } = await underWriter(writer, () =>
    timeDumpRestore({ source, sourceDb: SPLIT_DB, target, targetDb: SPLIT_DUMP_DB, schemas, pgDump, psql }),
  );
  const busyAfter = machineBusyMs();
  const machineCpuMs = busy === null || busyAfter === null ? null : round(busyAfter - busy, 0);
  if (w.byHost.size !== 1 || w.fenceErrors !== 0 || w.total === 0)
    throw new Error(`the writer of the floor must write on ${source.name} alone, unfenced; it wrote ${w.total} rows`);
  // The dump's snapshot holds the loaded rows and some of the writes acknowledged meanwhile.
  const restored = await countRows(target, SPLIT_DUMP_DB, schemas);
  if (restored < expectRows || restored > expectRows + w.total) {
    throw new Error(
      `pg_dump | psql under the writer left ${restored} photos rows, expected ${expectRows} loaded + at most ${w.total} written`,
    );
  }
  return { ms, acknowledged: w.total, machineCpuMs };
}

/**
 * The application: inserts into each of `shards` in turn, one row per statement, on the host the
 * map names (as fast as acknowledged, or paced); the ids are kept per shard.
 * @param {import('../dist/index.js').ShardMap} map
 * @param {import('../dist/index.js').ShardctlConfig} config
 * @param {number[]} shards
 * @param {number} [paceMs]
 */
function startSplitWriter(map, config, shards, paceMs = 0) {
  return startWriter(map, {
    shards,
    paceMs,
    write: async (client, shard, n) =>
      /** @type {string} */ (
        (
          await client.query(
            `insert into ${ident(shardSchemaName(config, shard))}.photos (user_id, image_url, caption) values ($1, $2, $3) returning id`,
            [n % 10000, `https://cdn.example.com/p/w${n}.jpg`, `written during the move ${n}`],
          )
        ).rows[0].id
      ),
  });
}

/**
 * @param {Fleet} fleet
 * @param {Omit<Split, 'written'> & {
 *   result: { outcome: string, moves: readonly unknown[], rowsMoved: string },
 *   m: { onSource: number, onTarget: number },
 *   ids: Map<number, string[]>,
 *   config: import('../dist/index.js').ShardctlConfig,
 * }} outcome
 */
async function checkSplit(fleet, { source, target, moved, rows, result, m, ids, config }) {
  const problems = [];
  if (result.outcome !== 'moved') problems.push(`the move ended ${result.outcome}`);
  if (result.moves.length !== 1) problems.push(`${result.moves.length} moves, expected one (one source host)`);
  const map = await ShardMap.load(fleet.configFile);
  const elsewhere = moved.filter((s) => map.hostForShard(s).name !== target.name);
  if (elsewhere.length > 0)
    problems.push(`the map does not put shards ${formatShardList(elsewhere)} on ${target.name}`);
  if (m.onSource === 0 || m.onTarget === 0)
    problems.push(
      `the writer was acknowledged ${m.onSource} inserts on ${source.name} and ${m.onTarget} on ${target.name}; it must write on both`,
    );
  let acked = 0;
  for (const [shard, list] of ids) {
    acked += list.length;
    const photos = `${ident(shardSchemaName(config, shard))}.photos`;
    const [found] = await target.query(
      SPLIT_DB,
      `select count(*)::int as n from unnest($1::bigint[]) a(id) join ${photos} p using (id)`,
      [list],
    );
    if (found?.n !== list.length)
      problems.push(
        `shard ${shard}: ${list.length - (found?.n ?? 0)} of ${list.length} acknowledged rows are missing on ${target.name}`,
      );
  }
  const schemas = moved.map((s) => shardSchemaName(config, s));
  const counted = await countRows(target, SPLIT_DB, schemas);
  const expected = moved.length * rows + acked;
  if (counted !== expected)
    problems.push(`${target.name} holds ${counted} photos rows in the moved shards, expected ${expected}`);
  if (result.rowsMoved !== String(moved.length * rows + m.onSource)) {
    problems.push(
      `the move verified ${result.rowsMoved} rows, expected ${moved.length * rows} loaded + ${m.onSource} acknowledged by ${source.name}`,
    );
  }
  for (const host of [source, target]) {
    const left = await replicationObjectsLeft(host, SPLIT_DB);
    if (left !== 0) problems.push(`${host.name}: ${left} replication objects left behind`);
  }
  if (problems.length > 0)
    throw new Error(`the batch move did not leave what it should have:\n  - ${problems.join('\n  - ')}`);
}

/**
 * `pg_dump -n s1 -n s2 … | psql` into a fresh empty database on the target; wall time.
 * @param {DumpArgs} args
 */
async function timeDumpSchemas({ source, target, schemas, expectRows, pgDump, psql }) {
  const ms = await timeDumpRestore({
    source,
    sourceDb: SPLIT_DB,
    target,
    targetDb: SPLIT_DUMP_DB,
    schemas,
    pgDump,
    psql,
  });
  const restored = await countRows(target, SPLIT_DUMP_DB, schemas);
  if (restored !== expectRows) throw new Error(`pg_dump | psql left ${restored} photos rows, expected ${expectRows}`);
  return ms;
}

// ---------------------------------------------------------------------------------------------
// Output

const SPLIT_HEADERS = [
  'PostgreSQL',
  'moved',
  'moveShards (online, 1 call)',
  'writes blocked',
  'pg_dump -n … | psql',
  'ratio',
  'target',
  'one-by-one (per shard → all)',
];

/** @param {Result[]} results */
function splitRows(results) {
  return results
    .map((x) => x.split)
    .filter((r) => r !== null)
    .map((r) => [
      r.postgres,
      `${r.shards} shards × ${formatCount(r.rowsPerShard)} rows, pg1 → pg2 (new), writer on ${r.writtenShards.length}`,
      formatSample(r.moveMs),
      formatSample(r.writeBlockedMs),
      r.pgDumpMs ? formatSample(r.pgDumpMs) : `n/a (pg_dump ${r.pgDumpVersion ?? 'missing'})`,
      r.ratio === null ? 'n/a' : `${r.ratio.toFixed(2)}x`,
      `≤ ${TARGET_SPLIT_RATIO}x: ${r.targets.vsPgDump.met === null ? 'not measured' : verdict(r.targets.vsPgDump.met)}`,
      `${formatMs(r.loop.ms.median)} (${r.loop.shards.length} shards) → ${formatMs(r.loop.extrapolatedMs)}`,
    ]);
}

const SPLIT_CLI_HEADERS = [
  'PostgreSQL',
  'moved',
  'shardctl move-shard (process, spawn → exit)',
  'as the move reports it',
  'start-up / exit after last line',
  'writes blocked',
  'pg_dump -n … | psql, same writer',
  'ratio',
  'target',
];

/** @param {Result[]} results */
function splitCliRows(results) {
  return results
    .map((x) => x.splitCli)
    .filter((r) => r !== null)
    .map((r) => [
      r.postgres,
      `${r.shards} shards × ${formatCount(r.rowsPerShard)} rows, pg1 → pg2 (new), writer on ${r.writtenShards.length} every ${r.paceMs} ms, both sides`,
      formatSample(r.wallMs),
      formatSample(r.moveMs),
      `${formatSample(r.firstOutputMs)} / ${formatSample(r.exitAfterLastOutputMs)}`,
      formatSample(r.writeBlockedMs),
      r.pgDumpMs ? formatSample(r.pgDumpMs) : `n/a (pg_dump ${r.pgDumpVersion ?? 'missing'})`,
      r.ratio === null ? 'n/a' : `${r.ratio.toFixed(2)}x`,
      `≤ ${TARGET_SPLIT_CLI_RATIO}x: ${r.targets.vsPgDump.met === null ? 'not measured' : verdict(r.targets.vsPgDump.met)}`,
    ]);
}

/** @param {Result} result */
export function table(result) {
  return [
    ...(result.split
      ? [
          `move-split: median (range) of ${result.split.moveMs.runs.length} runs, interleaved with the floor`,
          textTable(SPLIT_HEADERS, splitRows([result])),
        ]
      : []),
    ...(result.splitCli
      ? [
          '',
          'split a host as a CLI process, a paced writer during both sides',
          textTable(SPLIT_CLI_HEADERS, splitCliRows([result])),
        ]
      : []),
  ].join('\n');
}

/** @param {Result[]} results */
export function markdown(results) {
  return [
    ...(results.some((r) => r.split)
      ? [
          '**Split a host** (median and range; moves interleaved with the floor):',
          '',
          markdownTable(SPLIT_HEADERS, splitRows(results)),
        ]
      : []),
    ...(results.some((r) => r.splitCli)
      ? [
          '',
          '**Split a host as a CLI process** (spawn to exit; a paced writer during the move and during the floor; interleaved):',
          '',
          markdownTable(SPLIT_CLI_HEADERS, splitCliRows(results)),
        ]
      : []),
  ].join('\n');
}
