import type cliProgress from 'cli-progress';
import { createRequire } from 'node:module';
import type { CopyProgressEvent, MoveProgressEvent } from '../index.js';
import { lib } from './library.js';
import { formatBytes, type Output } from './output.js';

/**
 * A move's copy on stderr: a bar per move (and one for the run) on a terminal, a line every few
 * seconds otherwise, one JSON event a line under --json (the same figures, with the run's totals).
 * The catch-up's lag is said by the engine's notices; under --json it is an event too.
 */

/** Lines without a terminal: one every this often while a copy runs, and at its end. */
const LINE_EVERY_MS = 5000;

const requireCjs = createRequire(import.meta.url);

export interface RunFigures {
  readonly bytes: number;
  readonly totalBytes: number;
  readonly rows: number;
  readonly totalRows: number;
  readonly bytesPerSecond: number | null;
  readonly etaMs: number | null;
}

/** The run's figures: every move's latest, summed; the ETA from the summed rate. */
export function runFigures(moves: Iterable<CopyProgressEvent>): RunFigures {
  let bytes = 0;
  let totalBytes = 0;
  let rows = 0;
  let totalRows = 0;
  let rate: number | null = null;
  let running = 0;
  for (const m of moves) {
    bytes += m.bytes;
    totalBytes += m.totalBytes;
    rows += m.rows;
    totalRows += m.totalRows;
    if (!m.done) running += 1;
    if (m.bytesPerSecond !== null && !m.done) rate = (rate ?? 0) + m.bytesPerSecond;
  }
  const etaMs = running === 0 ? 0 : rate ? Math.round(((totalBytes - bytes) / rate) * 1000) : null;
  return { bytes, totalBytes, rows, totalRows, bytesPerSecond: rate, etaMs };
}

/** A duration for a person: 42 s, 3 min 5 s, 2 h 10 min. */
export function durationPhrase(ms: number): string {
  const s = Math.round(ms / 1000);
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
  return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
}

function bytesText(n: number): string {
  return formatBytes(BigInt(Math.round(n)));
}

/** The figures in words: `1.2 GB of 2.3 GB, 4,100,000 of 8,500,000 rows, 95.1 MB/s, 12 s left`. */
export function figuresPhrase(f: RunFigures): string {
  const rate = f.bytesPerSecond === null ? 'rate not measured yet' : `${bytesText(f.bytesPerSecond)}/s`;
  const eta = f.etaMs === null ? 'time left unknown' : `${durationPhrase(f.etaMs)} left`;
  return (
    `${bytesText(f.bytes)} of ~${bytesText(f.totalBytes)}, ${f.rows.toLocaleString('en-US')} of ~` +
    `${f.totalRows.toLocaleString('en-US')} rows, ${rate}, ${eta}`
  );
}

export class MoveProgressView {
  readonly #out: Output;
  readonly #moves = new Map<string, CopyProgressEvent>();
  /** Per move: its bytes, since when it has had them, and whether its stall was said. */
  readonly #progress = new Map<string, { bytes: number; since: number; said: boolean }>();
  readonly #stallMs: number;
  #watch: NodeJS.Timeout | undefined;
  readonly #multi: cliProgress.MultiBar | null;
  readonly #bars = new Map<string, cliProgress.SingleBar>();
  #runBar: cliProgress.SingleBar | null = null;
  #lastLine = -Infinity;
  #stopped = false;

  /**
   * `stallMs`: a copy that moves no byte for this long is said to (once per stall, as a warning
   * naming both hosts): the copy reports only while bytes flow, so a host that stopped answering
   * would otherwise leave the last line standing until the move stops naming it. 0: never.
   */
  constructor(out: Output, { stallMs = 0 }: { readonly stallMs?: number } = {}) {
    this.#out = out;
    this.#stallMs = stallMs;
    const bars =
      Boolean(out.streams.stderr.isTTY) && !out.json ? (requireCjs('cli-progress') as typeof cliProgress) : null;
    this.#multi = bars
      ? new bars.MultiBar(
          {
            stream: out.streams.stderr as NodeJS.WriteStream,
            format: ' {name} [{bar}] {percentage}% {figures}',
            hideCursor: true,
            clearOnComplete: false,
            // Redrawn only when an event comes (the engine reports twice a second while bytes flow).
            noTTYOutput: false,
            autopadding: true,
          },
          bars.Presets.shades_classic,
        )
      : null;
  }

