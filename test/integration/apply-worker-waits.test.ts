import { describe, expect, it } from 'vitest';
import type { MoveContext } from '../../src/moves/context.js';
import { applyWorkerWaits } from '../../src/moves/replication.js';
import { useTestDatabases, withClient } from '../helpers/hosts.js';

const db = useTestDatabases(1);

/**
 * While a move catches up, its notices say what the target's apply worker is doing; when there is
 * none, why, as far as the target tells (replication.ts whyNoApplyWorker).
 */
describe("a move's notice when its subscription has no apply worker", () => {
  it('says that the subscription is gone, or disabled', async () => {
    await withClient(db.urls[0]!, async (client) => {
      const ctx = (name: string) => ({ name, target: { client } }) as unknown as MoveContext;
      expect(await applyWorkerWaits(ctx('shardctl_no_such_move'))).toBe(
        'its apply worker is not running: its subscription is gone',
      );
      await client.query(
        `create subscription shardctl_waits_test connection 'dbname=postgres' publication none_here with (connect = false, slot_name = none)`,
      );
      try {
        expect(await applyWorkerWaits(ctx('shardctl_waits_test'))).toBe(
          'its apply worker is not running: its subscription is disabled',
        );
      } finally {
        await client.query('drop subscription shardctl_waits_test');
      }
    });
  });
});
