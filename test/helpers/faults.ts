/**
 * What the move-shard failure tests share: seeding a shard, a statement's error, the move command's
 * arguments, a move killed after a step, and SQL run while an in-process move waits.
 */
import { spawnSync } from 'node:child_process';
import type pg from 'pg';
import { expect } from 'vitest';
import type { Fleet } from './fleet.js';
import { spawnCli } from './moves.js';

/** Rows in every table of a shard, so the copy and the streaming both have something to carry. */
export async function seed(client: pg.Client, shard: number, photos: number): Promise<void> {
  await client.query(
    `insert into insta${shard}.photos (user_id, image_url) select g, 'seed-' || g from generate_series(1, ${photos}) g`,
  );
  await client.query(
    `insert into insta${shard}.likes (photo_id, user_id) select g, g from generate_series(1, ${photos / 2}) g`,
  );
  await client.query(
    `insert into insta${shard}.comments (photo_id, user_id, body) select g, g, 'c' || g from generate_series(1, ${photos / 4}) g`,
  );
}

/** The moves' fence guards (functions shardctl_move_*) in the host's control schema. */
export async function fenceGuards(client: pg.Client): Promise<string[]> {
  const r = await client.query<{ proname: string }>(
    `select proname from pg_proc where pronamespace = 'shardctl'::regnamespace and proname like 'shardctl\\_move\\_%' order by 1`,
  );
  return r.rows.map((row) => row.proname);
}

/** The error a statement fails with, or null when it succeeds. */
export function failure(client: pg.Client, sql: string): Promise<pg.DatabaseError | null> {
  return client.query(sql).then(
    () => null,
    (error: pg.DatabaseError) => error,
  );
}

export const move = (fleet: Fleet, shard: number, ...flags: string[]) => [
  'move-shard',
  String(shard),
  ...flags,
  '--yes',
  '-c',
  fleet.configFile,
];

/**
 * Kills `move-shard` right after it recorded `step`, as a crash would. Its server sessions may live a
 * moment longer; what runs next does not wait for them (shardctl must).
 */
export async function killedAfter(fleet: Fleet, shard: number, step: string, ...flags: string[]): Promise<void> {
  const run = await spawnCli(move(fleet, shard, '--to', 'pg2', ...flags), { SHARDCTL_FAULT_AFTER_STEP: step });
  expect(run.signal, `move of shard ${shard} killed after ${step}: ${run.stderr}`).toBe('SIGKILL');
}

/**
 * Runs `sql` on `url` in a child process and returns its exit status, blocking this process
 * meanwhile: from a move's onStep hook, the move goes on only once the statement has committed.
 */
export function runSqlBlocking(url: string, sql: string): number | null {
  const run = `const pg = require('pg'); const c = new pg.Client(process.argv[1]);
    c.connect().then(() => c.query(process.argv[2])).then(() => c.end());`;
  return spawnSync(process.execPath, ['-e', run, url, sql], { stdio: 'inherit' }).status;
}
