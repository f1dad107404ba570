/**
 * move-shard killed after each of its steps, then resumed or aborted: finished or undone, nothing
 * lost, nothing left behind; an abort refused once the switch has begun.
 */
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { init } from '../../src/commands/init.js';
import { ShardRouter } from '../../src/router/router.js';
import { rewriteShardOwner } from '../../src/config/rewrite.js';
import { hostForShard } from '../../src/config/types.js';
import { UNWRITTEN } from '../../src/moves/progress.js';
import { ONLINE_STEPS } from '../../src/moves/state.js';
import { failure, killedAfter, move, seed } from '../helpers/faults.js';
import { type Fleet, makeFleet, runCli } from '../helpers/fleet.js';
import { adminClient, useTestDatabases } from '../helpers/hosts.js';
import {
  lastMove,
  removeCliSnapshot,
  replicationObjects,
  schemaExists,
  schemaFingerprint,
  shardRow,
} from '../helpers/moves.js';

const crashDb = useTestDatabases(2);
afterAll(removeCliSnapshot);

describe('a move killed after a step', () => {
  let fleet: Fleet;
  let source: pg.Client;
  let target: pg.Client;

  beforeAll(async () => {
    // pg2 starts empty, as a host added to grow the fleet does.
    // Two shards per online step for the kill-at-each-step test, then three more (the last ones).
    fleet = makeFleet({ urls: crashDb.urls, shards: 28, split: ['0-27', ''] });
    expect((await init(await fleet.config())).ok).toBe(true);
    source = await adminClient(crashDb.urls[0]!);
    target = await adminClient(crashDb.urls[1]!);
  });

  afterAll(async () => {
    await source?.end();
    await target?.end();
  });

  // Each step but the last gets two shards: one resumed, one aborted.
  const crashCases = ONLINE_STEPS.slice(0, -1).flatMap((step, i) => [
    { step, shard: 2 * i, then: 'resume' as const },
    { step, shard: 2 * i + 1, then: 'abort' as const },
  ]);

  it.each(crashCases.map((c) => [c.step, c.then, c.shard, c] as const))(
    'killed after %s, then --%s (shard %i): finished or undone; abort after the switch is refused',
    async (_step, _then, _shard, { step, shard, then }) => {
      await seed(source, shard, 400);
      const label = `shard ${shard}, killed after ${step}, then ${then}`;
      // The rerun follows the kill at once: the runner lock waits for the killed run's sessions.
      await killedAfter(fleet, shard, step);
      // The steps between the fence and the switch are not written: the record stays at the fence.
      const written = UNWRITTEN.has(step) ? 'fenced' : step;
      expect(await lastMove(source, shard), label).toMatchObject({ step: written, status: 'running' });
      // Until the fence the source takes writes, and they must arrive; from the fence on it takes none.
      const fenced = ONLINE_STEPS.indexOf(step) >= ONLINE_STEPS.indexOf('fenced');
      const write = await failure(
        source,
        `insert into insta${shard}.photos (user_id, image_url) values (7, 'while interrupted')`,
      );
      if (fenced) expect(write?.code, label).toBe('SC100');
      else expect(write, label).toBeNull();
      if (step === 'fenced') {
        // A router waits out its fence bound, then says why: a move that has not switched, and how to finish it.
        const router = await ShardRouter.open(fleet.configFile, { fencedTimeoutMs: 1000 });
        try {
          const error = await router
            .withShard(shard, (c) => c.query(`insert into photos (user_id, image_url) values ($1, 'routed')`, [7]))
            .catch((e: unknown) => e);
          expect(error, label).toMatchObject({ code: 'SHARD_FENCED', shard });
          expect((error as Error).message, label).toMatch(
            new RegExp(
              `host pg1, shard ${shard}: shard ${shard} is fenced by a move to pg2 that has not switched \\(waited \\d+\\.\\d s\\): .*move-shard ${shard} --resume, or undone with --abort`,
            ),
          );
        } finally {
          await router.close();
        }
      }
      const rows = await schemaFingerprint(source, `insta${shard}`);
      // status names the interrupted move's copy on the target, and is not ok until it is settled.
      const arriving =
        ONLINE_STEPS.indexOf(step) >= ONLINE_STEPS.indexOf('target-created') &&
        ONLINE_STEPS.indexOf(step) < ONLINE_STEPS.indexOf('switched');
      if (arriving) {
        const report = await runCli(['status', '--json', '-c', fleet.configFile]);
        expect(report.code, label).toBe(3);
        const hosts = (
          JSON.parse(report.stdout) as { hosts: { host: string; incoming: number[]; refusingWrites: number[] }[] }
        ).hosts;
        expect(hosts.find((h) => h.host === 'pg2')?.incoming, label).toContain(shard);
        // From the fence until the switch, the mapped copy refuses writes: status says so.
        if (fenced) expect(hosts.find((h) => h.host === 'pg1')?.refusingWrites, label).toContain(shard);
        else expect(hosts.find((h) => h.host === 'pg1')?.refusingWrites, label).not.toContain(shard);
      }

      if (then === 'abort' && step === 'switched') {
        const refused = await runCli(move(fleet, shard, '--abort'));
        expect(refused.code, label).toBe(1);
        expect(refused.stderr, label).toContain(
          `already switched shard ${shard} to pg2; it cannot be aborted. Resume it to finish it`,
        );
        expect(refused.stderr, label).toContain(`\nnext: shardctl move-shard ${shard} --resume\n`);
        expect(await lastMove(source, shard), label).toMatchObject({ step, status: 'running' });
      }
      const resumes = then === 'resume' || step === 'switched';
      const run = await runCli(move(fleet, shard, resumes ? '--resume' : '--abort'));
      expect(run.code, `${label}: ${run.stderr}`).toBe(0);
      const outcome = await lastMove(source, shard);
      expect(await lastMove(target, shard), label).toEqual(outcome);

      if (resumes) {
        expect(outcome?.status, label).toBe('done');
        expect(hostForShard(await fleet.config(), shard)?.name, label).toBe('pg2');
        expect(await shardRow(target, shard), label).toEqual({ state: 'active', schema: `insta${shard}` });
        expect(await schemaFingerprint(target, `insta${shard}`), label).toEqual(rows);
        const old = await shardRow(source, shard);
        expect(old, label).toEqual({ state: 'fenced', schema: `insta${shard}_moved_${outcome!.moveId}` });
        expect(
          (await failure(source, `insert into insta${shard}.photos (user_id, image_url) values (1, 'stale map')`))
            ?.code,
          label,
        ).toBe('SC100');
        expect(
          (await failure(source, `insert into "${old!.schema}".photos (user_id, image_url) values (1, 'x')`))?.code,
          label,
        ).toBe('SC100');
      } else {
        expect(outcome?.status, label).toBe('aborted');
        expect(hostForShard(await fleet.config(), shard)?.name, label).toBe('pg1');
        expect(await shardRow(source, shard), label).toEqual({ state: 'active', schema: `insta${shard}` });
        expect(
          await failure(source, `insert into insta${shard}.photos (user_id, image_url) values (8, 'after the abort')`),
          label,
        ).toBeNull();
        expect(await schemaExists(target, `insta${shard}`), label).toBe(false);
        expect(await shardRow(target, shard), label).toBeNull();
      }
      expect(await replicationObjects(crashDb.urls), label).toEqual([]);
      const status = await runCli(['status', '-c', fleet.configFile]);
      expect(status.code, status.stdout + status.stderr).toBe(0);
    },
  );

  it('refuses --abort once the switch has begun, even before it was recorded, and --resume finishes it', async () => {
    const shard = 25;
    await seed(source, shard, 400);
    const rows = await schemaFingerprint(source, `insta${shard}`);
    await killedAfter(fleet, shard, 'verified');
    // What a run killed inside the switch leaves: the target's copy active and the map rewritten,
    // but 'switched' recorded on neither host.
    await target.query(`update shardctl.shards set state = 'active' where shard = $1`, [shard]);
    await rewriteShardOwner(fleet.configFile, shard, 'pg1', 'pg2');
    // The steps after the fence up to the verification are not written: the record is at the fence.
    expect(await lastMove(source, shard)).toMatchObject({ step: 'fenced', status: 'running' });
    // status offers the resume alone, as the refusal below does.
    const report = await runCli(['status', '--json', '-c', fleet.configFile]);
    const next = (JSON.parse(report.stdout) as { next: unknown[] }).next;
    expect(next).toContainEqual({ action: 'resume', shards: [shard] });
    expect(next).not.toContainEqual({ action: 'abort', shards: [shard] });

    const refused = await runCli(move(fleet, shard, '--abort'));
    expect(refused.code).toBe(1);
    expect(refused.stderr).toContain(
      `already switched shard ${shard} to pg2; it cannot be aborted. Resume it to finish it`,
    );
    expect(refused.stderr).toContain(`\nnext: shardctl move-shard ${shard} --resume\n`);
    const asJson = await runCli(move(fleet, shard, '--abort', '--json'));
    expect(asJson.code).toBe(1);
    expect((JSON.parse(asJson.stdout) as { error: { code: string; next: unknown } }).error).toMatchObject({
      code: 'MOVE_SWITCHED',
      next: [{ action: 'resume', shards: [shard] }],
    });
    // Not undone: the source still fenced, the target's copy still there.
    expect(await shardRow(source, shard)).toEqual({ state: 'fenced', schema: `insta${shard}` });
    expect(await shardRow(target, shard)).toEqual({ state: 'active', schema: `insta${shard}` });
    // The active copy may take writes already: the resumed run only switches, it does not verify again.
    await target.query(`insert into insta${shard}.photos (user_id, image_url) values (3, 'on the target')`);

    const resumed = await runCli(move(fleet, shard, '--resume'));
    expect(resumed.code, resumed.stderr).toBe(0);
    expect(await lastMove(source, shard)).toMatchObject({ status: 'done' });
    await target.query(`delete from insta${shard}.photos where image_url = 'on the target'`);
    expect(await schemaFingerprint(target, `insta${shard}`)).toEqual(rows);
    expect(await replicationObjects(crashDb.urls)).toEqual([]);
  });

  it('offline: killed after fenced or after copied, --resume finishes it with every row', async () => {
    for (const [shard, step] of [
      [26, 'fenced'],
      [27, 'copied'],
    ] as const) {
      await seed(source, shard, 400);
      const rows = await schemaFingerprint(source, `insta${shard}`);
      await killedAfter(fleet, shard, step, '--mode', 'offline');
      expect(await lastMove(target, shard)).toMatchObject({ step, status: 'running' });
      const run = await runCli(move(fleet, shard, '--resume'));
      expect(run.code, run.stderr).toBe(0);
      expect(run.stdout).toMatch(new RegExp(`^shard ${shard} moved from pg1 to pg2: 700 rows verified`));
      expect(await schemaFingerprint(target, `insta${shard}`)).toEqual(rows);
      expect(hostForShard(await fleet.config(), shard)?.name).toBe('pg2');
    }
  });
});
