import { describe, expect, it } from 'vitest';
import { describeShapeDifference, shapeOutliers, type ShardShape } from '../../src/migrations/rules.js';
import { shapeFingerprintsSql } from '../../src/migrations/shape.js';

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
