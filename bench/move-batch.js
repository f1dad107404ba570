/**
 * move-batch: batched shard moves (issue 7), four measurements on one PostgreSQL major.
 *
 * (a) Split a host: a fleet of 2 × --split-shards shards, all on pg1, pg2 new and empty
 *     (`shards: ""`), each shard with --split-rows photos rows. The first --split-shards shards move
 *     online to pg2 in ONE moveShards() call while a writer inserts into two of them (the first and
 *     the last moved), following the move on SC100. Against the floor `pg_dump -n s0 -n s1 … | psql`
 *     of the same schemas into an empty database on pg2. Interleaved rounds (the side that goes first
 *     alternates), medians. Every move is checked: every acknowledged id on pg2, pg2 holding exactly
 *     the loaded rows plus those, the move having verified the loaded rows plus those acknowledged
 *     by pg1, nothing of the replication left. Then the one-by-one loop (moveShard per shard, no
 *     writer) over --loop-shards of those shards, once, extrapolated to all of them.
 * (b) One shard of --rows rows: move-shard.js's measurement (the move under a writer vs
 *     `pg_dump -n | psql`, interleaved), reused when move-shard ran in the same run, judged against
 *     issue 7's targets.
 * (c) Copy-step options, measured on the copy alone (no replication, no writer): the split's shards
 *     and the big shard copied from the source into empty copies of the schemas on the target, each
 *     shard in one target transaction after TRUNCATE as the engine does, varying: indexes and primary
 *     keys kept while copying vs dropped first and rebuilt after the COPY (same transaction);
 *     concurrency (worker connection pairs) 1/2/4; binary vs text COPY. Interleaved rounds.
 * (d) Fleet scale: --fleet-shards empty shards over 4 hosts (pg1-pg4), moved onto 8: the upper half
 *     of each host's shards to pg5-pg8, one `shardctl move-shard <shards> --to <host>` CLI per target,
 *     all four at once (disjoint host pairs). Total wall time, the longest any shard refused writes
 *     (writeBlockedMs from each CLI's --json), the CLIs' peak RSS (GNU time). One run.
 *
 * pg_dump refuses servers newer than itself: with Debian's pg_dump 15 the floors of (a) and (b) run
 * on PostgreSQL 15 only; on 18 the moves are reported without a pg_dump ratio (the copy-step
 * figures of (c) are there on both).
 */
import { readFile, writeFile } from 'node:fs/promises';
import copyStreams from 'pg-copy-streams';
import { pipeline } from 'node:stream/promises';
import { formatShardList, loadConfig, moveShard, moveShards, ShardMap, shardSchemaName } from '../dist/index.js';
import * as single from './move-shard.js';
import {
  connect,
  formatCount,
  formatMs,
  formatRss,
  formatSample,
  ident,
  initFleet,
  log,
  machineBusyMs,
  markdownTable,
  median,
  ratio,
  resetDatabases,
  round,
  roundOrder,
  summarize,
  textTable,
  timeCli,
  verdict,
  writeFleet,
  CLI,
  CLI_B,
} from './lib.js';
import {
  countRows,
  fencedStepsByWave,
  floorTools,
  FENCED_STEPS,
  replicationObjectsLeft,
  startWriter,
  timeDumpRestore,
  underWriter,
} from './moving.js';

export const description =
  'batched moves: a host split (64 shards) under a writer vs pg_dump | psql, a 1M-row shard, copy-step options, fleet scale';

const SPLIT_BASE = 'bench_split_base';
const SPLIT_DB = 'bench_split';
const SPLIT_DUMP_DB = 'bench_split_dump';
const COPY_DB = 'bench_copy';
const FLEET_BASE = 'bench_fleet_base';
const FLEET_DB = 'bench_fleet';

const TARGET_SPLIT_RATIO = 1.5;
const TARGET_BIG_RATIO = 1.3;
const TARGET_BIG_BLOCKED_MS = 500;
const TARGET_FLEET_RSS_MIB = 300;
/** Issue 21's raised targets: the split as a whole CLI process vs the floor under the same writer; the fleet's longest write block. */
const TARGET_SPLIT_CLI_RATIO = 1.0;
const TARGET_FLEET_BLOCKED_MS = 250;
/** The paced writer of split-cli: one insert per this many ms at most, on both sides. */
const PACE_MS = 10;
/** Between two moves of the split on PostgreSQL 15: its default wal_retrieve_retry_interval (5 s) and a margin. */
const LAUNCHER_GAP_MS = 5_500;

