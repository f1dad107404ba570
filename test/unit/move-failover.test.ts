import { describe, expect, it } from 'vitest';
import { slotUnusable } from '../../src/moves/failover-state.js';
import { createMoveSlotCommand, subscriptionConnectionSql } from '../../src/moves/sql/failover.js';
import { createSubscriptionSql } from '../../src/moves/sql/replication.js';

describe("a move's failover SQL", () => {
  it('creates a failover slot from PostgreSQL 17 on, and the plain exported-snapshot slot before', () => {
    expect(createMoveSlotCommand('shardctl_move_x', 170000)).toBe(
      `CREATE_REPLICATION_SLOT "shardctl_move_x" LOGICAL pgoutput (SNAPSHOT 'export', FAILOVER true)`,
    );
    expect(createMoveSlotCommand('shardctl_move_x', 160004)).toBe(
      'CREATE_REPLICATION_SLOT "shardctl_move_x" LOGICAL pgoutput EXPORT_SNAPSHOT',
    );
  });

  it('gives the subscription failover = true only when asked', () => {
    expect(createSubscriptionSql('m', 'postgres://a/b', true, false, true)).toMatch(
      /enabled = false, failover = true\)$/,
    );
    expect(createSubscriptionSql('m', 'postgres://a/b', true)).not.toContain('failover');
  });

  it("points the subscription at the source's address, quoted", () => {
    expect(subscriptionConnectionSql('m', "postgres://u:p'w@h/d")).toBe(
      `ALTER SUBSCRIPTION "m" CONNECTION 'postgres://u:p''w@h/d'`,
    );
  });

  it.each([
    [undefined, /does not exist/],
    [{ wal_status: 'lost' }, /invalidated \(the WAL it needs is gone\)/],
    [{ wal_status: 'reserved', conflicting: true }, /conflict with recovery/],
    [{ wal_status: 'reserved', invalidation_reason: 'wal_removed' }, /invalidated \(wal_removed\)/],
  ])('calls slot %j unusable', (slot, why) => {
    expect(slotUnusable(slot)).toMatch(why);
  });

  it('calls a slot usable whatever columns its major has', () => {
    expect(slotUnusable({ wal_status: 'reserved' })).toBeNull();
    expect(
      slotUnusable({ wal_status: 'extended', conflicting: false, invalidation_reason: null, synced: true }),
    ).toBeNull();
  });
});
