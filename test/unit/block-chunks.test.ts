import { describe, expect, it } from 'vitest';
import { blockBounds, blockCountSql } from '../../src/moves/block-chunks.js';
import { chunkCopyOutSql } from '../../src/moves/chunks.js';

describe('the block chunks of a keyless table', () => {
  it.each([
    { blocks: 1000, rows: 100_000, chunkRows: 10_000, bounds: 9, first: '(100,0)', last: '(900,0)' },
    { blocks: 1000, rows: 100_000, chunkRows: 30_000, bounds: 3, first: '(300,0)', last: '(900,0)' },
    // More chunks than blocks would make: one block each.
    { blocks: 5, rows: 100_000, chunkRows: 100, bounds: 4, first: '(1,0)', last: '(4,0)' },
  ])('cuts $blocks blocks of $rows rows every $chunkRows rows', ({ blocks, rows, chunkRows, bounds, first, last }) => {
    const cut = blockBounds(blocks, rows, chunkRows);
    expect(cut).toHaveLength(bounds);
    expect([cut[0], cut.at(-1)]).toEqual([first, last]);
  });

  it.each([
    { blocks: 0, rows: 0 },
    { blocks: 1, rows: 50_000 },
    { blocks: 100, rows: 10_000 },
  ])('leaves $blocks blocks of $rows rows in one range', ({ blocks, rows }) => {
    expect(blockBounds(blocks, rows, 10_000)).toEqual([]);
  });

  it('reads a range of blocks by ctid, the bounds as tid literals', () => {
    expect(
      chunkCopyOutSql('"insta1"."events"', ['"a"', '"b"'], { key: 'ctid', lo: '(10,0)', hi: '(20,0)' }, false),
    ).toBe(`COPY (SELECT "a", "b" FROM "insta1"."events" WHERE ctid >= '(10,0)' AND ctid < '(20,0)') TO STDOUT`);
  });

  it('counts the blocks of a quoted table name, quoted again as a literal', () => {
    expect(blockCountSql(`"insta1"."it's"`)).toBe(
      `SELECT (pg_relation_size('"insta1"."it''s"'::regclass) / current_setting('block_size')::bigint)::float8 AS blocks`,
    );
  });
});
