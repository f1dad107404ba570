import { describe, expect, it } from 'vitest';
import type { HostConfig } from '../../src/config/types.js';
import { lockRetryPauseMs } from '../../src/provisioning/lock-wait.js';
import { canaryShards, type HostPlan, type Plan } from '../../src/provisioning/plan.js';

function plan(jobsPerHost: Record<string, number[]>): Plan {
  const hosts: HostPlan[] = Object.entries(jobsPerHost).map(([name, shards]) => ({
    host: { name } as HostConfig,
    missingShards: [],
    controlSql: null,
    upToDate: 0,
    jobs: shards.map((shard) => ({
      shard,
      schema: `insta${shard}`,
      creates: false,
      reinstallsNextId: false,
      migrations: [],
      steps: [],
    })),
  }));
  return { hosts, migrations: [], targetVersion: 1 };
}

describe('canary shards', () => {
  it.each([
    [3, { pg1: [0, 1, 2], pg2: [40, 41], pg3: [] }, [0, 1, 40]],
    [4, { pg1: [0, 1, 2], pg2: [40, 41], pg3: [80] }, [0, 1, 40, 80]],
    [5, { pg1: [5, 9, 12], pg2: [40] }, [5, 9, 12, 40]],
    [1, { pg1: [], pg2: [41, 42] }, [41]],
    [2, { pg1: [], pg2: [] }, []],
  ])('takes %i shards with work to do, each host in turn', (count, jobs, expected) => {
    expect(canaryShards(plan(jobs), count)).toEqual(expected);
  });
});

describe('the pause before a lock retry', () => {
  it('doubles from 1 s up to 30 s, varied by a quarter either way', () => {
    expect([0, 1, 2, 3, 4, 5, 6, 10].map((retry) => lockRetryPauseMs(retry, () => 0.5))).toEqual([
      1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000,
    ]);
    expect(lockRetryPauseMs(0, () => 0)).toBe(750);
    expect(lockRetryPauseMs(2, () => 1)).toBe(5000);
  });
});
