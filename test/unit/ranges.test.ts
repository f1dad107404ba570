import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { formatShardList, MAX_SHARD_NUMBER, parseShardList } from '../../src/config/ranges.js';

function shardsOf(text: string): number[] {
  const result = parseShardList(text);
  if ('error' in result) throw new Error(`expected ${JSON.stringify(text)} to parse, got: ${result.error}`);
  return result.shards;
}

function errorOf(text: string): string {
  const result = parseShardList(text);
  if (!('error' in result))
    throw new Error(`expected ${JSON.stringify(text)} to be refused, got ${result.shards.join(',')}`);
  return result.error;
}

/** Distinct shard numbers, ascending, as parseShardList returns them. */
const shardSet = fc
  .uniqueArray(fc.integer({ min: 0, max: 5000 }), { minLength: 1, maxLength: 200 })
  .map((shards) => [...shards].sort((a, b) => a - b));

describe('parseShardList', () => {
  it('reads a single shard', () => {
    expect(shardsOf('17')).toEqual([17]);
    expect(shardsOf('0')).toEqual([0]);
  });

  it('reads an inclusive range', () => {
    const shards = shardsOf('0-1023');
    expect(shards).toHaveLength(1024);
    expect(shards[0]).toBe(0);
    expect(shards.at(-1)).toBe(1023);
  });

  it('reads a mix of ranges and single shards', () => {
    expect(shardsOf('0-2,200,300-302')).toEqual([0, 1, 2, 200, 300, 301, 302]);
  });

  it('returns the shards ascending whatever order they are written in', () => {
    expect(shardsOf('9,0-2,5')).toEqual([0, 1, 2, 5, 9]);
  });

  it('allows spaces around commas and dashes and at either end', () => {
    expect(shardsOf(' 0 - 2 ,5 , 7-8 ')).toEqual([0, 1, 2, 5, 7, 8]);
    expect(shardsOf('3\t-\t4')).toEqual([3, 4]);
  });

  it('accepts a one-shard range', () => {
    expect(shardsOf('4-4')).toEqual([4]);
  });

  it('accepts the largest supported shard number', () => {
    expect(shardsOf(String(MAX_SHARD_NUMBER))).toEqual([MAX_SHARD_NUMBER]);
  });

  it('refuses an empty list, naming the text', () => {
    expect(errorOf('')).toBe('invalid shard list "": the list is empty');
    expect(errorOf('   ')).toContain('"   "');
  });

  it('refuses an empty item between or after commas', () => {
    expect(errorOf('1,,2')).toMatch(/^invalid shard list "1,,2": empty item/);
    expect(errorOf('1,')).toMatch(/^invalid shard list "1,": empty item/);
    expect(errorOf(',1')).toMatch(/^invalid shard list ",1": empty item/);
  });

  it('refuses a reversed range, naming it', () => {
    const error = errorOf('0-1,5-3');
    expect(error).toContain('"0-1,5-3"');
    expect(error).toContain('5-3 runs backwards');
    expect(error).toContain('3-5');
  });

  it('refuses negative shard numbers', () => {
    expect(errorOf('-1')).toContain('negative');
    expect(errorOf('-1')).toContain('"-1"');
    expect(errorOf('3--1')).toContain('negative');
  });

  it("refuses a leading '+'", () => {
    const error = errorOf('+5');
    expect(error).toContain('"+5"');
    expect(error).toContain('without a sign');
  });

  it('refuses leading zeros', () => {
    const error = errorOf('1,007');
    expect(error).toContain('"1,007"');
    expect(error).toContain('"007" has a leading zero (write 7)');
    expect(errorOf('00')).toContain('leading zero');
  });

  it('refuses spaces inside a number', () => {
    const error = errorOf('1 0');
    expect(error).toContain('"1 0" is not a shard number');
  });

  it('refuses numbers that are not plain decimal integers', () => {
    for (const text of ['0x10', '1e3', '1.5', 'one', '٣', '1_000']) {
      const error = errorOf(text);
      expect(error).toContain(JSON.stringify(text));
      expect(error).toContain('is not a shard number');
    }
  });

  it('refuses a range with no end or no start', () => {
    expect(errorOf('5-')).toContain('range "5-" has no end');
    expect(errorOf('1, -5')).toContain('negative');
  });

  it('refuses a range with more than one dash', () => {
    expect(errorOf('1-2-3')).toContain('"2-3" is not a shard number');
  });

  it('refuses shard numbers above the supported maximum instead of building a huge list', () => {
    const text = `0-${MAX_SHARD_NUMBER + 1}`;
    const error = errorOf(text);
    expect(error).toContain(JSON.stringify(text));
    expect(error).toContain(`largest supported shard number ${MAX_SHARD_NUMBER}`);
    expect(errorOf('99999999999999999999999')).toContain('largest supported');
  });

  it('refuses a shard listed twice, naming the repeated shard', () => {
    expect(errorOf('1-5,3')).toBe('invalid shard list "1-5,3": shard 3 is listed more than once');
  });

  it('names repeated shards compactly', () => {
    expect(errorOf('1-5,3-7,9,9')).toBe('invalid shard list "1-5,3-7,9,9": shards 3-5,9 are listed more than once');
    expect(errorOf('0-9,2-3,4-5')).toContain('shards 2-5 are listed more than once');
  });

  it('refuses huge repeated ranges without expanding them', () => {
    const text = Array.from({ length: 50 }, () => `0-${MAX_SHARD_NUMBER}`).join(',');
    expect(errorOf(text)).toContain(`shards 0-${MAX_SHARD_NUMBER} are listed more than once`);
  });

  it('either parses any text into ascending shard numbers or names the text in its error', () => {
    fc.assert(
      fc.property(fc.oneof(fc.string(), fc.stringMatching(/^[0-9 ,+-]{0,12}$/)), (text) => {
        const result = parseShardList(text);
        if ('error' in result) {
          expect(result.error).toContain(JSON.stringify(text));
          return;
        }
        expect(result.shards.length).toBeGreaterThan(0);
        for (const [i, shard] of result.shards.entries()) {
          expect(Number.isInteger(shard) && shard >= 0 && shard <= MAX_SHARD_NUMBER).toBe(true);
          if (i > 0) expect(shard).toBeGreaterThan(result.shards[i - 1]!);
        }
      }),
    );
  });

  it('refuses any list that repeats one of its shards, naming that shard', () => {
    fc.assert(
      fc.property(
        shardSet.chain((shards) => fc.tuple(fc.constant(shards), fc.constantFrom(...shards))),
        ([shards, repeated]) => {
          const error = errorOf(`${formatShardList(shards)},${repeated}`);
          expect(error).toMatch(new RegExp(`shard ${repeated} is listed more than once`));
        },
      ),
    );
  });
});

