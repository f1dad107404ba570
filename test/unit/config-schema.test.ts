import { mkdirSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { Ajv2020 } from 'ajv/dist/2020.js';
import { parse as parseYaml, stringify } from 'yaml';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseConfig } from '../../src/config/load.js';
import { configJsonSchema } from '../../src/config/schema.js';
import { CONFIG_SCHEMA_FILE, renderDevConfig } from '../../src/dev/dev.js';
import { ConfigError } from '../../src/errors.js';

const NOW = new Date('2025-01-01T00:00:00Z');
const SHIPPED = path.resolve(import.meta.dirname, '..', '..', 'shardctl.schema.json');

let dir: string;
beforeAll(() => {
  dir = mkdtempSync(path.join(tmpdir(), 'shardctl-schema-'));
  mkdirSync(path.join(dir, 'migrations'));
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const ajv = new Ajv2020({ allErrors: true, strict: true, allowUnionTypes: true });
const validate = ajv.compile(JSON.parse(readFileSync(SHIPPED, 'utf8')) as object);

type Raw = Record<string, unknown>;
const host = (name: string, shards: unknown, extra: Raw = {}): Raw => ({
  name,
  url: `postgres://app@${name}/app`,
  shards,
  ...extra,
});
const base = (extra: Raw = {}): Raw => ({ shards: 4, hosts: [host('pg1', '0-1'), host('pg2', '2-3')], ...extra });
const withHost = (index: number, extra: Raw): Raw => {
  const raw = base();
  (raw['hosts'] as Raw[])[index] = { ...(raw['hosts'] as Raw[])[index], ...extra };
  return raw;
};

function acceptedByParseConfig(raw: unknown): boolean {
  try {
    parseConfig(stringify(raw), { file: path.join(dir, 'shardctl.yaml'), now: NOW, env: { PG_URL: 'postgres://x/y' } });
    return true;
  } catch (error) {
    if (error instanceof ConfigError) return false;
    throw error;
  }
}

describe('shardctl.schema.json', () => {
  it('is the JSON Schema of the zod schema (npm run schema writes it)', () => {
    expect(JSON.parse(readFileSync(SHIPPED, 'utf8'))).toEqual(configJsonSchema());
  });

  const valid: [string, unknown][] = [
    ['the smallest config', base()],
    [
      'every field',
      {
        schemaPrefix: 'shard_',
        shards: 8,
        idLayout: { epoch: '2020-01-01T00:00:00+02:00', shardBits: 4, sequenceBits: 12 },
        migrations: './migrations',
        concurrency: 8,
        lockTimeout: '1min',
        hostTimeout: '500ms',
        hosts: [
          host('db-1.eu', '0-3', { replicationUrl: 'postgres://app@10.0.0.1/app', weight: 2.5 }),
          host('db-2.eu', '4-7', { drain: false }),
        ],
      },
    ],
    ['an empty idLayout (null in YAML)', base({ idLayout: null })],
    ['shards as a YAML integer', { shards: 2, hosts: [host('a', 0), host('b', 1)] }],
    ['a host with no shards, draining', { shards: 2, hosts: [host('a', '0-1'), host('b', '', { drain: true })] }],
    [
      '${VAR} and ${VAR:-default} in a url',
      withHost(1, { url: '${PG_URL}', replicationUrl: '${REPL_URL:-postgres://r/app}' }),
    ],
    ['a $schema line for editors', base({ $schema: './node_modules/shardctl/shardctl.schema.json' })],
  ];

  it.each(valid)('accepts %s, as parseConfig does', (_, raw) => {
    expect(acceptedByParseConfig(raw)).toBe(true);
    expect(validate(raw), JSON.stringify(validate.errors)).toBe(true);
  });

  // Rejected by both: what a JSON Schema can say.
  const invalid: [string, unknown][] = [
    ['no shards', { hosts: base()['hosts'] }],
    ['no hosts', { shards: 4 }],
    ['an unknown key', base({ shard: 4 })],
    ['an unknown host key', withHost(0, { wieght: 2 })],
    ['an unknown idLayout key', base({ idLayout: { shardbits: 13 } })],
    ['shards as a string', base({ shards: '4' })],
    ['0 shards', base({ shards: 0 })],
    ['1.5 shards', base({ shards: 1.5 })],
    ['a prefix that is not a lower-case identifier', base({ schemaPrefix: 'Insta' })],
    ['concurrency 65', base({ concurrency: 65 })],
    ['a lockTimeout without a unit', base({ lockTimeout: '5' })],
    ['a hostTimeout in hours', base({ hostTimeout: '1h' })],
    ['an epoch without a zone', base({ idLayout: { epoch: '2011-08-24T21:07:01' } })],
    ['shardBits 0', base({ idLayout: { shardBits: 0 } })],
    ['hosts as a mapping', base({ hosts: { pg1: 'postgres://x/y' } })],
    ['an empty host list', base({ hosts: [] })],
    ['a host without a url', { shards: 1, hosts: [{ name: 'pg1', shards: '0' }] }],
    ['a host name with a space', withHost(0, { name: 'pg 1' })],
    ['weight 0', withHost(0, { weight: 0 })],
    ['drain "yes"', withHost(0, { drain: 'yes' })],
    ["a host's shards as a list", withHost(0, { shards: [0, 1] })],
    ['a config that is a list', [1, 2]],
  ];

  it.each(invalid)('rejects %s, as parseConfig does', (_, raw) => {
    expect(acceptedByParseConfig(raw)).toBe(false);
    expect(validate(raw)).toBe(false);
  });

  // What only parseConfig can judge (across fields, the calendar, the clock, the environment): the
  // JSON Schema accepts these, being looser, never stricter.
  const parseConfigOnly: [string, unknown][] = [
    ['overlapping hosts', withHost(1, { shards: '1-3' })],
    ['a gap in the map', withHost(1, { shards: '3' })],
    ['shards out of range', withHost(1, { shards: '2-4' })],
    ['duplicate host names', withHost(1, { name: 'pg1' })],
    ['every host draining', { shards: 2, hosts: [host('a', '0', { drain: true }), host('b', '1', { drain: true })] }],
    ['more shards than shardBits allow', base({ idLayout: { shardBits: 1 } })],
    ['a layout without time bits', base({ idLayout: { shardBits: 13, sequenceBits: 50 } })],
    ['an epoch in the future', base({ idLayout: { epoch: '2030-01-01T00:00:00Z' } })],
    ['a day that does not exist', base({ idLayout: { epoch: '2011-02-30T00:00:00Z' } })],
    ['a schemaPrefix starting with pg_', base({ schemaPrefix: 'pg_shard' })],
    ['a lockTimeout of 0', base({ lockTimeout: '0s' })],
    ['a hostTimeout under 100ms', base({ hostTimeout: '50ms' })],
    ['a url that is not postgres://', withHost(0, { url: 'mysql://db/app' })],
    ['an unset ${VAR}', withHost(0, { url: '${NOT_SET}' })],
    ['an unreadable shard list', withHost(0, { shards: '0-1,x' })],
  ];

  it.each(parseConfigOnly)('leaves %s to parseConfig', (_, raw) => {
    expect(acceptedByParseConfig(raw)).toBe(false);
    expect(validate(raw), JSON.stringify(validate.errors)).toBe(true);
  });
});

describe('the dev config', () => {
  const state = {
    configFile: path.join(dir ?? tmpdir(), 'shardctl.dev.yaml'),
    schemaPrefix: 'insta',
    shards: 4,
    hosts: [
      {
        name: 'pg1',
        port: 5001,
        dataDir: '/x',
        password: 'p',
        url: 'postgres://postgres:p@127.0.0.1:5001/postgres',
        shards: '0-3',
      },
    ],
  };

  it('starts with a yaml-language-server line naming the shipped schema, relative to the file', () => {
    const configFile = path.join(dir, 'shardctl.dev.yaml');
    const first = renderDevConfig({ ...state, configFile }).split('\n')[0]!;
    const match = /^# yaml-language-server: \$schema=(\S+)$/.exec(first);
    expect(match, first).not.toBeNull();
    expect(path.resolve(dir, match![1]!)).toBe(CONFIG_SCHEMA_FILE);
    expect(CONFIG_SCHEMA_FILE).toBe(SHIPPED);
  });

  it('is valid against that schema', () => {
    expect(
      validate(parseYaml(renderDevConfig({ ...state, configFile: path.join(dir, 'shardctl.dev.yaml') }))),
      JSON.stringify(validate.errors),
    ).toBe(true);
  });
});
