import { describe, expect, it } from 'vitest';
import { elapsed } from '../../src/clock.js';
import { shardsPhrase } from '../../src/config/ranges.js';
import { inflect, plural } from '../../src/text.js';

describe('words that agree with a count', () => {
  it.each([
    [0, 'shards'],
    [1, 'shard'],
    [2, 'shards'],
  ])('inflect(%i, "shard") is %j', (n, word) => expect(inflect(n, 'shard')).toBe(word));

  it('takes an irregular plural', () => {
    expect(inflect(1, 'is', 'are')).toBe('is');
    expect(inflect(3, 'is', 'are')).toBe('are');
    expect(plural(2, 'copy', 'copies')).toBe('2 copies');
  });

  it('puts the count before the word', () => {
    expect(plural(1, 'problem')).toBe('1 problem');
    expect(plural(0, 'problem')).toBe('0 problems');
  });

  it.each([
    [[5], 'shard 5'],
    [[2, 0, 1, 5], 'shards 0-2,5'],
    [[3, 3], 'shards 3'],
  ])('shardsPhrase(%j) is %j', (shards, phrase) => expect(shardsPhrase(shards)).toBe(phrase));
});

describe('elapsed', () => {
  it('is whole milliseconds since a performance.now() reading', () => {
    const ms = elapsed(performance.now() - 1500.4);
    expect(Number.isInteger(ms)).toBe(true);
    expect(ms).toBeGreaterThanOrEqual(1500);
    expect(ms).toBeLessThan(2500);
  });
});
