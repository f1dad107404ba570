/**
 * A move whose terminal goes away: the reader of its output closes stdout and stderr (a closed
 * pipe, a dropped SSH session), or the process gets SIGHUP, or both, in the middle of the move. The
 * move carries on to the end, its output dropped, and exits 0.
 */
import { spawn } from 'node:child_process';
import { join } from 'node:path';
import pg from 'pg';
import { beforeAll, describe, expect, it } from 'vitest';
import type { Fleet } from '../helpers/fleet.js';
import { useTestDatabases } from '../helpers/hosts.js';
import { lastMove, shardRow, spawnCli, useTwoHostFleet } from '../helpers/moves.js';

const db = useTestDatabases(2);
const BIN = join(import.meta.dirname, '..', '..', 'bin', 'shardctl.js');
const ROWS = 20_000;

/**
 * `node bin/shardctl.js` with `args`, its stdout read and dropped: the process, its stderr so far,
 * a promise settled once stderr holds `until`, and its end.
 */
function startMove(args: readonly string[], until: string) {
  const child = spawn(process.execPath, [BIN, ...args], {
    env: { ...process.env, NO_COLOR: '1' },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stderr = '';
  const reached = new Promise<void>((resolve) => {
    child.stderr.setEncoding('utf8').on('data', (chunk: string) => {
      stderr += chunk;
      if (stderr.includes(until)) resolve();
    });
  });
  child.stdout.resume();
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve, reject) => {
    child.once('error', reject);
    child.once('exit', (code, signal) => resolve({ code, signal }));
  });
  return { child, stderr: () => stderr, reached, exited };
}

describe('move-shard when its terminal goes away', () => {
  const hosts = useTwoHostFleet(db, { shards: 6, split: ['0-2', '3-5'] });
  let fleet: Fleet;
  let source: pg.Client;
  let target: pg.Client;
  beforeAll(() => {
    fleet = hosts.fleet();
    source = hosts.source();
    target = hosts.target();
  });

  it.each([
    [0, 'its stdout and stderr readers closed', true, false],
    [1, 'SIGHUP', false, true],
    [2, 'its readers closed and SIGHUP', true, true],
  ])('finishes the move of shard %i after %s at its first progress line', async (shard, _what, closePipes, hangUp) => {
    await source.query(
      `insert into insta${shard}.photos (user_id, image_url) select g, 'seed' from generate_series(1, ${ROWS}) g`,
    );
    const { child, stderr, reached, exited } = startMove(
      ['move-shard', String(shard), '--to', 'pg2', '--yes', '-c', fleet.configFile],
      '\n',
    );
    await reached;
    if (closePipes) {
      // The read ends close: every later write of the child meets a broken pipe.
      child.stderr.destroy();
      child.stdout.destroy();
    }
    if (hangUp) expect(child.kill('SIGHUP')).toBe(true);

    const { code, signal } = await exited;
    expect({ code, signal }, stderr()).toEqual({ code: 0, signal: null });
    // Done on both hosts, and the rows on the target.
    expect((await lastMove(source, shard))?.status).toBe('done');
    expect((await lastMove(target, shard))?.status).toBe('done');
    expect((await shardRow(target, shard))?.state).toBe('active');
    const rows = await target.query<{ n: string }>(`select count(*) as n from insta${shard}.photos`);
    expect(Number(rows.rows[0]!.n)).toBe(ROWS);
  });
});

// SIGINT and SIGTERM (what `timeout`, systemd and Kubernetes send) stop a command at once, except
// while a wave refuses writes: stopping then would leave the shard fenced until --resume or --abort.
describe('move-shard stopped by SIGTERM during its cut-over', () => {
  const own = useTestDatabases(2);
  const hosts = useTwoHostFleet(own, { shards: 2, split: ['0', '1'] });

  it('makes the fenced shard writable again, then stops with the signal; --resume finishes the move', async () => {
    const fleet = hosts.fleet();
    const source = hosts.source();
    const target = hosts.target();
    await source.query(
      `insert into insta0.photos (user_id, image_url) select g, 'seed' from generate_series(1, 2000) g`,
    );
    const {
      child,
      stderr,
      reached: fenced,
      exited,
    } = startMove(
      ['move-shard', '0', '--to', 'pg2', '--yes', '--max-fenced', '60s', '-c', fleet.configFile],
      'done: fenced',
    );
    // The target's copy held by another session: the cut-over's reads there wait, the shard fenced.
    const holder = new pg.Client({ connectionString: own.urls[1]! });
    await holder.connect();
    try {
      await fenced;
      await holder.query('begin');
      await holder.query('lock table insta0.photos in access exclusive mode');
      await new Promise((resolve) => setTimeout(resolve, 1_000));
      const refused = await source.query(`insert into insta0.photos (user_id, image_url) values (1, 'during')`).then(
        () => 'written',
        (error: { code?: string }) => error.code,
      );
      expect(refused).toBe('SC100');
      const sent = performance.now();
      expect(child.kill('SIGTERM')).toBe(true);
      const { code, signal } = await exited;
      expect({ code, signal }, stderr()).toEqual({ code: 143, signal: null });
      expect(stderr()).toContain('SIGTERM: making the fenced shards writable again before stopping');
      expect(stderr()).toContain('stopped by SIGTERM');
      // Well inside the fence limit (60 s) it would otherwise have waited for.
      expect(performance.now() - sent).toBeLessThan(30_000);
    } finally {
      await holder.end();
    }
    // Writable again on the source; the move waits at synced for --resume.
    await source.query(`insert into insta0.photos (user_id, image_url) values (2, 'after')`);
    expect((await lastMove(source, 0))?.status).not.toBe('done');
    const resumed = await spawnCli(['move-shard', '0', '--resume', '--yes', '-c', fleet.configFile]);
    expect(resumed.code, resumed.stderr).toBe(0);
    expect((await shardRow(target, 0))?.state).toBe('active');
    const rows = await target.query<{ n: string }>(`select count(*) as n from insta0.photos`);
    expect(Number(rows.rows[0]!.n)).toBe(2001);
  });
});
