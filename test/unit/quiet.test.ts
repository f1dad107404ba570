import { describe, expect, it } from 'vitest';
import { BUSY, retryLockWaits, retryWhileBusy } from '../../src/pg/quiet.js';
import { describePgError } from '../../src/fleet/connect.js';
import { isLostConnection } from '../../src/pg/ended.js';
import { allOrNone } from '../../src/promises.js';

const failure = (code: string) => Object.assign(new Error(code), { code });

describe('retryLockWaits', () => {
  it('tries again while a lock wait runs out, until the attempt succeeds', async () => {
    let calls = 0;
    await retryLockWaits(async () => {
      calls += 1;
      if (calls < 3) throw failure(calls === 1 ? '55P03' : '40P01');
    }, performance.now() + 10_000);
    expect(calls).toBe(3);
  });

  it('throws any other error at once, and a lock wait past the deadline', async () => {
    let calls = 0;
    await expect(
      retryLockWaits(async () => {
        calls += 1;
        throw failure('42P01');
      }, performance.now() + 10_000),
    ).rejects.toMatchObject({ code: '42P01' });
    expect(calls).toBe(1);
    await expect(
      retryLockWaits(async () => {
        throw failure('55P03');
      }, performance.now() - 1),
    ).rejects.toMatchObject({ code: '55P03' });
    // Codes beyond the default are retried only when named.
    await expect(
      retryLockWaits(async () => {
        throw failure('57014');
      }, performance.now() + 10_000),
    ).rejects.toMatchObject({ code: '57014' });
    let statementTimeouts = 0;
    await retryLockWaits(
      async () => {
        if (statementTimeouts++ === 0) throw failure('57014');
      },
      performance.now() + 10_000,
      ['57014'],
    );
    expect(statementTimeouts).toBe(2);
  });
});

describe('allOrNone', () => {
  it('gives every value when all opened', async () => {
    const closed: number[] = [];
    const values = await allOrNone(Promise.allSettled([Promise.resolve(1), Promise.resolve(2)]), async (v) => {
      closed.push(v);
    });
    expect(values).toEqual([1, 2]);
    expect(closed).toEqual([]);
  });

  it('closes the ones that opened and throws the first failure in order', async () => {
    const closed: number[] = [];
    const settling = Promise.allSettled([
      Promise.resolve(1),
      Promise.reject(failure('first')),
      Promise.resolve(3),
      Promise.reject(failure('second')),
    ]);
    await expect(
      allOrNone(settling, async (v) => {
        closed.push(v);
      }),
    ).rejects.toThrow('first');
    expect(closed).toEqual([1, 3]);
  });
});

describe('retryWhileBusy (the one loop that waits for busy tables)', () => {
  it("tries again while the attempt says BUSY, tells `busy` each time, and returns the attempt's value", async () => {
    const told: number[] = [];
    const value = await retryWhileBusy(
      async (n) => (n < 3 ? BUSY : `done at ${n}`),
      (attempts) => {
        told.push(attempts);
      },
    );
    expect(value).toBe('done at 3');
    expect(told).toEqual([1, 2]);
  });

  it('stops with the error `busy` throws, without another attempt', async () => {
    let attempts = 0;
    await expect(
      retryWhileBusy(
        async () => {
          attempts += 1;
          return BUSY;
        },
        () => {
          throw new Error('gave up');
        },
      ),
    ).rejects.toThrow('gave up');
    expect(attempts).toBe(1);
  });
});

describe('a lost connection in words', () => {
  const lost = ' (the connection was lost: the server stopped or restarted, or the network dropped it)';

  it.each([
    [new Error('Connection terminated unexpectedly'), `Connection terminated unexpectedly${lost}`],
    [Object.assign(new Error('read ECONNRESET'), { code: 'ECONNRESET' }), `read ECONNRESET${lost}`],
    // A connection refused was never made: not said as one lost.
    [
      Object.assign(new Error('connect ECONNREFUSED 127.0.0.1:5432'), { code: 'ECONNREFUSED' }),
      'connect ECONNREFUSED 127.0.0.1:5432 (nothing accepts connections there: the server is down or restarting, or the address is wrong)',
    ],
    [
      new Error('Client has encountered a connection error and is not queryable'),
      `Client has encountered a connection error and is not queryable${lost}`,
    ],
    // The server's own words already say it.
    [failure('57P01'), '57P01 (SQLSTATE 57P01)'],
    [failure('23505'), '23505 (SQLSTATE 23505)'],
    [new Error('something else'), 'something else'],
  ])('%s', (error, text) => {
    expect(describePgError(error)).toBe(text);
  });

  it('isLostConnection counts the server shutting down too, unless only the driver-worded ones are asked for', () => {
    expect(isLostConnection(failure('57P01'))).toBe(true);
    expect(isLostConnection(failure('08006'))).toBe(true);
    expect(isLostConnection(failure('57P01'), { worded: true })).toBe(false);
    expect(isLostConnection(failure('23505'))).toBe(false);
  });

  it('isLostConnection: a connection exception the server sent as a plain ERROR left the session as it was', () => {
    const withSeverity = (code: string, severity: string) => Object.assign(failure(code), { severity });
    // A Bind with the wrong number of parameters: 08P01 as an ERROR, the connection fine.
    expect(isLostConnection(withSeverity('08P01', 'ERROR'))).toBe(false);
    expect(isLostConnection(withSeverity('08P01', 'FATAL'))).toBe(true);
    expect(isLostConnection(withSeverity('08006', 'FATAL'))).toBe(true);
  });
});
