import { describe, expect, it } from 'vitest';
import { init, status } from '../../src/index.js';
import { makeFleet, runCli } from '../helpers/fleet.js';
import { useTestDatabases, withClient } from '../helpers/hosts.js';

// Two databases on the first host would do as well: each test builds its fleet on one of its own.
const db = useTestDatabases(2);
// And one more for the test of a stopped no-transaction migration.
const noTx = useTestDatabases(1);

describe('status and migrate ask the same migration rules', () => {
  it('a new file numbered below applied ones is drift to both: migrate refuses it (exit 3) and status reports it, not "behind"', async () => {
    const fleet = makeFleet({
      urls: [db.urls[0]!],
      shards: 4,
      migrations: {
        '0001_photos.sql': 'CREATE TABLE photos (id bigint PRIMARY KEY);\n',
        '0003_comments.sql': 'CREATE TABLE comments (id bigint PRIMARY KEY);\n',
      },
    });
    expect((await init(await fleet.config())).ok).toBe(true);
    fleet.writeMigration('0002_likes.sql', 'CREATE TABLE likes (id bigint PRIMARY KEY);\n');

    const migrate = await runCli(['migrate', '-c', fleet.configFile]);
    expect(migrate.code).toBe(3);
    expect(migrate.stderr).toContain('0002_likes.sql is not applied to shards 0-3, which already have version 3');

    const check = await runCli(['migrate', '--check', '--json', '-c', fleet.configFile]);
    expect(check.code).toBe(3);
    const checked = JSON.parse(check.stdout) as { pending: number; drift: string[] };
    expect(checked.pending).toBe(0);
    expect(checked.drift).toEqual([expect.stringContaining('0002_likes.sql is not applied to shards 0-3')]);

    const report = await status(await fleet.config());
    const host = report.hosts[0]!;
    expect(host.behind).toEqual([]);
    expect(host.levels).toEqual({ '3': '0-3' });
    expect(host.drift).toEqual([
      expect.stringContaining('0002_likes.sql is not applied to shards 0-3, which already have version 3'),
    ]);
    expect(report.ok).toBe(false);

    const cli = await runCli(['status', '-c', fleet.configFile]);
    expect(cli.code).toBe(3);
    expect(cli.stdout).toContain('migration level 3 (0-3) of 3');
    expect(cli.stdout).not.toContain('behind (pending migrations)');
  });

  it('a file above every applied one is pending to both: migrate --check lists it and status calls the shards behind', async () => {
    const fleet = makeFleet({
      urls: [db.urls[1]!],
      shards: 4,
      migrations: { '0001_photos.sql': 'CREATE TABLE photos (id bigint PRIMARY KEY);\n' },
    });
    expect((await init(await fleet.config())).ok).toBe(true);
    fleet.writeMigration('0002_likes.sql', 'CREATE TABLE likes (id bigint PRIMARY KEY);\n');

    const check = await runCli(['migrate', '--check', '--json', '-c', fleet.configFile]);
    expect(check.code).toBe(3);
    expect(JSON.parse(check.stdout)).toMatchObject({ pending: 4, drift: [] });

    const host = (await status(await fleet.config())).hosts[0]!;
    expect(host.behind).toEqual([0, 1, 2, 3]);
    expect(host.drift).toEqual([]);
    expect(host.levels).toEqual({ '1': '0-3' });
  });
  it('a shard that a stopped no-transaction migration left half done: status names that migration as the likelier cause, and migrate finishes it', async () => {
    const fleet = makeFleet({
      urls: [noTx.urls[0]!],
      shards: 4,
      migrations: { '0001_photos.sql': 'CREATE TABLE photos (id bigint PRIMARY KEY, user_id bigint);\n' },
    });
    expect((await init(await fleet.config())).ok).toBe(true);
    fleet.writeMigration(
      '0002_user_index.sql',
      '-- shardctl:no-transaction\nCREATE INDEX CONCURRENTLY IF NOT EXISTS photos_user ON photos (user_id);\n',
    );
    // What a run stopped inside it leaves on one shard: the index built, the migration not recorded.
    const schema = (await fleet.config()).schemaPrefix + '1';
    await withClient(noTx.urls[0]!, (c) => c.query(`CREATE INDEX photos_user ON ${schema}.photos (user_id)`));

    const host = (await status(await fleet.config())).hosts[0]!;
    expect(host.drift).toEqual([expect.stringContaining(`shard 1 (${schema}) differs from shard 0`)]);
    expect(host.drift[0]).toContain(
      'part of 0002_user_index, which runs without a transaction, may have run in a run that was stopped: migrate runs it again',
    );
    expect((await runCli(['migrate', '-c', fleet.configFile])).code).toBe(0);
    expect((await status(await fleet.config())).ok).toBe(true);
  });
});
