import { describe, expect, it } from 'vitest';
import { formatLsn, parseLsn, replicaCheckSql, replicaRefusal } from '../../src/router/replicas.js';

describe('the check a replica transaction starts with', () => {
  it('names the shard, the bound and the LSN as validated literals', () => {
    const sql = replicaCheckSql(7, { maxLagMs: 250, afterLsn: '1/a0' });
    expect(sql).toContain("pg_catalog.pg_last_wal_replay_lsn() < '1/A0'::pg_lsn");
    expect(sql).toContain("interval '250 milliseconds'");
    expect(sql).toContain(`WHERE shard = 7 AND state = 'active'`);
    // One plain statement (no DO block to compile per call), whose refusal is its cast failing.
    expect(sql).toMatch(/^SELECT CAST\('shardctl-replica ' \|\| refused AS integer\)/);
    expect(sql).not.toMatch(/\bDO\b|;/);
    expect(replicaCheckSql(7, { maxLagMs: 0 })).not.toContain('replay_lsn() <');
    expect(() => replicaCheckSql(7, { maxLagMs: 0, afterLsn: "0/1'; DROP" })).toThrow(/not an LSN/);
    expect(() => replicaCheckSql(-1, { maxLagMs: 0 })).toThrow(/not a shard number/);
  });
});

describe('LSNs', () => {
  it.each([
    ['0/0', 0n],
    ['0/3000148', 0x3000148n],
    ['16/B374D848', (0x16n << 32n) | 0xb374d848n],
  ])('reads and writes %s', (text, value) => {
    expect(parseLsn(text)).toBe(value);
    expect(formatLsn(value)).toBe(text);
  });

  it.each(['', '0', '0/', '/1', '0/1/2', '123456789/0', "0/1'"])('refuses %j', (text) => {
    expect(parseLsn(text)).toBeUndefined();
  });

  it("tells a standby's refusal from any other error", () => {
    const cast = (reason: string) => `invalid input syntax for type integer: "shardctl-replica ${reason}"`;
    expect(replicaRefusal({ code: '22P02', message: cast('lagging') })).toBe('lagging');
    expect(replicaRefusal({ code: '22P02', message: cast('not-active') })).toBe('not-active');
    expect(replicaRefusal({ code: '22P02', message: cast('something') })).toBeUndefined();
    expect(replicaRefusal({ code: '22P02', message: 'invalid input syntax for type integer: "12a"' })).toBeUndefined();
    expect(replicaRefusal({ code: 'SC100', message: cast('lagging') })).toBeUndefined();
    expect(replicaRefusal(new Error('x'))).toBeUndefined();
  });
});