/**
 * MOVE_BATCH_PARTS=split,split-cli,big,copy,fleet (default all) runs some of the parts; copy needs
 * the split's fleet. split-cli adds two sides to the split's rounds: the move as a CLI process and
 * the floor, both under a paced writer; with SHARDCTL_BENCH_CLI_B=<another build's bin/shardctl.js>
 * a third, that build's CLI, so two builds are compared in the same rounds (the order rotating).
 * On PostgreSQL 15 each move side starts at least LAUNCHER_GAP_MS after the previous one ended.
 */
const PARTS = new Set((process.env['MOVE_BATCH_PARTS'] ?? 'split,split-cli,big,copy,fleet').split(','));

export async function run(ctx, major) {
  const split = PARTS.has('split') || PARTS.has('split-cli') || PARTS.has('copy') ? await runSplit(ctx, major) : null;
  const big = PARTS.has('big') ? await runBig(ctx, major) : null;
  const copy = PARTS.has('copy') ? await runCopyOptions(ctx, major, split, big !== null) : [];
  const fleet = PARTS.has('fleet') ? await runFleet(ctx, major) : null;
  return {
    benchmark: 'move-batch',
    postgres: split?.postgres ?? big?.postgres ?? fleet?.postgres,
    split: split?.result ?? null,
    splitCli: split?.cli ?? null,
    big,
    copy,
    fleet,
  };
}

// ---------------------------------------------------------------------------------------------
// (a) split a host

