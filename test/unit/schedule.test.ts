import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { RuntimeFailure } from '../../src/errors.js';
import type { PlannedMove } from '../../src/moves/rebalance.js';
import type { BatchMoveResult } from '../../src/moves/run.js';
import { runPlan } from '../../src/moves/schedule.js';

/** The rebalance scheduler on its own: which moves run together, and what a failure stops. */

const HOSTS = ['h1', 'h2', 'h3', 'h4', 'h5'];

const moveArb = fc
  .tuple(fc.constantFrom(...HOSTS), fc.constantFrom(...HOSTS), fc.integer({ min: 0, max: 99 }))
  .filter(([source, target]) => source !== target)
  .map(([source, target, shard]): PlannedMove => ({ source, target, shards: [shard], bytes: 0n }));

const result = { rowsMoved: '0' } as unknown as BatchMoveResult;

/** Runs the plan with moves that take a few ticks each, recording what runs at each start. */
async function schedule(
  moves: readonly PlannedMove[],
  maxParallel: number,
  fail?: (m: PlannedMove) => boolean,
  intoLimit?: (target: string) => number,
) {
  const running = new Set<PlannedMove>();
  const startedTogether: PlannedMove[][] = [];
  const started: PlannedMove[] = [];
  const outcome = await runPlan(
    moves,
    maxParallel,
    async (move) => {
      running.add(move);
      started.push(move);
      startedTogether.push([...running]);
      for (let i = 0; i < 1 + (move.shards[0]! % 3); i += 1) await Promise.resolve();
      running.delete(move);
      if (fail?.(move)) throw new RuntimeFailure('MOVE_FAILED', `move ${move.shards[0]} failed`);
      return result;
    },
    intoLimit,
  ).then(
    (done) => ({ done, error: null }),
    (error: unknown) => ({ done: null, error }),
  );
  return { ...outcome, started, startedTogether };
}

describe('rebalance scheduler (runPlan)', () => {
  it('runs every move once, at most maxParallel at a time, a host never source and target at once, a source giving to one target', async () => {
    await fc.assert(
      fc.asyncProperty(fc.array(moveArb, { maxLength: 12 }), fc.integer({ min: 1, max: 4 }), async (moves, max) => {
        const { done, error, startedTogether } = await schedule(moves, max);
        expect(error).toBeNull();
        expect(done!.map((m) => m.shards[0]).sort()).toEqual(moves.map((m) => m.shards[0]).sort());
        for (const together of startedTogether) {
          expect(together.length).toBeLessThanOrEqual(max);
          const sources = together.map((m) => m.source);
          const targets = together.map((m) => m.target);
          // A source gives to one target at a time, and takes from no one meanwhile.
          expect(new Set(sources).size).toBe(sources.length);
          for (const s of sources) expect(targets).not.toContain(s);
        }
      }),
      { numRuns: 200 },
    );
  });

  it('lets a new host take from several sources at once', async () => {
    const moves = ['h1', 'h2', 'h3'].map((source, i): PlannedMove => ({
      source,
      target: 'h9',
      shards: [i],
      bytes: 0n,
    }));
    const { startedTogether } = await schedule(moves, 3);
    expect(Math.max(...startedTogether.map((t) => t.length))).toBe(3);
  });

  it('a target takes from no more sources at once than its limit (its free replication workers), every move still runs', async () => {
    const moves = ['h1', 'h2', 'h3', 'h4'].map((source, i): PlannedMove => ({
      source,
      target: 'h9',
      shards: [i],
      bytes: 0n,
    }));
    const { done, startedTogether } = await schedule(moves, 4, undefined, (target) => (target === 'h9' ? 2 : 4));
    expect(Math.max(...startedTogether.map((t) => t.length))).toBe(2);
    expect(done!.map((m) => m.shards[0]).sort()).toEqual([0, 1, 2, 3]);
    // A limit of 0 (none free) still lets one run: the move's preflight then says what to raise.
    const none = await schedule(moves, 4, undefined, () => 0);
    expect(Math.max(...none.startedTogether.map((t) => t.length))).toBe(1);
    expect(none.done).toHaveLength(4);
  });

  it('starts nothing after a failure, lets the running moves finish, and names what failed, what was done and what never started', async () => {
    const moves: PlannedMove[] = [
      { source: 'h1', target: 'h2', shards: [0], bytes: 0n },
      { source: 'h3', target: 'h4', shards: [2], bytes: 0n },
      { source: 'h1', target: 'h5', shards: [4], bytes: 0n },
    ];
    const { error, started } = await schedule(moves, 2, (m) => m.shards[0] === 0);
    // Shard 4's move waits for h1, which the failed move held: it never starts.
    expect(started.map((m) => m.shards[0])).toEqual([0, 2]);
    expect(error).toBeInstanceOf(RuntimeFailure);
    const failure = error as RuntimeFailure;
    expect(failure.code).toBe('REBALANCE_FAILED');
    expect(failure.message).toMatch(/1 of 3 moves failed/);
    expect(failure.message).toMatch(/h1 → h2 \(shard 0\) failed: move 0 failed/);
    expect(failure.message).toMatch(/h3 → h4 \(shard 2\) done/);
    expect(failure.message).toMatch(/h1 → h5 \(shard 4\) not started/);
  });
});
