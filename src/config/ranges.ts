/**
 * Shard lists as people write them: "0-1023", "0-99,200,300-399", "17".
 *
 * Used for the config's `hosts[].shards` and for command-line arguments, so every error names the
 * text it was given.
 */
import { UsageError } from '../errors.js';
import { inflect } from '../text.js';

/**
 * The largest shard number a list may name. Far above any useful shard count (each shard is a
 * schema), and low enough that "0-9999999999" is refused instead of filling memory.
 */
export const MAX_SHARD_NUMBER = 2 ** 20 - 1;

export type ShardListResult = { shards: number[] } | { error: string };

interface ShardRange {
  readonly first: number;
  readonly last: number;
}

/** Parses a shard list strictly; on success the shards are ascending and distinct. */
export function parseShardList(text: string): ShardListResult {
  const ranges = parseRanges(text);
  if ('error' in ranges) return { error: `invalid shard list ${JSON.stringify(text)}: ${ranges.error}` };
  const sorted = [...ranges.ranges].sort((a, b) => a.first - b.first);
  const repeated = repeatedShards(sorted);
  if (repeated.length > 0) {
    const what = formatRanges(repeated);
    const listed = /^\d+$/.test(what) ? `shard ${what} is` : `shards ${what} are`;
    return { error: `invalid shard list ${JSON.stringify(text)}: ${listed} listed more than once` };
  }
  return { shards: sorted.flatMap(expandRange) };
}

/** "shard 5" or "shards 0-2,5": the word agrees with the number of entries, the list is formatShardList's. */
export function shardsPhrase(shards: readonly number[]): string {
  return `${inflect(shards.length, 'shard')} ${formatShardList(shards)}`;
}

/** The shortest list naming exactly these shards, e.g. [0,1,2,5] → "0-2,5". Order and repeats are ignored. */
export function formatShardList(shards: readonly number[]): string {
  for (const shard of shards) {
    if (!Number.isSafeInteger(shard) || shard < 0) throw new RangeError(`not a shard number: ${shard}`);
  }
  const sorted = [...new Set(shards)].sort((a, b) => a - b);
  const ranges: ShardRange[] = [];
  for (const shard of sorted) {
    const previous = ranges.at(-1);
    if (previous && previous.last + 1 === shard) ranges[ranges.length - 1] = { first: previous.first, last: shard };
    else ranges.push({ first: shard, last: shard });
  }
  return formatRanges(ranges);
}

function parseRanges(text: string): { ranges: ShardRange[] } | { error: string } {
  if (text.trim() === '') return { error: 'the list is empty' };
  const ranges: ShardRange[] = [];
  for (const rawItem of text.split(',')) {
    const item = rawItem.replace(/^[ \t]+|[ \t]+$/g, '');
    const range = parseItem(item);
    if ('error' in range) return range;
    ranges.push(range);
  }
  return { ranges };
}

function parseItem(item: string): ShardRange | { error: string } {
  if (item === '') return { error: 'empty item (two commas in a row, or a comma at either end)' };
  if (item.startsWith('-')) return { error: `${JSON.stringify(item)}: shard numbers cannot be negative` };
  const dash = item.indexOf('-');
  if (dash === -1) {
    const shard = parseShardNumber(item);
    return typeof shard === 'number' ? { first: shard, last: shard } : shard;
  }
  const first = parseShardNumber(item.slice(0, dash).replace(/[ \t]+$/, ''));
  if (typeof first !== 'number') return first;
  const lastText = item.slice(dash + 1).replace(/^[ \t]+/, '');
  if (lastText === '') return { error: `range ${JSON.stringify(item)} has no end` };
  if (lastText.startsWith('-')) return { error: `${JSON.stringify(item)}: shard numbers cannot be negative` };
  const last = parseShardNumber(lastText);
  if (typeof last !== 'number') return last;
  if (last < first) return { error: `range ${first}-${last} runs backwards (write ${last}-${first})` };
  return { first, last };
}

function parseShardNumber(text: string): number | { error: string } {
  if (/^[0-9]+$/.test(text)) {
    if (text.length > 1 && text.startsWith('0')) {
      return { error: `${JSON.stringify(text)} has a leading zero (write ${text.replace(/^0+(?=.)/, '')})` };
    }
    const shard = Number(text);
    if (shard > MAX_SHARD_NUMBER) {
      return { error: `shard ${text} is above the largest supported shard number ${MAX_SHARD_NUMBER}` };
    }
    return shard;
  }
  if (text.startsWith('+')) return { error: `${JSON.stringify(text)}: write shard numbers without a sign` };
  return { error: `${JSON.stringify(text)} is not a shard number (expected decimal digits)` };
}

/** Given ranges sorted by start: the shards covered more than once, as merged ranges. */
function repeatedShards(sorted: readonly ShardRange[]): ShardRange[] {
  const repeated: ShardRange[] = [];
  let coveredUpTo = -1;
  for (const range of sorted) {
    if (range.first <= coveredUpTo) {
      const overlap = { first: range.first, last: Math.min(range.last, coveredUpTo) };
      const previous = repeated.at(-1);
      if (previous && overlap.first <= previous.last + 1) {
        repeated[repeated.length - 1] = { first: previous.first, last: Math.max(previous.last, overlap.last) };
      } else {
        repeated.push(overlap);
      }
    }
    coveredUpTo = Math.max(coveredUpTo, range.last);
  }
  return repeated;
}

function expandRange(range: ShardRange): number[] {
  return Array.from({ length: range.last - range.first + 1 }, (_, i) => range.first + i);
}

function formatRanges(ranges: readonly ShardRange[]): string {
  return ranges.map((r) => (r.first === r.last ? `${r.first}` : `${r.first}-${r.last}`)).join(',');
}

/**
 * A shard list given to a command ("17", "100-199", "1,5-9"), checked against the shard count.
 * Throws a UsageError naming the input `shards` and the text.
 */
export function parseShards(text: string, shardCount: number): number[] {
  const parsed = parseShardList(text);
  if ('error' in parsed)
    throw new UsageError(parsed.error.replace(`invalid shard list ${JSON.stringify(text)}: `, ''), {
      input: 'shards',
      value: text,
    });
  const outside = parsed.shards.filter((s) => s >= shardCount);
  if (outside.length > 0)
    throw new UsageError(`shard ${outside[0]} is out of range 0-${shardCount - 1}`, { input: 'shards', value: text });
  return parsed.shards;
}
