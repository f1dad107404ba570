import { describe, expect, it } from 'vitest';
import { columns, formatBytes } from '../../src/cli/output.js';

describe('formatBytes', () => {
  it.each([
    [0n, '0 B'],
    [1023n, '1023 B'],
    [1024n, '1.0 kB'],
    [1536n, '1.5 kB'],
    [1048575n, '1023.9 kB'],
    [1048576n, '1.0 MB'],
    [5n * 1024n ** 4n + 1024n ** 3n * 512n, '5.5 TB'],
    [2n ** 70n, '1048576.0 PB'],
  ])('%s bytes print as %s, from the bigint without rounding up', (bytes, text) => {
    expect(formatBytes(bytes)).toBe(text);
  });
});

describe('columns', () => {
  it('pads every column but the last to its widest cell', () => {
    expect(columns([['move', 'shards'], ['pg1 → pg3', '0-2']], '  ')).toEqual(['  move       shards', '  pg1 → pg3  0-2']);
  });
});
