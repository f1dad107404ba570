/**
 * What `status` advises, and what its map line claims, checked against the state it reads: a fleet
 * built by hand and partly adopted, and hosts that cannot be read.
 */
import { describe, expect, it } from 'vitest';
import { init } from '../../src/commands/init.js';
import type { StatusResult } from '../../src/commands/status.js';
import { makeFleet, runCli } from '../helpers/fleet.js';
import { useTestDatabases, withClient } from '../helpers/hosts.js';
import { BASELINE, buildArticleFleet } from '../fixtures/article-fleet.js';

const article = useTestDatabases(2);
const unread = useTestDatabases(2);

/** The url with a database that does not exist: the server answers, but nothing there can be read. */
const missingDatabase = (url: string): string => {
  const u = new URL(url);
  u.pathname = '/no_such_database';
  return u.toString();
};

describe('status of a fleet built by hand and partly adopted', () => {
  it('names the shards adopt has not taken over and advises adopt (next: adopt, also under --json), never init, which refuses them', async () => {
    await buildArticleFleet(article.urls, 'sa', ['0-1', '2-3']);
    const fleet = makeFleet({
      urls: article.urls,
      shards: 4,
      split: ['0-1', '2-3'],
      schemaPrefix: 'sa',
      migrations: { '0001_article.sql': BASELINE, '0002_tags.sql': 'CREATE TABLE tags (id bigint PRIMARY KEY)' },
    });
    expect((await runCli(['adopt', '--baseline', '1', '--shards', '0,2', '--yes', '-c', fleet.configFile])).code).toBe(
      0,
    );
    // An adopt killed before its last step: shards switched and recorded, the fleet not recorded yet.
    for (const url of article.urls)
      await withClient(url, (c) =>
        c.query('delete from shardctl.placement; delete from shardctl.hosts; delete from shardctl.fleet'),
      );

    const run = await runCli(['status', '-c', fleet.configFile]);
    expect(run.code).toBe(3);
    expect(run.stdout).toMatch(
      /^pg1: NOT OK .*\n(?: .*\n)*? {2}built by hand, not taken over by shardctl: 1 \(run adopt\)$/m,
    );
    expect(run.stdout).toMatch(
      /^pg2: NOT OK .*\n(?: .*\n)*? {2}built by hand, not taken over by shardctl: 3 \(run adopt\)$/m,
    );
    expect(run.stdout).toContain('no fleet recorded yet: run adopt');
    expect(run.stdout + run.stderr).not.toMatch(/run init|outdated|shardctl init/);
    expect(run.stderr.trimEnd().split('\n').at(-1)).toBe('next: shardctl adopt');
    const init = await runCli(['init', '-c', fleet.configFile]);
    expect(init.stderr).toContain('shardctl did not create it');

    const json = await runCli(['status', '--json', '-c', fleet.configFile]);
    const result = JSON.parse(json.stdout) as StatusResult;
    expect(result.next).toEqual([{ action: 'adopt', shards: [1, 3] }]);
    // Adopted shards lack 0002; hand-built ones are not "behind" (migrate does not take them: adopt first).
    expect(result.hosts.map((h) => [h.handBuilt, h.nextIdOutdated, h.behind])).toEqual([
      [[1], [], [0]],
      [[3], [], [2]],
    ]);

    // The advice moves the fleet forward: adopt takes the rest over, and status has nothing to advise.
    expect((await runCli(['adopt', '--baseline', '1', '--yes', '-c', fleet.configFile])).code).toBe(0);
    expect((await runCli(['migrate', '-c', fleet.configFile])).code).toBe(0);
    const after = await runCli(['status', '-c', fleet.configFile]);
    expect(after.code, after.stdout).toBe(0);
    expect(after.stderr).not.toContain('next:');
  });
});

describe("status's map line when hosts cannot be read", () => {
  it('no host read: says the placement could not be read, compares nothing and advises no init', async () => {
    const fleet = makeFleet({ urls: unread.urls.map(missingDatabase), shards: 4, split: ['0-1', '2-3'] });
    const run = await runCli(['status', '-c', fleet.configFile]);
    expect(run.code).toBe(1);
    expect(run.stdout).toMatch(/^pg1: UNREACHABLE: /m);
    expect(run.stdout).toMatch(
      /^map: the fleet's placement could not be read \(no host could be read\); the file was not compared$/m,
    );
    expect(run.stdout + run.stderr).not.toMatch(/agrees|init/);
    const json = JSON.parse((await runCli(['status', '--json', '-c', fleet.configFile])).stdout) as StatusResult;
    expect(json.map).toMatchObject({ readFrom: [], notRead: ['pg1', 'pg2'], fleetId: null });
    expect(json.next).toEqual([]);
  });

  it('some hosts read: the map line says which hosts it is based on and which were not compared', async () => {
    const initialised = makeFleet({ urls: unread.urls, shards: 4, split: ['0-1', '2-3'] });
    expect((await init(await initialised.config())).ok).toBe(true);
    const fleet = makeFleet({
      urls: [unread.urls[0]!, missingDatabase(unread.urls[1]!)],
      shards: 4,
      split: ['0-1', '2-3'],
    });
    const run = await runCli(['status', '-c', fleet.configFile]);
    expect(run.code).toBe(1);
    expect(run.stdout).toMatch(
      /^map: the file agrees with the fleet \(placement version \d+, fleet [0-9a-f-]+; based on pg1 only: pg2 not read\)$/m,
    );
    expect(run.stdout + run.stderr).not.toContain('init');
    const json = JSON.parse((await runCli(['status', '--json', '-c', fleet.configFile])).stdout) as StatusResult;
    expect(json.map).toMatchObject({ readFrom: ['pg1'], notRead: ['pg2'] });
  });
});