describe('formatShardList', () => {
  it('writes runs as ranges and lone shards as numbers', () => {
    expect(formatShardList([0, 1, 2, 5, 7, 8])).toBe('0-2,5,7-8');
    expect(formatShardList([17])).toBe('17');
  });

  it('ignores order and repeats', () => {
    expect(formatShardList([5, 0, 2, 1, 2, 5])).toBe('0-2,5');
  });

  it('writes nothing for no shards', () => {
    expect(formatShardList([])).toBe('');
  });

  it('refuses values that are not shard numbers', () => {
    expect(() => formatShardList([1, -1])).toThrow(RangeError);
    expect(() => formatShardList([1.5])).toThrow(RangeError);
  });

  it('round-trips through parseShardList for any set of shards', () => {
    fc.assert(
      fc.property(shardSet, (shards) => {
        expect(shardsOf(formatShardList(shards))).toEqual(shards);
      }),
    );
  });

  it('is the canonical form of any list that parses', () => {
    fc.assert(
      fc.property(shardSet, fc.shuffledSubarray([' ', '  ', '\t']), (shards, padding) => {
        const space = padding.join('');
        const spaced = formatShardList(shards).replace(/[,-]/g, (separator) => `${space}${separator}${space}`);
        expect(formatShardList(shardsOf(spaced))).toBe(formatShardList(shards));
      }),
    );
  });

  it('writes one item per run of consecutive shards', () => {
    fc.assert(
      fc.property(shardSet, (shards) => {
        const runs = shards.filter((shard, i) => i === 0 || shards[i - 1] !== shard - 1).length;
        expect(formatShardList(shards).split(',')).toHaveLength(runs);
      }),
    );
  });
});