  /** A line from the engine (a step done, a notice): above the bars while they are drawn. */
  info(text: string): void {
    if (this.#multi && this.#bars.size > 0 && !this.#stopped) this.#multi.log(`${lib().redact(text)}\n`);
    else this.#out.info(text);
  }

  warn(text: string): void {
    this.info(`${this.#out.paint('33', 'warning:')} ${text}`);
  }

  update(event: MoveProgressEvent): void {
    if (event.kind === 'copy') {
      this.#moves.set(event.moveId, event);
      this.#noteProgress(event);
    }
    const run = runFigures(this.#moves.values());
    if (this.#out.json) {
      this.#out.streams.stderr.write(
        `${lib().redactedJson({ event: 'move-progress', ...event, ...(event.kind === 'copy' ? { run } : {}) })}\n`,
      );
      return;
    }
    if (event.kind !== 'copy') return;
    if (this.#multi) {
      this.#draw(event, run);
      return;
    }
    const all = [...this.#moves.values()];
    // The last figures once every copy is done, unless they were all over within a second.
    const finished = all.every((m) => m.done) && all.some((m) => m.elapsedMs >= 1000);
    if (!finished && (event.bytes === 0 || performance.now() - this.#lastLine < LINE_EVERY_MS)) return;
    this.#lastLine = performance.now();
    const lines = all.map((m) => `copy ${m.source} → ${m.target}: ${figuresPhrase(m)}`);
    if (all.length > 1) lines.push(`copy, all moves: ${figuresPhrase(run)}`);
    for (const line of lines) this.#out.info(line);
  }

  #draw(event: CopyProgressEvent, run: RunFigures): void {
    const multi = this.#multi!;
    if (this.#stopped) return;
    let bar = this.#bars.get(event.moveId);
    const payload = { name: `${event.source} → ${event.target}`, figures: figuresPhrase(event) };
    if (!bar) {
      bar = multi.create(Math.max(1, event.totalBytes), event.bytes, payload);
      this.#bars.set(event.moveId, bar);
    }
    bar.setTotal(Math.max(1, event.totalBytes));
    bar.update(event.bytes, payload);
    if (this.#moves.size > 1) {
      const runPayload = { name: 'all moves', figures: figuresPhrase(run) };
      this.#runBar ??= multi.create(Math.max(1, run.totalBytes), run.bytes, runPayload);
      this.#runBar.setTotal(Math.max(1, run.totalBytes));
      this.#runBar.update(run.bytes, runPayload);
    }
    if ([...this.#moves.values()].every((m) => m.done)) this.stop();
  }

  #noteProgress(event: CopyProgressEvent): void {
    const known = this.#progress.get(event.moveId);
    if (!known || known.bytes !== event.bytes)
      this.#progress.set(event.moveId, { bytes: event.bytes, since: performance.now(), said: false });
    if (this.#stallMs > 0 && !this.#watch && !event.done && !this.#stopped) {
      this.#watch = setInterval(() => this.#sayStalls(), Math.min(1000, this.#stallMs));
      this.#watch.unref();
    }
  }

  #sayStalls(): void {
    let running = false;
    for (const [moveId, progress] of this.#progress) {
      const move = this.#moves.get(moveId);
      if (!move || move.done) continue;
      running = true;
      const still = performance.now() - progress.since;
      if (progress.said || still < this.#stallMs) continue;
      progress.said = true;
      this.warn(
        `copy ${move.source} → ${move.target}: no byte copied for ${durationPhrase(still)}; it goes on when ` +
          `the copy does, and stops naming the host if ${move.source} or ${move.target} stopped answering`,
      );
    }
    if (!running || this.#stopped) this.#endWatch();
  }

  #endWatch(): void {
    if (this.#watch) clearInterval(this.#watch);
    this.#watch = undefined;
  }

  /** The bars end where they are (at the end of the copy, or when the command ends). */
  stop(): void {
    this.#endWatch();
    if (this.#stopped) return;
    this.#stopped = true;
    // Drawn now with the last figures (and the lines logged since the last frame): the timer that
    // redraws the bars may not have run since the last event.
    this.#multi?.update();
    this.#multi?.stop();
  }
}
