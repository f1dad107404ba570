import { PassThrough } from 'node:stream';
import { afterEach, beforeAll, describe, expect, it, vi } from 'vitest';
import { loadLibrary } from '../../src/cli/library.js';
import { MoveProgressView } from '../../src/cli/move-progress.js';
import { Output } from '../../src/cli/output.js';
import type { CopyProgressEvent } from '../../src/moves/copy-meter.js';

function capture(): { output: Output; text: () => string } {
  let text = '';
  const stderr = new PassThrough();
  stderr.setEncoding('utf8').on('data', (chunk: string) => (text += chunk));
  const stdout = new PassThrough();
  return { output: new Output({ stdout, stderr, env: {} }, false), text: () => text };
}

function copied(bytes: number, done = false): CopyProgressEvent {
  return {
    kind: 'copy',
    moveId: 'm1',
    source: 'pg1',
    target: 'pg3',
    bytes,
    totalBytes: 80_000_000,
    rows: bytes / 100,
    totalRows: 800_000,
    bytesPerSecond: null,
    etaMs: null,
    elapsedMs: 1000,
    done,
  };
}

describe('MoveProgressView: a copy that stands still', () => {
  beforeAll(async () => {
    await loadLibrary();
  });
  afterEach(() => {
    vi.useRealTimers();
  });

  it('is said once per stall, naming both hosts, after stallMs without a byte; not when bytes flow, nor after the copy is done', async () => {
    vi.useFakeTimers({ toFake: ['setInterval', 'clearInterval', 'performance'] });
    const { output, text } = capture();
    const view = new MoveProgressView(output, { stallMs: 10_000 });
    const said = () =>
      text()
        .split('\n')
        .filter((l) => l.includes('no byte copied')).length;
    view.update(copied(1_000_000));
    for (let i = 1; i <= 12; i++) {
      await vi.advanceTimersByTimeAsync(1000);
      view.update(copied(1_000_000 + i * 100_000));
    }
    expect(said()).toBe(0);
    await vi.advanceTimersByTimeAsync(9_000);
    expect(said()).toBe(0);
    await vi.advanceTimersByTimeAsync(2_000);
    expect(said()).toBe(1);
    expect(text()).toMatch(/warning: copy pg1 → pg3: no byte copied for 1[01] s; it goes on when the copy does/);
    await vi.advanceTimersByTimeAsync(30_000);
    expect(said()).toBe(1);
    // Bytes again, then a second stall: said again.
    view.update(copied(3_000_000));
    await vi.advanceTimersByTimeAsync(11_000);
    expect(said()).toBe(2);
    view.update(copied(80_000_000, true));
    await vi.advanceTimersByTimeAsync(60_000);
    expect(said()).toBe(2);
    view.stop();
  });

  it('says nothing without a bound (stallMs 0)', async () => {
    vi.useFakeTimers({ toFake: ['setInterval', 'clearInterval', 'performance'] });
    const { output, text } = capture();
    const view = new MoveProgressView(output);
    view.update(copied(1_000_000));
    await vi.advanceTimersByTimeAsync(120_000);
    expect(text()).not.toContain('no byte copied');
    view.stop();
  });
});
