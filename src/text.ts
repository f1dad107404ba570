/**
 * The words of messages that depend on a count: one rule for English plurals, so every message
 * says "1 shard" and "2 shards" the same way.
 */

/** `word` for one, `many` (by default word + "s") for any other count: inflect(n, 'is', 'are'). */
export function inflect(n: number, word: string, many = `${word}s`): string {
  return n === 1 ? word : many;
}

/** The count and its word: plural(1, 'shard') is "1 shard", plural(3, 'shard') is "3 shards". */
export function plural(n: number, word: string, many = `${word}s`): string {
  return `${n} ${inflect(n, word, many)}`;
}

/** The bytes in a person's words: 1024-based, one decimal. */
export function bytesPhrase(bytes: number): string {
  const units = ['B', 'kB', 'MB', 'GB', 'TB'];
  let unit = 0;
  let value = bytes;
  while (unit < units.length - 1 && value >= 1024) {
    value /= 1024;
    unit += 1;
  }
  return unit === 0 ? `${bytes} B` : `${value.toFixed(1)} ${units[unit]}`;
}
