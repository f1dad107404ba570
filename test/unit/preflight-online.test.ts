import { describe, expect, it } from 'vitest';
import { onlineChecks } from '../../src/moves/preflight-online.js';

const pg15 = { num: 150004, text: '15.4' };
const ready = { wal_level: 'logical', free_slots: 2, free_senders: 3 };
const workers = { workers: 1, slots: 4 };
const table = (name: string, identity = true, logged = true) => ({ name, identity, logged });

describe('onlineChecks (the preflight of an online move)', () => {
  it('passes a source and target ready for logical replication, naming what it found', () => {
    const checks = onlineChecks([pg15, pg15], 'pg1', 'pg2', ready, [table('insta0.users')], workers);
    expect(checks.map((c) => [c.name, c.ok])).toEqual([
      ['versions', true],
      ['wal_level', true],
      ['replication slots', true],
      ['replication workers', true],
      ['replica identity', true],
      ['logged tables', true],
    ]);
    expect(checks[2]!.message).toBe('2 free replication slots and 3 free WAL senders on pg1');
    expect(checks[3]!.message).toBe('3 of 4 logical replication workers free on pg2');
  });

  it('refuses what logical replication cannot do, saying what to change', () => {
    const checks = onlineChecks(
      [{ num: 140010, text: '14.10' }, pg15],
      'pg1',
      'pg2',
      { wal_level: 'replica', free_slots: 0, free_senders: 1 },
      [table('insta0.a', false), table('insta0.b', true, false)],
      { workers: 4, slots: 4 },
    );
    expect(checks.filter((c) => c.ok)).toEqual([]);
    expect(checks.map((c) => c.message)).toEqual([
      'PostgreSQL 14.10 on pg1, 15.4 on pg2; online mode needs 15 or later on both (use --mode offline)',
      'wal_level=replica on pg1; set wal_level=logical and restart it, or use --mode offline',
      '0 free replication slots and 1 free WAL senders on pg1; raise max_replication_slots / max_wal_senders',
      "0 of 4 logical replication workers free on pg2; the move's subscription would wait for one: raise max_logical_replication_workers (and max_worker_processes) on pg2 and restart it, or let its other subscriptions end first",
      'table insta0.a has no replica identity; add a primary key or ALTER TABLE … REPLICA IDENTITY FULL, or use --mode offline',
      'table insta0.b is UNLOGGED, which logical replication does not carry; ALTER TABLE … SET LOGGED, or use --mode offline (which copies them with writes fenced)',
    ]);
  });

  it('says that a target with no worker slots at all could never run the subscription', () => {
    const checks = onlineChecks([pg15, pg15], 'pg1', 'pg2', ready, [], { workers: 0, slots: 0 });
    expect(checks.find((c) => c.name === 'replication workers')).toEqual({
      name: 'replication workers',
      ok: false,
      message:
        "0 of 0 logical replication workers free on pg2; the move's subscription could never run there: raise max_logical_replication_workers (and max_worker_processes) on pg2 and restart it, or use --mode offline",
    });
  });

  it('names five tables and counts the rest', () => {
    const tables = Array.from({ length: 7 }, (_, i) => table(`insta0.t${i}`, false));
    const [, , , , identity] = onlineChecks([pg15, pg15], 'pg1', 'pg2', ready, tables, workers);
    expect(identity!.message).toMatch(
      /^tables insta0\.t0, insta0\.t1, insta0\.t2, insta0\.t3, insta0\.t4 and 2 more have no replica identity;/,
    );
  });
});
