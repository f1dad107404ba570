/**
 * What `status` advises, checked against the state it reads: a fleet built by hand and partly adopted.
 */
import { describe, expect, it } from 'vitest';
import type { StatusResult } from '../../src/commands/status.js';
import { makeFleet, runCli } from '../helpers/fleet.js';
import { useTestDatabases, withClient } from '../helpers/hosts.js';
import { buildArticleFleet } from '../fixtures/article-fleet.js';

const article = useTestDatabases(2);

describe('status of a fleet built by hand and partly adopted', () => {
  it('names the shards adopt has not taken over and advises adopt (next: adopt, also under --json), never init, which refuses them', async () => {
    await buildArticleFleet(article.urls, 'sa', ['0-1', '2-3']);
    const fleet = makeFleet({
      urls: article.urls,
      shards: 4,
      split: ['0-1', '2-3'],
      schemaPrefix: 'sa',
      migrations: {},
    });
    expect((await runCli(['adopt', '--shards', '0,2', '--yes', '-c', fleet.configFile])).code).toBe(0);
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
    expect(result.hosts.map((h) => [h.handBuilt, h.nextIdOutdated])).toEqual([
      [[1], []],
      [[3], []],
    ]);

    // The advice moves the fleet forward: adopt takes the rest over, and status has nothing to advise.
    expect((await runCli(['adopt', '--yes', '-c', fleet.configFile])).code).toBe(0);
    const after = await runCli(['status', '-c', fleet.configFile]);
    expect(after.code, after.stdout).toBe(0);
    expect(after.stderr).not.toContain('next:');
  });
});
