import { describe, expect, it } from 'vitest';
import { describeShapeDifference, shapeOutliers, type ShardShape } from '../../src/migrations/rules.js';
import { evenSample, shapeFingerprintsSql, shapesAgree } from '../../src/migrations/shape.js';

const shape = (shard: number, fingerprint: string, level = '1,2'): ShardShape => ({
  shard,
  host: 'pg1',
  level,
  fingerprint,
});

describe('shapeOutliers', () => {
  it('names the shards whose shape differs from most shards of the same migrations, with a reference of the majority', () => {
    expect(shapeOutliers([shape(0, 'a'), shape(1, 'b'), shape(2, 'a'), shape(3, 'a'), shape(4, 'c')])).toEqual([
      { shard: 1, reference: 0 },
      { shard: 4, reference: 0 },
    ]);
  });

  it('compares only shards of the same migrations', () => {
    expect(shapeOutliers([shape(0, 'a'), shape(1, 'a'), shape(2, 'b', '1,2,3'), shape(3, 'b', '1,2,3')])).toEqual([]);
  });

  it.each([
    ['two shards that differ', [shape(0, 'a'), shape(1, 'b')]],
    ['a tie', [shape(0, 'a'), shape(1, 'a'), shape(2, 'b'), shape(3, 'b')]],
    ['one shard', [shape(0, 'a')]],
  ])('names nobody when there is no telling which is right: %s', (_name, shapes) => {
    expect(shapeOutliers(shapes)).toEqual([]);
  });
});

describe('describeShapeDifference', () => {
  const reference = [
    { table: 'photos', column: 'id', type: 'bigint' },
    { table: 'photos', column: 'caption', type: 'text' },
    { table: 'likes', column: 'id', type: 'bigint' },
  ];

  it('names a column added, one dropped, a changed type, and whole tables', () => {
    const mine = [
      { table: 'photos', column: 'id', type: 'integer' },
      { table: 'photos', column: 'hotfix', type: 'integer' },
      { table: 'extra', column: 'id', type: 'bigint' },
    ];
    expect(describeShapeDifference('insta7', mine, 'insta0', reference)).toEqual([
      'table insta7.extra is not in insta0',
      'table likes of insta0 is missing in insta7',
      'column insta7.photos.id is integer, bigint in insta0',
      'table insta7.photos has a column hotfix (integer) that insta0 lacks',
      'table insta7.photos lacks the column caption (text) of insta0',
    ]);
  });

  it('says when only the column order differs, and nothing when the columns are the same', () => {
    expect(
      describeShapeDifference('insta7', [reference[1]!, reference[0]!, reference[2]!], 'insta0', reference),
    ).toEqual(['the columns of insta7 are in another order than in insta0']);
    expect(describeShapeDifference('insta7', reference, 'insta0', reference)).toEqual([]);
  });
});

describe('shapeFingerprintsSql', () => {
  it('reads the active shards of the host, or only the listed ones, written as checked integers', () => {
    expect(shapeFingerprintsSql()).toContain("WHERE c.state = 'active' AND true\n");
    expect(shapeFingerprintsSql([3, 17])).toContain(
      "WHERE c.state = 'active' AND c.shard = ANY(ARRAY[3, 17]::int[])\n",
    );
    expect(shapeFingerprintsSql()).toContain('FROM "shardctl".shards c');
  });

  it.each([[-1], [1.5], [Number.NaN]])('refuses shard %s, naming it', (shard) => {
    expect(() => shapeFingerprintsSql([0, shard])).toThrow(`not a shard number: ${shard}`);
  });
});

describe('the shapes a move compares its batch with first (evenSample, shapesAgree)', () => {
  it('samples the other shards evenly, leaving the batch out; all of them when there are few', () => {
    const host = Array.from({ length: 20 }, (_, i) => i);
    expect(evenSample(host, 4, new Set([10, 11, 12, 13, 14, 15, 16, 17, 18, 19]))).toEqual([0, 2, 5, 7]);
    expect(evenSample(host, 64, new Set([0, 1]))).toEqual(host.slice(2));
    expect(evenSample([], 64, new Set())).toEqual([]);
  });

  it('agrees when each level of the batch has one fingerprint, also held by a shard outside the batch', () => {
    const batch = new Set([0, 1]);
    expect(shapesAgree([shape(0, 'a'), shape(1, 'a'), shape(7, 'a'), shape(9, 'b', '1')], batch)).toBe(true);
  });

  it.each([
    ['a batch shard differs', [shape(0, 'a'), shape(1, 'b'), shape(7, 'a'), shape(8, 'a')]],
    ['a sampled shard differs from the batch', [shape(0, 'a'), shape(1, 'a'), shape(7, 'b')]],
    ['no shard outside the batch has its level', [shape(0, 'a', '1'), shape(1, 'a', '1'), shape(7, 'a')]],
    ['nothing but the batch was read', [shape(0, 'a'), shape(1, 'a')]],
  ])('sends the preflight to read the hosts whole when %s', (_name, shapes) => {
    expect(shapesAgree(shapes, new Set([0, 1]))).toBe(false);
  });
});
