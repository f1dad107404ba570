import type { Command } from 'commander';
import type { BatchMoveResult, MoveMode, MoveResult } from '../index.js';
import { lib } from './library.js';
import { type CliContext, loadCliConfig } from './context.js';
import {
  type CommonFlags,
  configOption,
  confirmOrRefuse,
  dryRunOption,
  jsonOption,
  parseDurationOption,
  withFlagNames,
  yesOption,
} from './options.js';
import { formatBytes, Output, seconds } from './output.js';
import { durationPhrase, MoveProgressView } from './move-progress.js';
import { cutOverSignals } from './cut-over-signals.js';

interface MoveFlags extends CommonFlags {
  to?: string;
  mode?: string;
  resume?: boolean;
  abort?: boolean;
  dropSource?: boolean;
  waveSize?: string;
  maxFenced?: string;
  maxRate?: string;
  maxSlotWal?: string;
  copyChunkRows?: string;
  copyParallel?: string;
}

/** Library inputs → the flags that carry them, for error messages. */
const FLAGS = {
  shards: 'argument <shards>',
  shard: 'argument <shards>',
  target: 'option --to',
  mode: 'option --mode',
  'resume+abort': 'options --resume and --abort',
  maxRate: 'option --max-rate',
  maxSlotWal: 'option --max-slot-wal',
  copyChunkRows: 'option --copy-chunk-rows',
  copyParallel: 'option --copy-parallel',
};

export function registerMoveShard(program: Command, ctx: CliContext, done: (code: number) => void): void {
  const command = program
    .command('move-shard')
    .description(
      'move logical shards to another host (online with logical replication, or offline), one batch per source host, resumable',
    )
    .argument('<shards>', 'shard numbers: 17, 0-511, 1,5-9')
    .option('--to <host>', 'the host to move them to (a name from the map)')
    .option(
      '--mode <mode>',
      'online (logical replication, PostgreSQL 15+) or offline (writes fenced during the copy)',
      'online',
    )
    .option('--resume', 'finish the unfinished moves of these shards')
    .option('--abort', 'undo the unfinished moves of these shards')
    .option('--drop-source', 'drop the old copy right after the switch instead of keeping it until gc')
    .option(
      '--wave-size <n>',
      'online: at most this many shards fenced and switched together (default 64; waves are also kept under ~2,000,000 rows)',
    );
  maxFencedOption(command);
  command
    .option(
      '--max-rate <bytes>',
      "the most bytes a second each move's copy may stream, all its connections together (52428800, 50MB, 1GB)",
    )
    .option(
      '--max-slot-wal <bytes>',
      'online: stop the copy (resumable) and drop its slot once the slot holds more WAL than this on the source (2GB)',
    )
    .option(
      '--copy-chunk-rows <n>',
      'online: tables of more rows are copied in chunks of about this many rows, so a resumed copy goes on where it stopped (default 1000000)',
    )
    .option(
      '--copy-parallel <n>',
      "online: connection pairs copying a large table's chunks at once (default: the config's concurrency)",
    );
  dryRunOption(command, 'print the plan and the preflight results; change nothing');
  yesOption(command);
  configOption(command, 'config file (default: $SHARDCTL_CONFIG or ./shardctl.yaml); rewritten in place at the switch');
  jsonOption(command);
  command.action(async (shardsText: string, flags: MoveFlags) => {
    const { checkMoveShards, moveShards, parseShards, shardsPhrase, UsageError } = lib();
    const out = new Output(ctx.streams, flags.json ?? false);
    if (flags.mode !== 'online' && flags.mode !== 'offline') {
      throw new UsageError(`option --mode ${JSON.stringify(flags.mode)}: expected online or offline`);
    }
    if (flags.waveSize !== undefined && !/^[1-9]\d{0,5}$/.test(flags.waveSize)) {
      throw new UsageError(
        `option --wave-size ${JSON.stringify(flags.waveSize)}: expected a whole number from 1 to 999999`,
      );
    }
    const maxFencedMs = parseMaxFenced(flags.maxFenced);
    const maxRate = parseBytes('--max-rate', flags.maxRate);
    const maxSlotWal = parseBytes('--max-slot-wal', flags.maxSlotWal);
    if (flags.copyParallel !== undefined && !/^([1-9]|[1-5]\d|6[0-4])$/.test(flags.copyParallel)) {
      throw new UsageError(
        `option --copy-parallel ${JSON.stringify(flags.copyParallel)}: expected a whole number from 1 to 64`,
      );
    }
    if (flags.copyChunkRows !== undefined && !/^[1-9]\d{0,9}$/.test(flags.copyChunkRows)) {
      throw new UsageError(
        `option --copy-chunk-rows ${JSON.stringify(flags.copyChunkRows)}: expected a whole number of rows from 1 to 9999999999`,
      );
    }
    refuseIdleOptions(command, flags);
    const config = await loadCliConfig(ctx, flags, out);
    const shards = await withFlagNames(FLAGS, async () => parseShards(shardsText, config.shards));
    const which = shardsPhrase(shards);
    // Bad input (an unknown or draining target, shards already there) is named before the question.
    await withFlagNames(FLAGS, async () =>
      checkMoveShards(config, shards, flags.to, { resume: flags.resume ?? false, abort: flags.abort ?? false }),
    );
    if (!flags.dryRun && !flags.yes) {
      const what = flags.abort
        ? `undo the unfinished moves of ${which}`
        : flags.resume
          ? `finish the moves of ${which}`
          : `move ${which} to ${flags.to}`;
      await confirmOrRefuse(ctx.streams, what);
    }
    // A copy still for as long as a host may stay silent before it is checked: said, naming both hosts.
    const view = new MoveProgressView(out, { stallMs: Math.max(...config.hosts.map((h) => h.timeoutMs)) });
    const signals = cutOverSignals((text) => view.warn(text));
    const result = await withFlagNames(FLAGS, () =>
      signals.run(
        moveShards(config, shards, flags.to, {
          mode: flags.mode as MoveMode,
          // Typed with --resume or --abort: must be the mode the move recorded (its default is not).
          ...((flags.resume || flags.abort) && command.getOptionValueSource('mode') === 'cli'
            ? { stated: { mode: flags.mode as MoveMode } }
            : {}),
          dryRun: flags.dryRun ?? false,
          resume: flags.resume ?? false,
          abort: flags.abort ?? false,
          dropSource: flags.dropSource ?? false,
          ...(flags.waveSize === undefined ? {} : { wave: { maxShards: Number(flags.waveSize) } }),
          ...(maxFencedMs === undefined ? {} : { maxFencedMs }),
          ...(maxRate === undefined ? {} : { maxRate }),
          ...(maxSlotWal === undefined ? {} : { maxSlotWal }),
          ...(flags.copyChunkRows === undefined ? {} : { copyChunkRows: Number(flags.copyChunkRows) }),
          ...(flags.copyParallel === undefined ? {} : { copyParallel: Number(flags.copyParallel) }),
          onStep: (_step, detail) => view.info(detail),
          onNotice: (message) => view.warn(message),
          onProgress: (event) => view.update(event),
          signal: signals.signal,
        }),
      ),
    ).finally(() => view.stop());
    print(out, result);
    done(result.outcome === 'dry-run' && result.moves.some((m) => m.preflight.some((c) => !c.ok)) ? 1 : 0);
  });
}

