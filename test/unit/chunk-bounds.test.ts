import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { boundsFromHistogram, copySnapshotText, parseCopySnapshot } from '../../src/moves/chunks.js';

/** A histogram of `n` bounds: 0, 100, 200, … as text. */
const histogram = (n: number) => Array.from({ length: n }, (_, i) => String(i * 100));

describe('chunk bounds from the key statistics', () => {
  it('takes every k-th bound of the histogram, leaving out its ends', () => {
    // 100 buckets of 10,000 rows: chunks of 100,000 rows are every 10th bound.
    const bounds = boundsFromHistogram(histogram(101), 1_000_000, 100_000);
    expect(bounds).toEqual(['1000', '2000', '3000', '4000', '5000', '6000', '7000', '8000', '9000']);
  });

  it('gives no bound for a table of one chunk', () => {
    expect(boundsFromHistogram(histogram(101), 50_000, 100_000)).toEqual([]);
  });

  it('refuses a histogram of fewer buckets than the chunks wanted (the keys are read instead)', () => {
    expect(boundsFromHistogram(histogram(11), 1_000_000, 10_000)).toBeNull();
    expect(boundsFromHistogram([], 1_000_000, 10_000)).toBeNull();
  });

  it('leaves out repeated bounds (a first key column of few values)', () => {
    expect(boundsFromHistogram(['1', '1', '1', '1', '2'], 400, 100)).toEqual(['1']);
  });

  it('always returns strictly increasing bounds, fewer than the chunks wanted, from the histogram', () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 2, max: 400 }),
        fc.integer({ min: 1, max: 10_000_000 }),
        fc.integer({ min: 1, max: 1_000_000 }),
        (n, rows, chunkRows) => {
          const h = histogram(n);
          const bounds = boundsFromHistogram(h, rows, chunkRows);
          if (bounds === null) return Math.ceil(rows / chunkRows) > n - 1;
          const numbers = bounds.map(Number);
          return (
            numbers.every((b, i) => i === 0 || b > numbers[i - 1]!) &&
            bounds.length < Math.max(1, Math.ceil(rows / chunkRows)) &&
            bounds.every((b) => h.includes(b) && b !== h[0] && b !== h.at(-1))
          );
        },
      ),
    );
  });
});

describe("a chunk's recorded snapshot", () => {
  it('reads back the timeline and the pg_snapshot it was written with, and nothing else', () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 1, max: 2 ** 31 - 1 }),
        fc.integer({ min: 0, max: Number.MAX_SAFE_INTEGER }),
        fc.bigInt({ min: 3n, max: 2n ** 63n - 1n }),
        fc.array(fc.bigInt({ min: 3n, max: 2n ** 63n - 1n }), { maxLength: 5 }),
        (timeline, startedMs, xmin, running) => {
          const incarnation = `${timeline}.${startedMs}`;
          const snapshot = `${xmin}:${xmin + 10n}:${running.join(',')}`;
          expect(parseCopySnapshot(copySnapshotText(incarnation, snapshot))).toEqual({ incarnation, snapshot });
        },
      ),
    );
    // An attempt recorded without a snapshot, a snapshot without its timeline, anything else.
    for (const text of [null, '', '1234:1240:', '1/1:2:', '1.5/', '1.5/x:y:', 'a.1/1:2:', '1.5/1:2:3;drop'])
      expect(parseCopySnapshot(text)).toBeNull();
  });
});
