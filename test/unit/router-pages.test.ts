import { describe, expect, it } from 'vitest';
import { UsageError } from '../../src/errors.js';
import { DEFAULT_ID_LAYOUT, decodeId, encodeId } from '../../src/id/layout.js';
import {
  BIGINT_TYPES,
  decodeCursor,
  encodeCursor,
  pageSql,
  repeatedId,
  settledIdBound,
} from '../../src/router/pages.js';

describe('queryPage', () => {
  it('asks each shard only for rows past the cursor and at most limit, its bounds bound after the caller’s parameters', () => {
    expect(
      pageSql('select id from photos where user_id = $1', { idColumn: 'id', order: 'newest', params: 1, cursor: true }),
    ).toBe(
      'SELECT * FROM (\nselect id from photos where user_id = $1\n) AS shardctl_page WHERE "id" < $2::bigint ORDER BY "id" DESC LIMIT $3',
    );
    expect(
      pageSql('select id from photos -- c', { idColumn: 'photo id', order: 'oldest', params: 0, cursor: false }),
    ).toBe('SELECT * FROM (\nselect id from photos -- c\n) AS shardctl_page ORDER BY "photo id" ASC LIMIT $1');
  });

  it('with minAgeMs, bounds the ids from above too: the cursor, then the settled bound, then the limit', () => {
    expect(
      pageSql('select id from e where k = $1', {
        idColumn: 'id',
        order: 'oldest',
        params: 1,
        cursor: true,
        below: true,
      }),
    ).toBe(
      'SELECT * FROM (\nselect id from e where k = $1\n) AS shardctl_page WHERE "id" > $2::bigint AND "id" < $3::bigint ORDER BY "id" ASC LIMIT $4',
    );
    expect(
      pageSql('select id from e', { idColumn: 'id', order: 'oldest', params: 0, cursor: false, below: true }),
    ).toBe('SELECT * FROM (\nselect id from e\n) AS shardctl_page WHERE "id" < $1::bigint ORDER BY "id" ASC LIMIT $2');
  });

  it('settles the ids of a millisecond and all before it, none after; nothing before the epoch', () => {
    const layout = DEFAULT_ID_LAYOUT;
    const ms = layout.epochMs + 1_000_000n;
    const bound = settledIdBound(layout, ms);
    const last = encodeId(
      { unixMs: ms, shard: 2 ** layout.shardBits - 1, sequence: 2 ** layout.sequenceBits - 1 },
      layout,
    );
    expect(last < bound).toBe(true);
    expect(bound).toBe(last + 1n);
    expect(decodeId(bound, layout)).toMatchObject({ unixMs: ms + 1n, shard: 0, sequence: 0 });
    expect(settledIdBound(layout, layout.epochMs - 1n)).toBe(0n);
    expect(settledIdBound(layout, layout.epochMs)).toBe(1n << BigInt(layout.shardBits + layout.sequenceBits));
  });

  it.each([
    { ids: [], repeated: undefined },
    { ids: [5n, 4n, 3n], repeated: undefined },
    { ids: [5n, 4n, 4n, 3n], repeated: 4n },
    { ids: [1n, 2n, 3n, 3n], repeated: 3n },
    { ids: [2n ** 60n + 1n, 2n ** 60n + 1n], repeated: 2n ** 60n + 1n },
  ])('finds the id two neighbouring rows share: $ids', ({ ids, repeated }) => {
    expect(repeatedId(ids)).toBe(repeated);
  });

  it('keeps ids past 2^53 exact in the cursor, and refuses a cursor that is not one or is of the other order', () => {
    const id = 9_007_199_254_740_993n;
    const cursor = encodeCursor('newest', id);
    expect(decodeCursor(cursor, 'newest')).toBe(id);
    expect(Buffer.from(cursor, 'base64url').toString()).toBe('v1:newest:9007199254740993');
    expect(() => decodeCursor(cursor, 'oldest')).toThrow(UsageError);
    expect(() => decodeCursor('x', 'newest')).toThrow(/^cursor "x": is not a cursor of queryPage$/);
    expect(() => decodeCursor(encodeCursor('newest', 2n ** 63n), 'newest')).toThrow(UsageError);
  });
});

describe('BIGINT_TYPES (queryPage and shardctl/kysely rows)', () => {
  const parser = (oid: number) =>
    (BIGINT_TYPES.getTypeParser as (oid: number, format: 'text') => (value: string) => unknown)(oid, 'text');

  it('parses int8 and the elements of int8[] (any dimension, NULLs kept) as bigint', () => {
    const int8 = parser(20);
    expect(int8('4041927405051319296')).toBe(4041927405051319296n);
    const int8Array = parser(1016);
    expect(int8Array('{9007199254740993,NULL,-2}')).toEqual([9007199254740993n, null, -2n]);
    expect(int8Array('{{1,2},{3,4}}')).toEqual([
      [1n, 2n],
      [3n, 4n],
    ]);
    expect(int8Array('{}')).toEqual([]);
    // Other types are pg's: int4[] stays numbers, text[] strings.
    expect(parser(1007)('{1,2}')).toEqual([1, 2]);
    expect(parser(1009)('{1,2}')).toEqual(['1', '2']);
  });
});
