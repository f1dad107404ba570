/**
 * withConnection's contract (src/router/connection.ts), the path every routed call takes: the
 * connection is released exactly once, destroyed (released with an error) when the work failed or
 * marked it broken, never released when checking out failed; the call settles with the work's
 * value or error, or with the release's own error when releasing throws.
 */
import type pg from 'pg';
import { describe, expect, it } from 'vitest';
import { withConnection } from '../../src/router/connection.js';

/** A pooled client that records its releases (the argument pg-pool takes: an error destroys it). */
function fakeClient(releaseThrows?: Error): { client: pg.PoolClient; releases: (Error | boolean | undefined)[] } {
  const releases: (Error | boolean | undefined)[] = [];
  const client = {
    release(destroy?: Error | boolean) {
      releases.push(destroy);
      if (releaseThrows) throw releaseThrows;
    },
  } as unknown as pg.PoolClient;
  return { client, releases };
}

describe('withConnection', () => {
  it("resolves with the work's value and gives the connection back once, not destroyed", async () => {
    const { client, releases } = fakeClient();
    await expect(
      withConnection(
        () => Promise.resolve(client),
        () => Promise.resolve(42),
      ),
    ).resolves.toBe(42);
    expect(releases).toEqual([undefined]);
  });

  it("rejects with the work's error and destroys the connection (rejected or thrown)", async () => {
    const failure = new Error('work failed');
    for (const work of [
      () => Promise.reject(failure),
      (): Promise<never> => {
        throw failure;
      },
    ]) {
      const { client, releases } = fakeClient();
      await expect(withConnection(() => Promise.resolve(client), work)).rejects.toBe(failure);
      expect(releases).toEqual([failure]);
    }
  });

  it('destroys a connection the work marked broken, and still resolves with its value', async () => {
    const { client, releases } = fakeClient();
    const lost = new Error('commit outcome unknown');
    const value = await withConnection(
      () => Promise.resolve(client),
      (lease) => {
        lease.broken(lost);
        return Promise.resolve('done');
      },
    );
    expect(value).toBe('done');
    expect(releases).toEqual([lost]);
  });

  it('rejects without a release when checking out fails (rejected or thrown)', async () => {
    const refused = new Error('cannot connect');
    let worked = false;
    const work = (): Promise<void> => {
      worked = true;
      return Promise.resolve();
    };
    await expect(withConnection(() => Promise.reject(refused), work)).rejects.toBe(refused);
    await expect(
      withConnection((): Promise<pg.PoolClient> => {
        throw refused;
      }, work),
    ).rejects.toBe(refused);
    expect(worked).toBe(false);
  });

  it("rejects with the release's error when giving the connection back throws", async () => {
    const doubleRelease = new Error('Release called on client which has already been released to the pool.');
    const { client, releases } = fakeClient(doubleRelease);
    await expect(
      withConnection(
        () => Promise.resolve(client),
        () => Promise.resolve(1),
      ),
    ).rejects.toBe(doubleRelease);
    expect(releases).toEqual([undefined]);
    const failing = fakeClient(doubleRelease);
    await expect(
      withConnection(
        () => Promise.resolve(failing.client),
        () => Promise.reject(new Error('work failed')),
      ),
    ).rejects.toBe(doubleRelease);
  });
});
