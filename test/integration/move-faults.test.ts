import pg from 'pg';
import { describe, expect, it } from 'vitest';
import { hostForShard } from '../../src/config/types.js';
import { ONLINE_STEPS, type MoveStep } from '../../src/moves/state.js';
import { init } from '../../src/provisioning/init.js';
import { makeFleet, runCli } from '../helpers/fleet.js';
import { useTestDatabases, withClient } from '../helpers/hosts.js';
import {
  lastMove,
  replicationObjects,
  schemaExists,
  schemaFingerprint,
  shardRow,
  spawnCli,
  useReplicationUrls,
  waitForMoveSessionsToEnd,
} from '../helpers/moves.js';

const crashDb = useTestDatabases(2);

/** Rows in every table of a shard, so the copy and the streaming both have something to carry. */
async function seed(client: pg.Client, shard: number, photos: number): Promise<void> {
  await client.query(`insert into insta${shard}.photos (user_id, image_url) select g, 'seed-' || g from generate_series(1, ${photos}) g`);
  await client.query(`insert into insta${shard}.likes (photo_id, user_id) select g, g from generate_series(1, ${photos / 2}) g`);
  await client.query(`insert into insta${shard}.comments (photo_id, user_id, body) select g, g, 'c' || g from generate_series(1, ${photos / 4}) g`);
}

function writeError(client: pg.Client, sql: string): Promise<pg.DatabaseError | null> {
  return client.query(sql).then(
    () => null,
    (error: pg.DatabaseError) => error,
  );
}

describe('a move killed after each step', () => {
  it('is finished by --resume or undone by --abort, whichever step it died after; abort after the switch is refused', async () => {
    const fleet = makeFleet({ urls: crashDb.urls, shards: 24, split: ['0-21', '22-23'] });
    useReplicationUrls(fleet, crashDb.urls, crashDb.replicationUrls);
    expect((await init(await fleet.config())).ok).toBe(true);
    const [pg1, pg2] = crashDb.urls as [string, string];
    const source = new pg.Client({ connectionString: pg1 });
    const target = new pg.Client({ connectionString: pg2 });
    await source.connect();
    await target.connect();
    try {
      // Each step except the last gets two shards: one resumed, one aborted.
      const steps = ONLINE_STEPS.slice(0, -1);
      const cases = steps.flatMap((step, i) => [
        { step, shard: 2 * i, then: 'resume' as const },
        { step, shard: 2 * i + 1, then: 'abort' as const },
      ]);
      for (const { shard } of cases) await seed(source, shard, 400);

      for (const { step, shard, then } of cases) {
        const label = `shard ${shard}, killed after ${step}, then ${then}`;
        const killed = await spawnCli(['move-shard', String(shard), '--to', 'pg2', '--yes', '-c', fleet.configFile], {
          SHARDCTL_FAULT_AFTER_STEP: step,
        });
        expect(killed.signal, `${label}: ${killed.stderr}`).toBe('SIGKILL');
        expect(await lastMove(source, shard), label).toMatchObject({ step, status: 'running' });
        await waitForMoveSessionsToEnd(crashDb.urls);

        // Before the fence the source takes writes, and they must arrive; from the fence on, none is taken.
        const fenced = ONLINE_STEPS.indexOf(step) >= ONLINE_STEPS.indexOf('fenced');
        const late = await writeError(source, `insert into insta${shard}.photos (user_id, image_url) values (7, 'while interrupted')`);
        if (fenced) expect(late?.code, label).toBe('SC100');
        else expect(late, label).toBeNull();
        const before = await schemaFingerprint(source, `insta${shard}`);

        if (then === 'abort' && step === 'switched') {
          const refused = await runCli(['move-shard', String(shard), '--abort', '--yes', '-c', fleet.configFile]);
          expect(refused.code, label).toBe(1);
          expect(refused.stderr, label).toMatch(/already switched shard \d+ to pg2; it cannot be aborted\. Run --resume to finish it/);
          expect(await lastMove(source, shard), label).toMatchObject({ step, status: 'running' });
        }
        const resumes = then === 'resume' || step === 'switched';
        const run = await runCli(['move-shard', String(shard), resumes ? '--resume' : '--abort', '--yes', '-c', fleet.configFile]);
        expect(run.code, `${label}: ${run.stderr}`).toBe(0);
        const config = await fleet.config();
        const moved = await lastMove(source, shard);
        expect(await lastMove(target, shard), label).toEqual(moved);

        if (resumes) {
          expect(moved?.status, label).toBe('done');
          expect(hostForShard(config, shard)?.name, label).toBe('pg2');
          expect(await shardRow(target, shard), label).toEqual({ state: 'active', schema: `insta${shard}` });
          expect(await schemaFingerprint(target, `insta${shard}`), label).toEqual(before);
          // The old copy: renamed, fenced, refusing writes.
          const old = await shardRow(source, shard);
          expect(old, label).toEqual({ state: 'fenced', schema: `insta${shard}_moved_${moved!.moveId}` });
          expect(await schemaExists(source, `insta${shard}`), label).toBe(false);
          expect((await writeError(source, `insert into "${old!.schema}".photos (user_id, image_url) values (1, 'x')`))?.code, label).toBe('SC100');
        } else {
          expect(moved?.status, label).toBe('aborted');
          expect(hostForShard(config, shard)?.name, label).toBe('pg1');
          expect(await shardRow(source, shard), label).toEqual({ state: 'active', schema: `insta${shard}` });
          expect(await writeError(source, `insert into insta${shard}.photos (user_id, image_url) values (8, 'after abort')`), label).toBeNull();
          expect(await schemaExists(target, `insta${shard}`), label).toBe(false);
          expect(await shardRow(target, shard), label).toBeNull();
        }
        expect(await replicationObjects(crashDb.urls), label).toEqual([]);
      }

      const status = await runCli(['status', '-c', fleet.configFile]);
      expect(status.code, status.stdout + status.stderr).toBe(0);
    } finally {
      await source.end();
      await target.end();
    }
  });
});

export type { MoveStep };
