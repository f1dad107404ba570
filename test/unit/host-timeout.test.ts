import { describe, expect, it } from 'vitest';
import { parseConfig } from '../../src/config/load.js';
import { ConfigError } from '../../src/errors.js';
import { formatMs } from '../../src/fleet/silence.js';

const HOSTS = [
  'hosts:',
  '  - { name: pg1, url: "postgres://app@db1/app", shards: "0-1" }',
  '  - { name: pg2, url: "postgres://app@db2/app", shards: "2-3" }',
];

function parse(extra: string[]): ReturnType<typeof parseConfig> {
  return parseConfig(['shards: 4', ...extra, ...HOSTS].join('\n'), { file: '<inline>', checkMigrationsDir: false });
}

function problems(extra: string[]): string[] {
  try {
    parse(extra);
  } catch (error) {
    if (error instanceof ConfigError) return error.issues.map((i) => `${i.path}: ${i.message}`);
    throw error;
  }
  return [];
}

describe('hostTimeout', () => {
  it('defaults to 10s, carried to every host in ms', () => {
    const config = parse([]);
    expect(config.hostTimeout).toBe('10s');
    expect(config.hosts.map((h) => h.timeoutMs)).toEqual([10_000, 10_000]);
  });

  it.each([
    ['500ms', 500],
    ['2s', 2000],
    ['1min', 60_000],
  ])('reads %s', (text, ms) => {
    expect(parse([`hostTimeout: ${text}`]).hosts[0]!.timeoutMs).toBe(ms);
  });

  it.each([
    ['50ms', 'hostTimeout: must be at least 100ms, got "50ms"'],
    ['0s', 'hostTimeout: must be at least 100ms, got "0s"'],
    ['10', 'hostTimeout: must be a duration such as "500ms", "5s" or "1min", got 10'],
    ['"1 h"', 'hostTimeout: must be a duration such as "500ms", "5s" or "1min", got "1 h"'],
  ])('refuses %s, naming the field and the value', (text, message) => {
    expect(problems([`hostTimeout: ${text}`])).toEqual([message]);
  });
});

describe('formatMs', () => {
  it.each([
    [500, '500 ms'],
    [2000, '2 s'],
    [1500, '1.5 s'],
    [60_000, '60 s'],
  ])('%d → %s', (ms, text) => expect(formatMs(ms)).toBe(text));
});
