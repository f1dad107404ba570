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
import { lastMove, shardRow, useTwoHostFleet } from '../helpers/moves.js';

const db = useTestDatabases(2);
const BIN = join(import.meta.dirname, '..', '..', 'bin', 'shardctl.js');
const ROWS = 20_000;

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
    const child = spawn(
      process.execPath,
      [BIN, 'move-shard', String(shard), '--to', 'pg2', '--yes', '-c', fleet.configFile],
      {
        env: { ...process.env, NO_COLOR: '1' },
        stdio: ['ignore', 'pipe', 'pipe'],
      },
    );
    let stderr = '';
    const firstLine = new Promise<void>((resolve) => {
      child.stderr.setEncoding('utf8').on('data', (chunk: string) => {
        stderr += chunk;
        if (stderr.includes('\n')) resolve();
      });
    });
    child.stdout.resume();
    const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve, reject) => {
      child.once('error', reject);
      child.once('exit', (code, signal) => resolve({ code, signal }));
    });
    await firstLine;
    if (closePipes) {
      // The read ends close: every later write of the child meets a broken pipe.
      child.stderr.destroy();
      child.stdout.destroy();
    }
    if (hangUp) expect(child.kill('SIGHUP')).toBe(true);

    const { code, signal } = await exited;
    expect({ code, signal }, stderr).toEqual({ code: 0, signal: null });
    // Done on both hosts, and the rows on the target.
    expect((await lastMove(source, shard))?.status).toBe('done');
    expect((await lastMove(target, shard))?.status).toBe('done');
    expect((await shardRow(target, shard))?.state).toBe('active');
    const rows = await target.query<{ n: string }>(`select count(*) as n from insta${shard}.photos`);
    expect(Number(rows.rows[0]!.n)).toBe(ROWS);
  });
});
