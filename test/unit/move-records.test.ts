import { describe, expect, it } from 'vitest';
import type { MoveRecord, MoveStep } from '../../src/moves/state.js';
import { reconcileRecords } from '../../src/moves/run.js';

function recorded(step: MoveStep, detail: Record<string, unknown> = {}): MoveRecord {
  return {
    moveId: 'm1',
    shards: [0, 1],
    source: 'pg1',
    target: 'pg2',
    mode: 'online',
    step,
    status: 'running',
    detail,
  };
}

describe('reconcileRecords: the two hosts disagree after a crash between the two updates', () => {
  it('carries on from the earlier step, whichever host has it', () => {
    expect(reconcileRecords(recorded('fenced'), recorded('caught-up'), recorded('fenced')).step).toBe('fenced');
    expect(reconcileRecords(recorded('fenced'), recorded('fenced'), recorded('caught-up')).step).toBe('fenced');
  });

  it('at the same step, the earlier wave wins, and the wave comes with it', () => {
    const { step, detail } = reconcileRecords(
      recorded('synced'),
      recorded('synced', { wave: 2 }),
      recorded('synced', { wave: 1 }),
    );
    expect(step).toBe('synced');
    expect(detail['wave']).toBe(1);
  });

  it("merges the source's detail over the target's (the source is written first, so it is the newer)", () => {
    const { detail } = reconcileRecords(
      recorded('fenced'),
      recorded('caught-up', { fenceStartedAtMs: 2, rowsVerified: '10' }),
      recorded('fenced', { fenceStartedAtMs: 1, marker: 'x' }),
    );
    expect(detail).toEqual({ fenceStartedAtMs: 2, rowsVerified: '10', marker: 'x', wave: 0 });
  });

  it('uses the record that was found when neither host has it any more', () => {
    expect(reconcileRecords(recorded('verified', { wave: 3 }), undefined, undefined)).toEqual({
      step: 'verified',
      detail: { wave: 3 },
    });
  });
});
