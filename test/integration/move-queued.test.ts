/**
 * A move-shard that waited for the runner locks behind another move of the same shards: the file
 * it read at the start no longer tells where the shards are once it has the locks.
 */
import { describe, expect, it } from 'vitest';
import { init } from '../../src/commands/init.js';
import { makeFleet, runCli } from '../helpers/fleet.js';
import { useTestDatabases, withClient } from '../helpers/hosts.js';
import { spawnCli, startCli, waitForMoveSessionsToEnd } from '../helpers/moves.js';

describe('move-shard queued behind a move of the same shards', () => {
  const db = useTestDatabases(2);

  it('refuses once it has the locks, saying the fleet changed while it waited, rather than meet the old copies the first move left', async () => {
    const fleet = makeFleet({ urls: db.urls, shards: 4, split: ['0-3', ''], extra: 'lockTimeout: 60s' });
    expect((await init(await fleet.config())).ok).toBe(true);
    // About 8 MB in shard 1: at 2 MB/s the first move copies for a few seconds, holding the locks.
    await withClient(db.urls[0]!, (c) =>
      c.query(
        `insert into insta1.photos (user_id, image_url) select g, repeat('x', 200) from generate_series(1, 40000) g`,
      ),
    );
    const first = await startCli([
      'move-shard',
      '1',
      '--to',
      'pg2',
      '--max-rate',
      '2MB',
      '--yes',
      '-c',
      fleet.configFile,
    ]);
    // The first holds the runner locks once it copies.
    for (let i = 0; i < 300 && !/copy pg1 → pg2/.test(first.output()); i++) await new Promise((r) => setTimeout(r, 50));
    expect(first.output()).toMatch(/copy pg1 → pg2/);
    const second = await runCli(['move-shard', '0-1', '--to', 'pg2', '--yes', '-c', fleet.configFile]);
    const done = await first.done;
    expect(done.code, done.stderr).toBe(0);
    await waitForMoveSessionsToEnd(db.urls);
    expect(second.code, second.stderr).toBe(2);
    expect(second.stderr).toContain('the fleet changed while this run waited for the runner locks');
    expect(second.stderr).toContain('shard 1: the file says pg1, the fleet says pg2');
    expect(second.stderr).not.toContain('no unfinished move');
    // Run again, it reads the map as the first move left it and moves what is left to move.
    const again = await runCli(['move-shard', '0', '--to', 'pg2', '--yes', '-c', fleet.configFile]);
    expect(again.code, again.stderr).toBe(0);
    expect((await fleet.config()).hosts.map((h) => h.shardsSpec)).toEqual(['2-3', '0-1']);
  });
});

describe('status of a move killed after its switch', () => {
  const db = useTestDatabases(2);

  it('names --resume alone, as its next: line does (a switched move can only be finished)', async () => {
    const fleet = makeFleet({ urls: db.urls, shards: 4, split: ['0-3', ''] });
    expect((await init(await fleet.config())).ok).toBe(true);
    const killed = await spawnCli(['move-shard', '1', '--to', 'pg2', '--yes', '-c', fleet.configFile], {
      SHARDCTL_FAULT_AFTER_STEP: 'switched',
    });
    expect(killed.signal, killed.stderr).toBe('SIGKILL');
    await waitForMoveSessionsToEnd(db.urls);
    const status = await runCli(['status', '-c', fleet.configFile]);
    expect(status.code).toBe(3);
    expect(status.stdout).toMatch(
      /unfinished move \w+: shards 1 from pg1 to pg2 \(it has switched, so it can only be finished: move-shard 1 --resume\)/,
    );
    expect(status.stdout).not.toContain('--resume, or --abort');
    expect(status.stderr).toContain('next: shardctl move-shard 1 --resume');
    const resumed = await runCli(['move-shard', '1', '--resume', '--yes', '-c', fleet.configFile]);
    expect(resumed.code, resumed.stderr).toBe(0);
  });
});
