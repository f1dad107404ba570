/**
 * The README's path for growing a local fleet, on real dev hosts: dev up, init, dev add-host, init,
 * rebalance --dry-run, rebalance; and dev up afterwards keeps the map the moves rewrote.
 */
import { existsSync } from 'node:fs';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parse } from 'yaml';
import { devDown } from '../../src/dev/dev.js';
import { runCli } from '../helpers/fleet.js';

describe('shardctl dev add-host, then rebalance onto it', () => {
  let cwd: string;
  let configFile: string;
  const hostsOf = async () =>
    (parse(await readFile(configFile, 'utf8')) as { hosts: { name: string; url: string; shards: string }[] }).hosts;

  beforeAll(async () => {
    cwd = await mkdtemp(path.join(os.tmpdir(), 'shardctl-dev-grow-'));
    configFile = path.join(cwd, 'shardctl.dev.yaml');
  });

  afterAll(async () => {
    await devDown({ cwd, destroy: true });
    await rm(cwd, { recursive: true, force: true });
  });

  it('adds a running host with no shards, which init provisions and rebalance fills', async () => {
    const up = await runCli(['dev', 'up', '--hosts', '2', '--shards', '8'], { cwd });
    expect(up.code, up.stderr).toBe(0);
    // Each step of each host on stderr, which is no terminal here (as in a CI log), before the summary.
    const lines = up.stderr.split('\n');
    for (const host of ['pg1', 'pg2']) {
      const steps = [
        new RegExp(`^dev up: ${host}: creating the cluster \\(initdb\\) in /`),
        new RegExp(`^dev up: ${host}: starting on 127\\.0\\.0\\.1:\\d+$`),
        new RegExp(`^dev up: ${host}: running$`),
      ].map((step) => lines.findIndex((line) => step.test(line)));
      expect(steps.every((i) => i >= 0) && steps[0]! < steps[1]! && steps[1]! < steps[2]!, up.stderr).toBe(true);
      expect(steps[2]!, up.stderr).toBeLessThan(lines.findIndex((line) => line.startsWith('dev up: 2 hosts running')));
    }
    expect((await runCli(['init', '-c', configFile], { cwd })).code).toBe(0);

    const empty = await mkdtemp(path.join(os.tmpdir(), 'shardctl-dev-none-'));
    const noSetup = await runCli(['dev', 'add-host'], { cwd: empty });
    await rm(empty, { recursive: true, force: true });
    expect(noSetup.code).toBe(1);
    expect(noSetup.stderr).toContain('run `shardctl dev up` first');
    const taken = await runCli(['dev', 'add-host', '--name', 'PG1'], { cwd });
    expect(taken.code).toBe(2);
    expect(taken.stderr).toContain('option --name "PG1": a dev host of that name exists already');
    const bad = await runCli(['dev', 'add-host', '--name', '-x'], { cwd });
    expect(bad.code).toBe(2);
    expect(bad.stderr).toContain('option --name "-x": must start with a letter or digit');

    const added = await runCli(['dev', 'add-host', '--json'], { cwd });
    expect(added.code, added.stderr).toBe(0);
    expect(added.stderr).toMatch(/^dev add-host: pg3: starting on 127\.0\.0\.1:\d+$/m);
    expect(JSON.parse(added.stdout)).toMatchObject({ name: 'pg3', shards: '' });
    expect((await hostsOf()).map((h) => [h.name, h.shards])).toEqual([
      ['pg1', '0-3'],
      ['pg2', '4-7'],
      ['pg3', ''],
    ]);
    const status = await runCli(['dev', 'status'], { cwd });
    expect(status.stdout).toMatch(/pg3: 127\.0\.0\.1:\d+ running/);

    expect((await runCli(['init', '-c', configFile], { cwd })).code).toBe(0);
    const before = await readFile(configFile, 'utf8');
    const dry = await runCli(['rebalance', '--dry-run', '-c', configFile], { cwd });
    expect(dry.code, dry.stderr).toBe(0);
    expect(dry.stdout).toMatch(/^rebalance by count: 2 moves, 2 shards/);
    expect(await readFile(configFile, 'utf8')).toBe(before);

    const run = await runCli(['rebalance', '--yes', '-c', configFile], { cwd });
    expect(run.code, run.stderr).toBe(0);
    expect((await hostsOf()).map((h) => [h.name, h.shards])).toEqual([
      ['pg1', '0-2'],
      ['pg2', '4-6'],
      ['pg3', '3,7'],
    ]);
    const check = await runCli(['status', '-c', configFile], { cwd });
    expect(check.code, check.stdout + check.stderr).toBe(0);

    // dev up again (say after a reboot) keeps the map the moves wrote, and the added host.
    const again = await runCli(['dev', 'up'], { cwd });
    expect(again.code, again.stderr).toBe(0);
    expect((await hostsOf()).map((h) => [h.name, h.shards])).toEqual([
      ['pg1', '0-2'],
      ['pg2', '4-6'],
      ['pg3', '3,7'],
    ]);
    expect(existsSync(path.join(cwd, '.shardctl', 'dev', 'state.json'))).toBe(true);
  });
});
