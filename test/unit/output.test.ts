import { describe, expect, it } from 'vitest';
import { columns, formatBytes, nextLine } from '../../src/cli/output.js';
import { formatShardList } from '../../src/config/ranges.js';
import { HostError, resumeOrAbort, RuntimeFailure, StaleMapError } from '../../src/errors.js';
import { groupFailures } from '../../src/router/errors.js';
import { firstSqlState, hasSqlState, isSqlState } from '../../src/pg/sqlstate.js';

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
    expect(
      columns(
        [
          ['move', 'shards'],
          ['pg1 → pg3', '0-2'],
        ],
        '  ',
      ),
    ).toEqual(['  move       shards', '  pg1 → pg3  0-2']);
  });
});

describe("an error's next steps", () => {
  it('the CLI words them as the commands a person types', () => {
    expect(nextLine(resumeOrAbort([0, 1, 2, 3]), formatShardList)).toBe(
      'next: shardctl move-shard 0-3 --resume, or shardctl move-shard 0-3 --abort',
    );
    expect(nextLine([{ action: 'resume', shards: [5] }], formatShardList)).toBe('next: shardctl move-shard 5 --resume');
    expect(nextLine([{ action: 'rebalance' }], formatShardList)).toBe('next: shardctl rebalance');
    expect(nextLine([{ action: 'map-pull' }], formatShardList)).toBe('next: shardctl map pull');
    expect(new StaleMapError('/f.yaml', ['shard 3: file pg1, fleet pg2'], {}).next).toEqual([{ action: 'map-pull' }]);
  });

  it('merges the steps of one action over several moves into one command', () => {
    expect(nextLine([...resumeOrAbort([4, 5]), ...resumeOrAbort([0, 1])], formatShardList)).toBe(
      'next: shardctl move-shard 0-1,4-5 --resume, or shardctl move-shard 0-1,4-5 --abort',
    );
  });

  it('are data in the error and its JSON, and absent from the JSON when there are none', () => {
    const error = new HostError('pg1', 'the fence timed out; resume the move to retry, or abort it', {
      shard: 3,
      next: resumeOrAbort([3]),
    });
    expect(error.next).toEqual([
      { action: 'resume', shards: [3] },
      { action: 'abort', shards: [3] },
    ]);
    expect(error.toJSON().next).toEqual(error.next);
    expect(error.message).not.toMatch(/--/);
    expect(new RuntimeFailure('NO_MOVE', 'nothing to resume').toJSON()).not.toHaveProperty('next');
  });
});

describe('groupFailures', () => {
  it("groups a host's failures by reason, naming shards and host once; an error about another host keeps its own location", () => {
    const down = (shard: number) =>
      new HostError('pg2', 'cannot connect: timeout expired', { shard, code: 'HOST_UNREACHABLE' });
    const groups = groupFailures([
      { shard: 4, host: 'pg2', error: down(4) },
      { shard: 5, host: 'pg2', error: down(5) },
      { shard: 7, host: 'pg2', error: down(7) },
      { shard: 9, host: 'pg1', error: new HostError('pg3', 'cannot connect: refused', { shard: 9 }) },
      {
        shard: 10,
        host: 'pg1',
        error: Object.assign(new Error('relation "photos" does not exist'), { code: '42P01' }),
      },
    ]);
    expect(groups.map((g) => g.line)).toEqual([
      'shards 4-5,7 on pg2: cannot connect: timeout expired',
      'shard 9 on pg1: host pg3, shard 9: cannot connect: refused',
      'shard 10 on pg1: relation "photos" does not exist (SQLSTATE 42P01)',
    ]);
  });
});

describe('HostError.forShard', () => {
  it("is the same failure on another shard: code, cause, details and data kept, the location the new shard's", () => {
    const cause = new Error('timeout expired');
    const met = new HostError('pg2', 'cannot connect: timeout expired', {
      shard: 35,
      code: 'HOST_UNREACHABLE',
      cause,
      data: { address: 'db2:5432' },
      details: ['tried db2:5432'],
    });
    const other = met.forShard(40);
    expect(other.message).toBe('host pg2, shard 40: cannot connect: timeout expired');
    expect([other.host, other.shard, other.code, other.cause, other.details]).toEqual([
      'pg2',
      40,
      'HOST_UNREACHABLE',
      cause,
      ['tried db2:5432'],
    ]);
    expect(other.data).toEqual({ host: 'pg2', shard: 40, address: 'db2:5432' });
    expect(met.forShard(41, 'cannot connect (not tried)').reason).toBe('cannot connect (not tried)');
  });
});

describe('SQLSTATEs on an error and what it wraps', () => {
  it('finds the first SQLSTATE up to three causes deep, and no errno or code of ours', () => {
    const denied = Object.assign(new Error('permission denied for schema shardctl'), { code: '42501' });
    const wrapped = new HostError('pg1', 'cannot read', { code: 'HOST_UNREACHABLE', cause: denied });
    expect(firstSqlState(wrapped)).toBe('42501');
    expect(hasSqlState(wrapped, '42501')).toBe(true);
    const refused = Object.assign(new Error('connect ECONNREFUSED'), { code: 'ECONNREFUSED' });
    expect(firstSqlState(new HostError('pg1', 'cannot connect', { code: 'HOST_UNREACHABLE', cause: refused }))).toBe(
      undefined,
    );
    const deep = new Error('a', { cause: new Error('b', { cause: new Error('c', { cause: denied }) }) });
    expect(firstSqlState(deep)).toBe('42501');
    expect(firstSqlState(new Error('a', { cause: deep }))).toBe(undefined);
    expect(isSqlState('08006')).toBe(true);
    expect(isSqlState('HOST_UNREACHABLE')).toBe(false);
  });
});
