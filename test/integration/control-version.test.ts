import { describe, expect, it } from 'vitest';
import { init } from '../../src/index.js';
import { CONTROL_VERSION } from '../../src/fleet/control.js';
import { makeFleet, runCli } from '../helpers/fleet.js';
import { useTestDatabases, withClient } from '../helpers/hosts.js';

describe('the control schema version', () => {
  const db = useTestDatabases(2);

  it('is recorded by init and never lowered; a host written by a newer shardctl is refused by every command that writes, naming both versions', async () => {
    const fleet = makeFleet({ urls: db.urls, shards: 4, split: ['0-1', '2-3'], schemaPrefix: 'cv' });
    expect((await init(await fleet.config())).ok).toBe(true);
    for (const url of db.urls) {
      await withClient(url, async (client) => {
        expect((await client.query('select control_version from shardctl.layout')).rows[0].control_version).toBe(
          CONTROL_VERSION,
        );
      });
    }
    const newer = CONTROL_VERSION + 1;
    await withClient(db.urls[1]!, (client) => client.query('update shardctl.layout set control_version = $1', [newer]));
    fleet.writeMigration('0004_more.sql', 'CREATE TABLE more (id bigint PRIMARY KEY);');
    for (const args of [
      ['migrate'],
      ['init'],
      ['add-schema', '3'],
      ['move-shard', '0', '--to', 'pg2', '--yes'],
      ['gc', '--yes'],
    ]) {
      const run = await runCli([...args, '-c', fleet.configFile]);
      expect(run.code, `${args.join(' ')}: ${run.stderr}`).toBe(1);
      expect(run.stderr).toContain(
        `host pg2: its control schema is version ${newer}, written by a newer shardctl; this one knows versions up to ${CONTROL_VERSION}`,
      );
    }
    for (const url of db.urls) {
      await withClient(url, async (client) => {
        expect((await client.query(`select 1 from pg_tables where tablename = 'more'`)).rowCount).toBe(0);
      });
    }
    // Reading still works.
    expect((await runCli(['status', '-c', fleet.configFile])).code).not.toBe(1);
    // A rerun of the control SQL by this version does not lower it.
    await withClient(db.urls[1]!, (client) => client.query('update shardctl.layout set control_version = 1'));
    expect((await init(await fleet.config())).ok).toBe(true);
    await withClient(db.urls[1]!, async (client) => {
      expect((await client.query('select control_version from shardctl.layout')).rows[0].control_version).toBe(
        CONTROL_VERSION,
      );
    });
  });
});