/** --max-fenced, shared with rebalance: the longest a shard may refuse writes in one run. */
export function maxFencedOption(command: Command): Command {
  return command.option(
    '--max-fenced <duration>',
    'online: the longest a shard may refuse writes (500ms, 20s, 1min; default 20s); past it the wave is unfenced and the move stops, resumable',
  );
}

export function parseMaxFenced(text: string | undefined): number | undefined {
  return text === undefined ? undefined : parseDurationOption('--max-fenced', text, 100, 3_600_000);
}

/** A size in bytes: a whole number, or with a unit (kB, MB, GB, TB: 1024-based). */
export function parseBytes(option: string, text: string | undefined): number | undefined {
  if (text === undefined) return undefined;
  const match = /^(\d{1,15})\s*(B|kB|KB|k|MB|M|GB|G|TB|T)?$/.exec(text.trim());
  const power = { B: 0, kB: 1, KB: 1, k: 1, MB: 2, M: 2, GB: 3, G: 3, TB: 4, T: 4 }[match?.[2] ?? 'B'] ?? 0;
  const bytes = match ? Number(match[1]) * 1024 ** power : 0;
  if (!Number.isSafeInteger(bytes) || bytes < 1) {
    const { UsageError } = lib();
    throw new UsageError(
      `option ${option} ${JSON.stringify(text)}: expected a positive number of bytes, like 52428800, 50MB or 1GB`,
    );
  }
  return bytes;
}

function print(out: Output, result: BatchMoveResult): void {
  if (out.json) {
    // A move of one source host prints that move (the shape of a single-shard move); a batch over
    // several source hosts prints the batch with its moves.
    out.data(result.moves.length === 1 ? result.moves[0] : result);
    return;
  }
  for (const move of result.moves) printMove(out, move);
  for (const l of result.leftoversDropped) out.info(`${l.host}: dropped ${l.kind} ${l.name}, left by a killed run`);
  if (result.moves.length > 1 && result.outcome === 'moved') {
    out.line(
      `${result.moves.length} moves to ${result.target}: ${result.rowsMoved} rows verified, longest write block ` +
        `${result.writeBlockedMs === null ? 'none' : `${result.writeBlockedMs} ms`}, total ${seconds(result.durationMs)}`,
    );
  }
}

