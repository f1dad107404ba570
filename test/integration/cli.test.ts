import { execFile, spawn } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';
import { findFreePort } from '../../src/dev/local-postgres.js';
import { makeFleet, runCli } from '../helpers/fleet.js';
import { useTestDatabases, withClient } from '../helpers/hosts.js';
import { waitFor } from '../helpers/migrations.js';
import { tempDir } from '../helpers/temp.js';

const exec = promisify(execFile);
const db = useTestDatabases(2);

describe('the shardctl command line', () => {
  it('exits 2 on an unknown command or option, writing nothing', async () => {
    const unknownCommand = await runCli(['frobnicate']);
    expect(unknownCommand.code).toBe(2);
    expect(unknownCommand.stderr).toContain("unknown command 'frobnicate'");
    const unknownOption = await runCli(['status', '--frobnicate']);
    expect(unknownOption.code).toBe(2);
    expect(unknownOption.stderr).toContain("unknown option '--frobnicate'");
    // Under --json, also as JSON on stdout.
    const asJson = await runCli(['status', '--json', '--frobnicate']);
    expect(asJson.code).toBe(2);
    expect(JSON.parse(asJson.stdout)).toEqual({
      error: { code: 'USAGE', message: "unknown option '--frobnicate'", exitCode: 2 },
    });
  });

  it('exits 2 on a bad config, listing every problem at once and writing nothing', async () => {
    const fleet = makeFleet({ urls: db.urls, shards: 8 });
    writeFileSync(
      fleet.configFile,
      [
        'schemaPrefix: Insta',
        'shards: 8',
        'shard: 3',
        'hosts:',
        `  - name: pg1`,
        `    url: ${db.urls[0]}`,
        `    shards: "0-4"`,
        `  - name: pg2`,
        `    url: mysql://x@y/z`,
        `    shards: "4-6"`,
      ].join('\n'),
    );
    const cli = await runCli(['init', '-c', fleet.configFile]);
    expect(cli.code).toBe(2);
    expect(cli.stderr).toContain('schemaPrefix');
    expect(cli.stderr).toContain('"Insta"');
    expect(cli.stderr).toMatch(/shard.*did you mean "shards"/);
    expect(cli.stderr).toContain('hosts[1].url');
    expect(cli.stderr).toMatch(/overlap|both/i);
    expect(cli.stderr).toContain('7');
    await withClient(db.urls[0]!, async (client) => {
      expect((await client.query(`select 1 from pg_namespace where nspname = 'shardctl'`)).rowCount).toBe(0);
    });
  });

  it('exits 2 on a bad <shards> argument, naming it', async () => {
    const fleet = makeFleet({ urls: db.urls, shards: 8 });
    const cli = await runCli(['add-schema', '5-3', '-c', fleet.configFile]);
    expect(cli.code).toBe(2);
    expect(cli.stderr).toContain('argument <shards> "5-3"');
    const outOfRange = await runCli(['add-schema', '9', '-c', fleet.configFile]);
    expect(outOfRange.code).toBe(2);
    expect(outOfRange.stderr).toContain('out of range 0-7');
  });

  it('decodes ids to JSON with the id and Unix milliseconds as decimal strings and the host from the map', async () => {
    const fleet = makeFleet({ urls: db.urls, shards: 2000, split: ['0-999', '1000-1999'] });
    const id = ((1387263000n << 23n) | (1341n << 10n) | 905n).toString();
    const cli = await runCli(['decode', id, '--json', '-c', fleet.configFile]);
    expect(cli.code).toBe(0);
    expect(JSON.parse(cli.stdout)).toEqual([
      {
        id,
        timestamp: new Date(1314220021721 + 1387263000).toISOString(),
        unixMs: String(1314220021721 + 1387263000),
        shard: 1341,
        sequence: 905,
        host: 'pg2',
      },
    ]);
    expect(cli.stdout).toContain(`"id": "${id}"`);
    const bad = await runCli(['decode', '12abc', '--json', '-c', fleet.configFile]);
    expect(bad.code).toBe(2);
    expect(bad.stderr).toContain('"12abc"');
    // With a config, the host is named: no hint.
    const named = await runCli(['decode', id, '-c', fleet.configFile]);
    expect(named.stdout).toMatch(/ host pg2\n$/);
    expect(named.stderr).not.toContain('pass -c');
  });

  it('exits 2 on an option given twice with different values, naming both, and writes nothing', async () => {
    const fleet = makeFleet({ urls: db.urls, shards: 8 });
    const other = makeFleet({ urls: db.urls, shards: 8 });
    // Commander keeps the last value: this would have migrated shard 4 alone, or moved to pg1.
    const shards = await runCli(['migrate', '--shards', '0-3', '--shards', '4', '-c', fleet.configFile]);
    expect(shards.code).toBe(2);
    expect(shards.stderr).toContain('option --shards given twice ("0-3", then "4")');
    const target = await runCli([
      'move-shard',
      '0',
      '--to',
      'pg2',
      '--to',
      'pg1',
      '--yes',
      '--json',
      '-c',
      fleet.configFile,
    ]);
    expect(target.code).toBe(2);
    expect(JSON.parse(target.stdout)).toMatchObject({
      error: { code: 'USAGE', message: 'option --to given twice ("pg2", then "pg1"); give it once', exitCode: 2 },
    });
    const mode = await runCli([
      'move-shard',
      '0',
      '--to',
      'pg2',
      '--mode',
      'offline',
      '--mode',
      'online',
      '--yes',
      '-c',
      fleet.configFile,
    ]);
    expect(mode.code).toBe(2);
    expect(mode.stderr).toContain('option --mode given twice ("offline", then "online")');
    const configs = await runCli(['init', '-c', fleet.configFile, '--config', other.configFile]);
    expect(configs.code).toBe(2);
    expect(configs.stderr).toContain('option --config given twice');
    // Before and after the command name: which file was meant is as unclear.
    const around = await runCli(['-c', fleet.configFile, 'init', '-c', other.configFile]);
    expect(around.code).toBe(2);
    expect(around.stderr).toContain('option --config given twice');
    // An empty path (an unset variable) is not taken for "the default file".
    for (const args of [
      ['status', '-c', ''],
      ['-c', '', 'status'],
    ]) {
      const empty = await runCli(args);
      expect(empty.code, args.join(' ')).toBe(2);
      expect(empty.stderr).toContain('option --config "": expected the path of a config file');
    }
    // The same value twice is no contradiction.
    const same = await runCli(['init', '--dry-run', '-c', fleet.configFile, '-c', fleet.configFile]);
    expect(same.code).toBe(0);
    for (const url of db.urls) {
      await withClient(url, async (client) => {
        expect((await client.query(`select 1 from pg_namespace where nspname = 'shardctl'`)).rowCount).toBe(0);
      });
    }
  });

  it.each([
    [
      ['migrate', '--lock-retries', '1000000'],
      'option --lock-retries "1000000": expected a whole number from 0 to 999999',
    ],
    [['migrate', '--canary', '0'], 'option --canary "0": expected a whole number from 1 to 999999'],
    [
      ['move-shard', '0', '--to', 'pg2', '--wave-size', '1000000'],
      'option --wave-size "1000000": expected a whole number from 1 to 999999',
    ],
    [
      ['move-shard', '0', '--to', 'pg2', '--copy-chunk-rows', '10000000000'],
      'option --copy-chunk-rows "10000000000": expected a whole number of rows from 1 to 9999999999',
    ],
    [['dev', 'up', '--shards', '10000000'], 'option --shards "10000000": expected a whole number from 1 to 9999999'],
  ])('exits 2 on a count out of its range, saying the range: %j', async (args, message) => {
    // A number above the bound was refused as "expected a positive integer", which it is.
    const cli = await runCli(args, { cwd: tempDir('shardctl-counts-') });
    expect(cli.code).toBe(2);
    expect(cli.stderr).toContain(message);
  });

  it('exits 2 on an id whose shard the config has not (not an id of this fleet), naming the id and shard', async () => {
    const fleet = makeFleet({ urls: db.urls, shards: 8 });
    const foreign = ((1387263000n << 23n) | (1341n << 10n) | 905n).toString();
    const ours = ((1387263000n << 23n) | (5n << 10n) | 1n).toString();
    const cli = await runCli(['decode', ours, foreign, '-c', fleet.configFile]);
    expect(cli.code).toBe(2);
    expect(cli.stderr).toContain(
      `argument <id...>: "${foreign}" carries shard 1341, not in the map (0-7): not an id of this fleet`,
    );
    expect(cli.stdout).toBe('');
  });

  it('decodes without a config, saying on stderr that -c would name the host', async () => {
    const id = ((1387263000n << 23n) | (1341n << 10n) | 905n).toString();
    // No -c, no SHARDCTL_CONFIG and no ./shardctl.yaml in the folder.
    const cli = await runCli(['decode', id], { cwd: tempDir('shardctl-decode-'), env: { SHARDCTL_CONFIG: '' } });
    expect(cli.code).toBe(0);
    expect(cli.stdout).toBe(
      `${id}  ${new Date(1314220021721 + 1387263000).toISOString()}  shard 1341  sequence 905  host -\n`,
    );
    expect(cli.stderr).toBe(
      'decode: no config read, so no host (host -); pass -c FILE (or set SHARDCTL_CONFIG) to name it\n',
    );
  });

  it('never prints a password, including errors passed up from pg; a failure names the host (exit 1)', async () => {
    const secret = 'wrong-Pa55word-for-test';
    const deadPort = await findFreePort();
    const goodUrl = new URL(db.urls[0]!);
    goodUrl.password = secret;
    const fleet = makeFleet({
      urls: [goodUrl.toString(), `postgres://postgres:${secret}@127.0.0.1:${deadPort}/postgres`],
      shards: 4,
    });
    for (const args of [
      ['init'],
      ['status'],
      ['status', '--json'],
      ['init', '--dry-run', '--json'],
      ['migrate', '--check', '--json'],
    ]) {
      const cli = await runCli([...args, '-c', fleet.configFile]);
      expect(cli.code, args.join(' ')).toBe(1);
      expect(cli.stdout + cli.stderr).not.toContain(secret);
      expect(cli.stdout + cli.stderr).toMatch(/pg1|pg2/);
    }
  });

  it('ends quietly when the reader of its output goes away (shardctl … | head)', async () => {
    const bin = join(import.meta.dirname, '..', '..', 'bin', 'shardctl.js');
    const ids = Array.from({ length: 3000 }, (_, i) => String((BigInt(i) << 23n) | 5n));
    const { spawnSync } = await import('node:child_process');
    const run = spawnSync(
      'bash',
      ['-o', 'pipefail', '-c', `"${process.execPath}" "${bin}" decode ${ids.join(' ')} | head -1`],
      {
        env: { ...process.env, SHARDCTL_CONFIG: '' },
        encoding: 'utf8',
      },
    );
    expect(run.stdout.split('\n').filter(Boolean)).toHaveLength(1);
    expect(run.stderr).not.toMatch(/EPIPE|Error/);
    expect(run.status).toBe(0);
  });

  it('runs through the installed launcher: bin/shardctl.js', async () => {
    const bin = join(import.meta.dirname, '..', '..', 'bin', 'shardctl.js');
    const { stdout } = await exec(process.execPath, [bin, 'decode', String((1000n << 23n) | (7n << 10n) | 3n)], {
      env: { ...process.env, SHARDCTL_CONFIG: '' },
    });
    expect(stdout).toBe(
      `${(1000n << 23n) | (7n << 10n) | 3n}  2011-08-24T21:07:02.721Z  shard 7  sequence 3  host -\n`,
    );
    const error = await exec(process.execPath, [bin, 'nope']).then(
      () => null,
      (e: { code: number }) => e.code,
    );
    expect(error).toBe(2);
  });

  it('stopped by SIGINT or SIGTERM, says so and what to run next (under --json also as JSON on stdout), exit 130 / 143', async () => {
    const fleet = makeFleet({ urls: db.urls, shards: 2 });
    expect((await runCli(['init', '-c', fleet.configFile])).code).toBe(0);
    const bin = join(import.meta.dirname, '..', '..', 'bin', 'shardctl.js');
    for (const [signal, code, json, seconds] of [
      ['SIGINT', 130, false, 30],
      ['SIGTERM', 143, true, 31],
    ] as const) {
      const child = spawn(
        process.execPath,
        [bin, 'exec', '-c', fleet.configFile, ...(json ? ['--json'] : []), `select pg_sleep(${seconds})`],
        { stdio: ['ignore', 'pipe', 'pipe'] },
      );
      let stdout = '';
      let stderr = '';
      child.stdout.setEncoding('utf8').on('data', (chunk: string) => (stdout += chunk));
      child.stderr.setEncoding('utf8').on('data', (chunk: string) => (stderr += chunk));
      const ended = new Promise<number | null>((resolve) => child.once('close', (c) => resolve(c)));
      // Once its statements are running on the hosts.
      await waitFor('the sleeps', async () =>
        withClient(db.urls[0]!, async (c) => {
          const r = await c.query(`select 1 from pg_stat_activity where query like $1 and pid <> pg_backend_pid()`, [
            `%pg_sleep(${seconds})%`,
          ]);
          return (r.rowCount ?? 0) > 0;
        }),
      );
      child.kill(signal);
      expect(await ended).toBe(code);
      expect(stderr).toContain(`shardctl: stopped by ${signal}; what it left under way is named by shardctl status`);
      if (json) expect((JSON.parse(stdout) as { error: { code: string } }).error.code).toBe('INTERRUPTED');
    }
  });
});
