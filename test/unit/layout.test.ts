import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import {
  decodeId,
  DEFAULT_ID_LAYOUT,
  encodeId,
  layoutEndUnixMs,
  maxTimeOffsetMs,
  parseIdString,
  timeBits,
  type IdLayout,
} from '../../src/id/layout.js';
import { shardForKey } from '../../src/id/routing.js';

const layouts = fc
  .record({ shardBits: fc.integer({ min: 1, max: 20 }), sequenceBits: fc.integer({ min: 1, max: 20 }) })
  .map(({ shardBits, sequenceBits }): IdLayout => ({ epochMs: DEFAULT_ID_LAYOUT.epochMs, shardBits, sequenceBits }));

describe('id layout', () => {
  it('keeps the sign bit free: 40 time bits with the defaults, running out 2^40 ms after the epoch (June 2046)', () => {
    expect(timeBits(DEFAULT_ID_LAYOUT)).toBe(40);
    expect(new Date(Number(layoutEndUnixMs(DEFAULT_ID_LAYOUT))).toISOString()).toBe('2046-06-27T17:00:49.497Z');
  });

  it('round-trips every (time, shard, sequence) through encode and decode, and ids are never negative', () => {
    fc.assert(
      fc.property(layouts, fc.bigInt({ min: 0n, max: (1n << 61n) - 1n }), fc.nat(), fc.nat(), (layout, t, s, q) => {
        const offset = t % (maxTimeOffsetMs(layout) + 1n);
        const shard = s % 2 ** layout.shardBits;
        const sequence = q % 2 ** layout.sequenceBits;
        const id = encodeId({ unixMs: layout.epochMs + offset, shard, sequence }, layout);
        expect(id).toBeGreaterThanOrEqual(0n);
        expect(id).toBeLessThan(1n << 63n);
        const decoded = decodeId(id, layout);
        expect([decoded.unixMs - layout.epochMs, decoded.shard, decoded.sequence]).toEqual([offset, shard, sequence]);
      }),
    );
  });

  it('orders ids by time first, whatever the shard and sequence', () => {
    fc.assert(
      fc.property(
        fc.bigInt({ min: 0n, max: maxTimeOffsetMs(DEFAULT_ID_LAYOUT) - 1n }),
        fc.nat(8191),
        fc.nat(8191),
        fc.nat(1023),
        fc.nat(1023),
        (t, s1, s2, q1, q2) => {
          const earlier = encodeId(
            { unixMs: DEFAULT_ID_LAYOUT.epochMs + t, shard: s1, sequence: q1 },
            DEFAULT_ID_LAYOUT,
          );
          const later = encodeId(
            { unixMs: DEFAULT_ID_LAYOUT.epochMs + t + 1n, shard: s2, sequence: q2 },
            DEFAULT_ID_LAYOUT,
          );
          expect(later > earlier).toBe(true);
        },
      ),
    );
  });

  it("decodes the Instagram post's example: 1387263000 ms after the epoch, shard 1341, sequence 905", () => {
    const id = (1387263000n << 23n) | (1341n << 10n) | 905n;
    const decoded = decodeId(id, DEFAULT_ID_LAYOUT);
    expect(decoded.unixMs).toBe(1314220021721n + 1387263000n);
    expect(decoded.shard).toBe(1341);
    expect(decoded.sequence).toBe(905);
    expect(decoded.timestamp).toBe(new Date(1314220021721 + 1387263000).toISOString());
  });

  it('refuses a time past the layout or before the epoch instead of wrapping', () => {
    expect(() =>
      encodeId({ unixMs: layoutEndUnixMs(DEFAULT_ID_LAYOUT), shard: 0, sequence: 0 }, DEFAULT_ID_LAYOUT),
    ).toThrow(/past the end of the layout.*40 time bits/);
    expect(() =>
      encodeId({ unixMs: DEFAULT_ID_LAYOUT.epochMs - 1n, shard: 0, sequence: 0 }, DEFAULT_ID_LAYOUT),
    ).toThrow(/before the layout's epoch/);
    expect(() => encodeId({ unixMs: DEFAULT_ID_LAYOUT.epochMs, shard: 8192, sequence: 0 }, DEFAULT_ID_LAYOUT)).toThrow(
      /shard 8192 does not fit in 13 bits/,
    );
  });

  it('parses ids strictly as decimal 64-bit integers, keeping digits a JavaScript number would lose', () => {
    expect(parseIdString('9223372036854775807')).toBe(9223372036854775807n);
    expect(parseIdString('4035075668629787649')).toBe(4035075668629787649n);
    for (const bad of ['9223372036854775808', '-1', '1e5', '0x10', ' 1', '', '12.0'])
      expect(parseIdString(bad)).toBeUndefined();
  });
});

describe('shardForKey', () => {
  it('routes like Instagram: user 31341 with 2000 shards goes to shard 1341', () => {
    expect(shardForKey(31341n, 2000)).toBe(1341);
    expect(shardForKey(31341, 2000)).toBe(1341);
  });

  it('takes bigint keys beyond 2^53 exactly and refuses unsafe numbers', () => {
    expect(shardForKey(9007199254740993n, 8192)).toBe(Number(9007199254740993n % 8192n));
    expect(() => shardForKey(2 ** 60, 8192)).toThrow(/not a safe integer/);
    expect(() => shardForKey(-1n, 8192)).toThrow(/negative/);
    expect(shardForKey(2n ** 63n - 1n, 8192)).toBe(Number((2n ** 63n - 1n) % 8192n));
    expect(() => shardForKey(2n ** 63n, 8192)).toThrow(/key 9223372036854775808 is beyond a PostgreSQL bigint/);
    expect(() => shardForKey(2n ** 64n, 8192)).toThrow(/beyond a PostgreSQL bigint/);
  });
});