async function runSplit(ctx, major) {
  const { options } = ctx;
  const n = options.splitShards;
  const total = 2 * n;
  const ranges = [`0-${total - 1}`, ''];
  const base = await ctx.fleet('move-batch-split-base', major, {
    database: SPLIT_BASE,
    hostCount: 2,
    shards: total,
    ranges,
  });
  const fleet = await ctx.fleet('move-batch-split', major, { database: SPLIT_DB, hostCount: 2, shards: total, ranges });
  const [source, target] = fleet.hosts;
  const postgres = await source.serverVersion();
  const floor = floorTools(major, postgres, options);
  if (floor.skipped) log(`move-batch on PostgreSQL ${postgres}: no pg_dump floor, ${floor.skipped}`);
  const config = await loadConfig(base.configFile);
  const moved = Array.from({ length: n }, (_, i) => i);
  const schemas = moved.map((s) => shardSchemaName(config, s));
  const written = [moved[0], moved.at(-1)];

  log(
    `move-batch split on PostgreSQL ${postgres}: ${total} shards on ${source.name}, ${formatCount(options.splitRows)} photos rows in each of ${n} (untimed)`,
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
    ...(PARTS.has('split') || PARTS.has('copy') ? ['move', ...(floor.skipped ? [] : ['pg_dump'])] : []),
    ...(PARTS.has('split-cli')
      ? ['cli', ...(CLI_B ? ['cli-b'] : []), ...(floor.skipped ? [] : ['pg_dump+writer'])]
      : []),
  ];
  const moves = [];
  const dumps = [];
  const clis = [];
  const clisB = [];
  const writerDumps = [];
  const writerDumpCpu = [];
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
          cli: b ? CLI_B : CLI,
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
  if (!PARTS.has('split') && !PARTS.has('copy')) return { postgres, source, target, config, moved, result: null, cli };

  // The one-by-one loop, once: moveShard per shard, no writer.
  const loopShards = moved.slice(0, Math.min(options.loopShards, n));
  await resetDatabases(fleet.hosts, SPLIT_DB, { template: SPLIT_BASE });
  await writeFile(fleet.configFile, initialMap);
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
  const writeBlockedMs = summarize(moves.map((m) => m.writeBlockedMs));
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
    writeBlockedMs: summarize(clis.map((m) => m.writeBlockedMs)),
    pgDumpMs,
    // Busy CPU of the whole machine during each side (both servers, the writer, the client processes).
    machineCpuMs: clis.every((m) => m.machineCpuMs !== null) ? summarize(clis.map((m) => m.machineCpuMs)) : null,
    pgDumpMachineCpuMs: floor.skipped || writerDumpCpu.some((c) => c === null) ? null : summarize(writerDumpCpu),
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

async function timeSplitMove(fleet, { source, target, moved, written, rows }) {
  const config = await loadConfig(fleet.configFile);
  const writer = startSplitWriter(await ShardMap.load(fleet.configFile), config, written);
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
  const machineCpuMs = busy === null ? null : round(machineBusyMs() - busy, 0);
  const json = JSON.parse(run.stdout);
  // --json prints the one move of a single source host, or the batch with its moves.
  const result = json.moves ? json : { ...json, moves: [json] };
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

/** split-cli's floor: `pg_dump | psql` of the same schemas while the same paced writer inserts into two of them on the source. */
async function timeDumpUnderWriter(fleet, { source, target, schemas, expectRows, pgDump, psql, written }) {
  const config = await loadConfig(fleet.configFile);
  const writer = startSplitWriter(await ShardMap.load(fleet.configFile), config, written, PACE_MS);
  const busy = machineBusyMs();
  const { result: ms, written: w } = await underWriter(writer, () =>
    timeDumpRestore({ source, sourceDb: SPLIT_DB, target, targetDb: SPLIT_DUMP_DB, schemas, pgDump, psql }),
  );
  const machineCpuMs = busy === null ? null : round(machineBusyMs() - busy, 0);
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
 */
function startSplitWriter(map, config, shards, paceMs = 0) {
  return startWriter(map, {
    shards,
    paceMs,
    write: async (client, shard, n) =>
      (
        await client.query(
          `insert into ${ident(shardSchemaName(config, shard))}.photos (user_id, image_url, caption) values ($1, $2, $3) returning id`,
          [n % 10000, `https://cdn.example.com/p/w${n}.jpg`, `written during the move ${n}`],
        )
      ).rows[0].id,
  });
}

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
    if (found.n !== list.length)
      problems.push(
        `shard ${shard}: ${list.length - found.n} of ${list.length} acknowledged rows are missing on ${target.name}`,
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

/** `pg_dump -n s1 -n s2 … | psql` into a fresh empty database on the target; wall time. */
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
// (b) the big shard

async function runBig(ctx, major) {
  const result = ctx.results.get(`move-shard@${major}`) ?? (await single.run(ctx, major));
  const blockedMax = result.writeBlockedMs.max;
  return {
    postgres: result.postgres,
    rows: result.rows,
    moveMs: result.moveMs,
    writeBlockedMs: result.writeBlockedMs,
    pgDumpMs: result.pgDumpMs,
    pgDumpVersion: result.pgDumpVersion,
    floorSkipped: result.floorSkipped,
    ratio: result.ratio,
    runs: result.runs,
    targets: {
      vsPgDump: {
        wanted: `≤ ${TARGET_BIG_RATIO}x`,
        got: result.ratio,
        met: result.ratio === null ? null : result.ratio <= TARGET_BIG_RATIO,
      },
      writeBlocked: {
        wanted: `< ${TARGET_BIG_BLOCKED_MS} ms in every run`,
        got: blockedMax,
        met: blockedMax < TARGET_BIG_BLOCKED_MS,
      },
    },
  };
}

// ---------------------------------------------------------------------------------------------
// (c) copy-step options

/** The variants, in the order of a round (rotated each round). */
function copyVariants(set) {
  if (set === 'big') {
    return [
      { indexes: 'kept', format: 'binary', concurrency: 1 },
      { indexes: 'after', format: 'binary', concurrency: 1 },
      { indexes: 'kept', format: 'text', concurrency: 1 },
      { indexes: 'after', format: 'text', concurrency: 1 },
    ];
  }
  return [1, 2, 4].flatMap((concurrency) => [
    { indexes: 'kept', format: 'binary', concurrency },
    { indexes: 'after', format: 'binary', concurrency },
    ...(concurrency === 2 ? [{ indexes: 'kept', format: 'text', concurrency }] : []),
  ]);
}

function variantName(v) {
  return `${v.indexes === 'kept' ? 'indexes kept' : 'indexes after'}, ${v.format}, concurrency ${v.concurrency}`;
}

async function runCopyOptions(ctx, major, split, bigBuilt) {
  const { options } = ctx;
  const out = [];
  // The split's shards: pg1's SPLIT_BASE (read directly; nothing writes it) into empty schemas on pg2.
  {
    const schemas = split.moved.map((s) => shardSchemaName(split.config, s));
    await prepareCopyTarget(split.target, split.config.shards, 'copy-split');
    out.push({
      set: 'split',
      what: `${schemas.length} shards × ${formatCount(options.splitRows)} photos rows`,
      ...(await measureCopy({
        source: split.source,
        sourceDb: SPLIT_BASE,
        target: split.target,
        schemas,
        variants: copyVariants('split'),
        runs: options.runs,
      })),
    });
  }
  // The big shard: move-shard's template on its source host (built by part big).
  if (bigBuilt) {
    const base = await ctx.fleet('move-shard-base', major, {
      database: single.BASE_DATABASE,
      hostCount: single.HOSTS,
      shards: single.SHARDS,
    });
    const config = await loadConfig(base.configFile);
    const [source, target] = base.hosts;
    const schema = shardSchemaName(config, single.SHARD);
    await prepareCopyTarget(target, config.shards, 'copy-big');
    out.push({
      set: 'big',
      what: `1 shard × ${formatCount(options.rows)} photos rows`,
      ...(await measureCopy({
        source,
        sourceDb: single.BASE_DATABASE,
        target,
        schemas: [schema],
        variants: copyVariants('big'),
        runs: options.runs,
      })),
    });
  }
  return out;
}

/** COPY_DB on the host: every shard's schema with the migrations, empty (init of a one-host fleet). */
async function prepareCopyTarget(host, shards, name) {
  const f = await writeFleet({ name, hosts: [host], shards, database: COPY_DB });
  try {
    await initFleet(f);
  } finally {
    await f.remove();
  }
}

async function measureCopy({ source, sourceDb, target, schemas, variants, runs }) {
  const times = new Map(variants.map((v) => [variantName(v), []]));
  for (let turn = 0; turn < runs; turn++) {
    const order = roundOrder(variants, turn);
    for (const v of order) {
      await target.query(COPY_DB, 'checkpoint');
      const ms = await copySchemas({ source, sourceDb, target, schemas, ...v });
      times.get(variantName(v)).push(ms);
      log(
        `  copy ${schemas.length === 1 ? schemas[0] : `${schemas.length} shards`}: ${variantName(v)} ${formatMs(ms)}`,
      );
    }
  }
  const rows = variants.map((v) => ({ ...v, name: variantName(v), ms: summarize(times.get(variantName(v))) }));
  const baseline = rows[0].ms.median;
  for (const r of rows) r.vsFirst = ratio(r.ms.median, baseline);
  return { variants: rows };
}

/**
 * The copy step as the engine does it, alone: per shard one target transaction, TRUNCATE, COPY of
 * every table from a REPEATABLE READ reader; 'after' drops the indexes and primary keys first and
 * builds them again after the COPY, in the same transaction.
 */
async function copySchemas({ source, sourceDb, target, schemas, indexes, format, concurrency }) {
  const reader0 = await connect(source.url(sourceDb));
  const tables = (
    await reader0.query(
      `select n.nspname as schema, c.relname as table from pg_class c join pg_namespace n on n.oid = c.relnamespace
        where n.nspname = any($1) and c.relkind = 'r' order by 1, 2`,
      [schemas],
    )
  ).rows;
  await reader0.end();
  let next = 0;
  const started = performance.now();
  const worker = async () => {
    const reader = await connect(source.url(sourceDb));
    const writer = await connect(target.url(COPY_DB));
    try {
      await reader.query('BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY');
      while (next < schemas.length) {
        const schema = schemas[next++];
        const own = tables.filter((t) => t.schema === schema);
        await writer.query('BEGIN');
        await writer.query(`TRUNCATE ${own.map((t) => `${ident(t.schema)}.${ident(t.table)}`).join(', ')}`);
        let rebuild = [];
        if (indexes === 'after') {
          const defs = await writer.query(
            `select i.indexrelid::regclass::text as index, t.oid::regclass::text as tbl, c.conname, pg_get_indexdef(i.indexrelid) as indexdef,
                    case when c.oid is not null then pg_get_constraintdef(c.oid) end as condef
               from pg_index i join pg_class t on t.oid = i.indrelid
               left join pg_constraint c on c.conindid = i.indexrelid and c.conrelid = i.indrelid and c.contype in ('p', 'u', 'x')
              where t.relnamespace = to_regnamespace($1) and t.relkind = 'r'`,
            [schema],
          );
          for (const d of defs.rows) {
            await writer.query(
              d.conname ? `ALTER TABLE ${d.tbl} DROP CONSTRAINT ${ident(d.conname)}` : `DROP INDEX ${d.index}`,
            );
          }
          rebuild = defs.rows.map((d) =>
            d.conname ? `ALTER TABLE ${d.tbl} ADD CONSTRAINT ${ident(d.conname)} ${d.condef}` : d.indexdef,
          );
        }
        const suffix = format === 'binary' ? ' (FORMAT binary)' : '';
        for (const t of own) {
          const name = `${ident(t.schema)}.${ident(t.table)}`;
          await pipeline(
            reader.query(copyStreams.to(`COPY ${name} TO STDOUT${suffix}`)),
            writer.query(copyStreams.from(`COPY ${name} FROM STDIN${suffix}`)),
          );
        }
        for (const sql of rebuild) await writer.query(sql);
        await writer.query('COMMIT');
      }
      await reader.query('COMMIT');
    } finally {
      await reader.end().catch(() => undefined);
      await writer.end().catch(() => undefined);
    }
  };
  await Promise.all(Array.from({ length: Math.min(concurrency, schemas.length) }, worker));
  return performance.now() - started;
}

// ---------------------------------------------------------------------------------------------
// (d) fleet scale

async function runFleet(ctx, major) {
  const { options } = ctx;
  const shards = options.fleetShards;
  const per = shards / 4;
  if (!Number.isInteger(per / 2)) throw new Error(`--fleet-shards ${shards}: must be a multiple of 8`);
  const ranges = [0, 1, 2, 3].map((i) => `${i * per}-${(i + 1) * per - 1}`).concat(['', '', '', '']);
  const base = await ctx.fleet('move-batch-fleet-base', major, { database: FLEET_BASE, hostCount: 8, shards, ranges });
  const fleet = await ctx.fleet('move-batch-fleet', major, { database: FLEET_DB, hostCount: 8, shards, ranges });
  const postgres = await fleet.hosts[0].serverVersion();
  log(
    `move-batch fleet on PostgreSQL ${postgres}: init of ${formatCount(shards)} empty shards over 4 of 8 hosts (untimed)`,
  );
  await initFleet(base);
  await resetDatabases(fleet.hosts, FLEET_DB, { template: FLEET_BASE });
  const initialMap = await readFile(fleet.configFile, 'utf8');
  const pairs = [0, 1, 2, 3].map((i) => ({
    source: fleet.hosts[i].name,
    target: fleet.hosts[i + 4].name,
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
    const json = JSON.parse(r.stdout);
    const list = json.moves ?? [json];
    // Where the longest write block went: the steps of each CLI's longest fenced wave, as its progress lines arrived.
    const waves = fencedStepsByWave(r.lines);
    const longest = waves.reduce((a, b) => ((b.fencedMs ?? 0) > (a?.fencedMs ?? 0) ? b : a), null);
    return {
      ...pairs[i],
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
    const wrong = [];
    for (let s = lo; s < (i + 1) * per; s++) if (map.hostForShard(s).name !== p.target) wrong.push(s);
    if (wrong.length) problems.push(`the map does not put ${formatShardList(wrong)} on ${p.target}`);
    const [row] = await fleet.hosts[i + 4].query(
      FLEET_DB,
      `select count(*)::int as n from shardctl.shards where state = 'active'`,
    );
    if (row.n !== per / 2) problems.push(`${p.target} holds ${row.n} active shards, expected ${per / 2}`);
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

function splitRows(results) {
  return results
    .filter((x) => x.split)
    .map(({ split: r }) => [
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

/** "longest wave 3 of 17: 212 ms (caught-up +40, sequences-carried +12, …); median per wave …". */
function describeWave(m) {
  const steps = (o) =>
    Object.entries(o)
      .map(([step, ms]) => `${step} +${ms}`)
      .join(', ');
  if (!m.longestWave) return 'no fenced steps in its output';
  return `longest wave ${m.longestWave.wave} of ${m.waves}: ${m.longestWave.fencedMs} ms fenced → switched (${steps(m.longestWave.steps)}); median per wave: ${steps(m.stepMedians)}`;
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

function splitCliRows(results) {
  return results
    .filter((x) => x.splitCli)
    .map(({ splitCli: r }) => [
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

const BIG_HEADERS = [
  'PostgreSQL',
  'moved',
  'move (online)',
  'pg_dump -n | psql',
  'ratio',
  'target ≤ 1.3x',
  'writes blocked',
  'target < 500 ms',
];

function bigRows(results) {
  return results
    .filter((x) => x.big)
    .map(({ big: r }) => [
      r.postgres,
      `1 shard × ${formatCount(r.rows)} rows, writer throughout`,
      formatSample(r.moveMs),
      r.pgDumpMs ? formatSample(r.pgDumpMs) : `n/a (pg_dump ${r.pgDumpVersion ?? 'missing'})`,
      r.ratio === null ? 'n/a' : `${r.ratio.toFixed(2)}x`,
      r.targets.vsPgDump.met === null ? 'not measured' : verdict(r.targets.vsPgDump.met),
      formatSample(r.writeBlockedMs),
      verdict(r.targets.writeBlocked.met),
    ]);
}

const COPY_HEADERS = ['PostgreSQL', 'copied', 'variant', 'copy step', 'vs first row'];

function copyRows(results) {
  return results.flatMap((r) =>
    r.copy.flatMap((set) =>
      set.variants.map((v) => [r.postgres, set.what, v.name, formatSample(v.ms), `${v.vsFirst.toFixed(2)}x`]),
    ),
  );
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

function fleetRows(results) {
  return results
    .filter((r) => r.fleet)
    .map(({ fleet: f }) => [
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

export function table(result) {
  return [
    `move-batch (a) split a host: median (range) of ${result.split?.moveMs.runs.length ?? 0} runs, interleaved with the floor`,
    textTable(SPLIT_HEADERS, splitRows([result])),
    ...(result.splitCli
      ? [
          '',
          '(a) split a host as a CLI process, a paced writer during both sides',
          textTable(SPLIT_CLI_HEADERS, splitCliRows([result])),
        ]
      : []),
    '',
    "(b) one big shard (move-shard's runs)",
    textTable(BIG_HEADERS, bigRows([result])),
    '',
    '(c) copy step alone',
    textTable(COPY_HEADERS, copyRows([result])),
    ...(result.fleet
      ? [
          '',
          '(d) fleet scale, one run',
          textTable(FLEET_HEADERS, fleetRows([result])),
          ...result.fleet.moves.map((m) => `${m.source} → ${m.target}: ${describeWave(m)}`),
        ]
      : []),
  ].join('\n');
}

export function markdown(results) {
  return [
    '**Split a host** (median and range; moves interleaved with the floor):',
    '',
    markdownTable(SPLIT_HEADERS, splitRows(results)),
    ...(results.some((r) => r.splitCli)
      ? [
          '',
          '**Split a host as a CLI process** (spawn to exit; a paced writer during the move and during the floor; interleaved):',
          '',
          markdownTable(SPLIT_CLI_HEADERS, splitCliRows(results)),
        ]
      : []),
    '',
    "**One shard of 1,000,000 rows** (move-shard's runs, judged against issue 7's targets):",
    '',
    markdownTable(BIG_HEADERS, bigRows(results)),
    '',
    '**The copy step alone** (variants interleaved, rotated each round):',
    '',
    markdownTable(COPY_HEADERS, copyRows(results)),
    ...(results.some((r) => r.fleet)
      ? ['', '**Fleet scale** (one run):', '', markdownTable(FLEET_HEADERS, fleetRows(results))]
      : []),
  ].join('\n');
}
