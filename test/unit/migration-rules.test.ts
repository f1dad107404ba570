import { describe, expect, it } from 'vitest';
import type { MigrationFile } from '../../src/migrations/files.js';
import {
  describeRollout,
  driftProblems,
  fileRollout,
  fleetLevel,
  pendingMigrations,
  shardDrift,
  shardLevel,
} from '../../src/migrations/rules.js';

const file = (version: number, checksum = `c${version}`): MigrationFile => ({
  version,
  name: `000${version}_m${version}`,
  path: `/m/000${version}_m${version}.sql`,
  sql: '',
  checksum,
  noTransaction: false,
  lockTimeout: null,
  statementTimeout: null,
  statements: [],
});
const applied = (...versions: number[]): Map<number, string> => new Map(versions.map((v) => [v, `c${v}`]));
const FILES = [file(1), file(2), file(3)];

describe('migration rules', () => {
  it('a shard is at the highest version applied to it', () => {
    expect(shardLevel(undefined)).toBe(0);
    expect(shardLevel(applied(1, 3))).toBe(3);
  });

  it.each([
    { have: [], pending: [1, 2, 3] },
    { have: [1], pending: [2, 3] },
    { have: [1, 2, 3], pending: [] },
    { have: [1, 3], pending: [] }, // 2 is out of order: drift, not pending
  ])('with $have applied, $pending are pending', ({ have, pending }) => {
    expect(pendingMigrations(applied(...have), FILES).map((m) => m.version)).toEqual(pending);
  });

  it('names changed, deleted and out-of-order files with the shards they concern', () => {
    const problems = driftProblems(
      'pg1',
      new Map([
        [0, applied(1, 3)],
        [
          1,
          new Map([
            [1, 'edited'],
            [2, 'c2'],
            [3, 'c3'],
            [4, 'c4'],
          ]),
        ],
      ]),
      new Map([[4, '0004_gone']]),
      FILES,
    );
    expect(problems.map((p) => [p.kind, p.version, p.shards])).toEqual([
      ['drift', 1, [1]],
      ['missing-file', 4, [1]],
      ['out-of-order', 2, [0]],
    ]);
    expect(problems[1]!.message).toBe(
      'host pg1: 0004_gone.sql (version 4) is applied to shard 1 but no file in the migrations folder has that version; restore it',
    );
  });

  it('finds the drift of one shard, and the fleet level over hosts', () => {
    expect(
      shardDrift(
        new Map([
          [1, 'edited'],
          [2, 'c2'],
          [9, 'c9'],
        ]),
        FILES,
      ),
    ).toEqual([1, 9]);
    expect(fleetLevel([new Map([[0, applied(1)]]), new Map([[5, applied(1, 2)]])])).toBe(2);
    expect(fleetLevel([new Map([[0, applied()]])])).toBeNull();
  });
});

describe('a rollout in progress', () => {
  it('counts per file the shards it is applied to, listing only the files not yet on every shard', () => {
    const atTwo = applied(1, 2);
    const shards = [atTwo, atTwo, applied(1, 2, 3), applied(1), undefined];
    const rollout = fileRollout(FILES, shards);
    expect(rollout).toEqual([
      { name: '0001_m1', version: 1, applied: 4, shards: 5 },
      { name: '0002_m2', version: 2, applied: 3, shards: 5 },
      { name: '0003_m3', version: 3, applied: 1, shards: 5 },
    ]);
    expect(describeRollout(rollout)).toEqual([
      '0001_m1: 4 of 5 shards',
      '0002_m2: 3 of 5 shards',
      '0003_m3: 1 of 5 shards',
    ]);
    expect(fileRollout(FILES, [applied(1, 2, 3), applied(1, 2, 3)])).toEqual([]);
  });
});
