/**
 * Every `next:` the CLI prints is the command that moves the user forward, checked against the real
 * situation it follows.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { init } from '../../src/commands/init.js';
import { killedAfter, seed } from '../helpers/faults.js';
import { type Fleet, makeFleet, runCli } from '../helpers/fleet.js';
import { adminClient, useTestDatabases } from '../helpers/hosts.js';
import { removeCliSnapshot } from '../helpers/moves.js';

const db = useTestDatabases(2);
afterAll(removeCliSnapshot);

describe('status after a failed move', () => {
  let fleet: Fleet;

  beforeAll(async () => {
    fleet = makeFleet({ urls: db.urls, shards: 4, split: ['0-1', '2-3'] });
    expect((await init(await fleet.config())).ok).toBe(true);
    const source = await adminClient(db.urls[0]!);
    try {
      await seed(source, 0, 400);
    } finally {
      await source.end();
    }
  });

  it('names --resume or --abort for the incoming copy, never a setval on it', async () => {
    await killedAfter(fleet, 0, 'synced');
    const run = await runCli(['status', '-c', fleet.configFile]);
    expect(run.code).toBe(3);
    expect(run.stdout + run.stderr).not.toMatch(/setval/i);
    expect(run.stdout).toContain('arriving by a move');
    expect(run.stderr).toContain('next: shardctl move-shard 0 --resume, or shardctl move-shard 0 --abort');

    // The advice moves the fleet forward: after the abort status is ok and has nothing to advise.
    const abort = await runCli(['move-shard', '0', '--abort', '--yes', '-c', fleet.configFile]);
    expect(abort.code, abort.stderr).toBe(0);
    const after = await runCli(['status', '-c', fleet.configFile]);
    expect(after.code, after.stdout).toBe(0);
    expect(after.stderr).not.toContain('next:');
  });
});

describe('rebalance onto a host that was never initialised', () => {
  const oldDb = useTestDatabases(2);
  const newDb = useTestDatabases(1);
  let fleet: Fleet;

  beforeAll(async () => {
    // pg3 added to the map with no shards (as `dev add-host` does), never initialised.
    fleet = makeFleet({ urls: [...oldDb.urls, ...newDb.urls], shards: 6, split: ['0-2', '3-5', ''] });
    const config = await fleet.config();
    expect((await init({ ...config, hosts: config.hosts.slice(0, 2) })).ok).toBe(true);
  });

  it('--dry-run prints the plan and says up front that the run would refuse, and to run init', async () => {
    const run = await runCli(['rebalance', '--dry-run', '-c', fleet.configFile]);
    expect(run.stdout).toMatch(/→ pg3/);
    expect(run.stderr).toContain('pg3 has no shardctl control schema');
    expect(run.stderr.trimEnd().split('\n').at(-1)).toBe('next: shardctl init');
    expect(run.code).toBe(1);
  });

  it('--yes refuses before moving anything, and its next step is init, not rebalance', async () => {
    const run = await runCli(['rebalance', '--yes', '-c', fleet.configFile]);
    expect(run.code).toBe(1);
    expect(run.stderr).toContain('pg3 has no shardctl control schema');
    expect(run.stderr).toContain('next: shardctl init');
    expect(run.stderr).not.toContain('next: shardctl rebalance');
    const source = await adminClient(oldDb.urls[0]!);
    try {
      expect((await source.query('select count(*)::int as n from shardctl.moves')).rows[0]).toEqual({ n: 0 });
    } finally {
      await source.end();
    }
  });

  it('after init, the dry run plans without a refusal', async () => {
    expect((await runCli(['init', '-c', fleet.configFile])).code).toBe(0);
    const run = await runCli(['rebalance', '--dry-run', '-c', fleet.configFile]);
    expect(run.code, run.stderr).toBe(0);
    expect(run.stdout).toMatch(/→ pg3/);
    expect(run.stderr).not.toContain('control schema');
    expect(run.stderr).not.toContain('next:');
  });
});