/** Past this many shards a dry run names the largest only (--json lists every one). */
const SHARDS_LISTED = 64;

function printEstimate(out: Output, estimate: NonNullable<MoveResult['copyEstimate']>): void {
  const size = (bytes: number): string => formatBytes(BigInt(bytes));
  const rate = `${size(estimate.bytesPerSecond)}/s`;
  const from =
    estimate.rateFrom === 'measured'
      ? 'the rate the last copy recorded on these hosts reached'
      : 'a default: no copy recorded on these hosts measured one';
  out.line(
    `  copy: ${size(estimate.bytes)}, ~${estimate.rows.toLocaleString('en-US')} rows; about ` +
      `${durationPhrase(estimate.seconds * 1000)} at ${rate} (${from})`,
  );
  const listed = [...estimate.shards].sort((a, b) => b.bytes - a.bytes || a.shard - b.shard).slice(0, SHARDS_LISTED);
  if (listed.length < estimate.shards.length)
    out.line(`  the ${listed.length} largest of ${estimate.shards.length} shards (--json lists every one):`);
  for (const s of listed.sort((a, b) => a.shard - b.shard))
    out.line(
      `    shard ${s.shard}: ${size(s.bytes)}, ~${s.rows.toLocaleString('en-US')} rows, about ` +
        `${durationPhrase((s.bytes / estimate.bytesPerSecond) * 1000)}`,
    );
}

function printMove(out: Output, move: MoveResult): void {
  const { formatShardList, shardsPhrase } = lib();
  const which = shardsPhrase(move.shards);
  if (move.outcome === 'dry-run') {
    out.line(`move of ${which} from ${move.source} to ${move.target} (${move.mode}) — dry run, nothing changed`);
    for (const check of move.preflight) out.line(`  ${check.ok ? 'ok  ' : 'FAIL'} ${check.name}: ${check.message}`);
    if (move.maxFencedMs !== null)
      out.line(`  fence limit: ${seconds(move.maxFencedMs)} per wave (then unfenced, the move stops, resumable)`);
    if (move.waves.length > 1)
      out.line(
        `  cut-over in ${move.waves.length} waves: ${move.waves.map((w) => formatShardList([...w])).join(' | ')}`,
      );
    out.line(`  steps: ${move.plan.join(' → ')}`);
    if (move.copyEstimate) printEstimate(out, move.copyEstimate);
    return;
  }
  if (move.outcome === 'aborted') {
    out.success(
      `move ${move.moveId} of ${which} aborted: ${move.source} is writable again, nothing left on ${move.target}`,
    );
    return;
  }
  const views =
    move.materializedViews.length > 0
      ? `; materialized views refreshed on ${move.target}: ${move.materializedViews.join(', ')}`
      : '';
  out.line(
    `${which} moved from ${move.source} to ${move.target}: ${move.rowsMoved} rows verified, ` +
      `writes blocked ${move.writeBlockedMs === null ? 'not at all' : `${move.writeBlockedMs} ms`}` +
      `${move.waves.length > 1 ? ` (longest of ${move.waves.length} waves)` : ''}, total ${seconds(move.durationMs)}${views}`,
  );
}

/** The online-only options, as typed, by their keys in MoveFlags. */
const ONLINE_ONLY = [
  ['waveSize', '--wave-size'],
  ['maxSlotWal', '--max-slot-wal'],
  ['copyChunkRows', '--copy-chunk-rows'],
  ['copyParallel', '--copy-parallel'],
] as const;

/**
 * Options that would do nothing in this combination are refused rather than dropped without a word
 * (the operator would think they hold): --drop-source with --abort (the source is kept: the shards
 * stay there), and an online move's options with --mode offline. (A --to or --mode with --resume
 * or --abort must be what the move recorded: checked against its record, moves/resume.ts.)
 */
function refuseIdleOptions(command: Command, flags: MoveFlags): void {
  const { UsageError } = lib();
  if (flags.abort && flags.dropSource)
    throw new UsageError(
      'option --drop-source: with --abort the source copy is kept (the shards stay there); give no --drop-source',
    );
  if (flags.mode === 'offline')
    for (const [key, flag] of ONLINE_ONLY)
      if (flags[key] !== undefined)
        throw new UsageError(
          `option ${flag} ${JSON.stringify(flags[key])}: only for an online move; an offline move fences each shard and copies it whole`,
        );
}
