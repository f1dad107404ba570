import { execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import fc from 'fast-check';
import { stringify } from 'yaml';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { expandEnv } from '../../src/config/env.js';
import { redactUrl } from '../../src/pg/redact.js';
import {
  loadConfig,
  MAX_CONFIG_BYTES,
  parseConfig,
  resolveConfigPath,
  type ParseConfigOptions,
} from '../../src/config/load.js';
import { formatShardList } from '../../src/config/ranges.js';
import { hostForShard } from '../../src/config/types.js';
import { ConfigError, type ConfigIssue } from '../../src/errors.js';

/** A moment well inside the default layout's range (which ends 2046-06-27). */
const NOW = new Date('2025-01-01T00:00:00Z');
const PASSWORD = 's3cr3t-pa55';

let dir: string;
let configFile: string;

beforeAll(() => {
  dir = mkdtempSync(path.join(tmpdir(), 'shardctl-config-'));
  mkdirSync(path.join(dir, 'migrations'));
  configFile = path.join(dir, 'shardctl.yaml');
});

afterAll(() => {
  rmSync(dir, { recursive: true, force: true });
});

type Raw = Record<string, unknown>;

/** The example from the docs: two hosts, 2048 shards, defaults for everything else. */
function validConfig(): Raw {
  return {
    shards: 2048,
    hosts: [
      { name: 'pg1', url: `postgres://app:${PASSWORD}@db1:5432/app`, shards: '0-1023' },
      { name: 'pg2', url: 'postgres://app@db2:5432/app', shards: '1024-2047' },
    ],
  };
}

function host(config: Raw, index: number): Raw {
  return (config['hosts'] as Raw[])[index]!;
}

function parse(text: string, options: Partial<ParseConfigOptions> = {}) {
  return parseConfig(text, { file: configFile, now: NOW, env: {}, ...options });
}

function parseRaw(raw: unknown, options: Partial<ParseConfigOptions> = {}) {
  return parse(stringify(raw), options);
}

function issuesOf(run: () => unknown): ConfigIssue[] {
  try {
    run();
  } catch (error) {
    expect(error).toBeInstanceOf(ConfigError);
    return [...(error as ConfigError).issues];
  }
  throw new Error('expected a ConfigError, but the config was accepted');
}

function issuesOfRaw(raw: unknown, options: Partial<ParseConfigOptions> = {}): ConfigIssue[] {
  return issuesOf(() => parseRaw(raw, options));
}

/** The one issue at `path`; fails if there is none or more than one there. */
function issueAt(issues: readonly ConfigIssue[], path: string): string {
  const found = issues.filter((issue) => issue.path === path);
  expect(found, `issues at ${path} among ${JSON.stringify(issues, null, 2)}`).toHaveLength(1);
  return found[0]!.message;
}

describe('parseConfig: a valid file', () => {
  it('reads the documented example, with defaults for everything left out', () => {
    const config = parseRaw(validConfig());
    expect(config.file).toBe(configFile);
    expect(config.schemaPrefix).toBe('insta');
    expect(config.shards).toBe(2048);
    expect(config.idLayout).toEqual({ epochMs: 1314220021721n, shardBits: 13, sequenceBits: 10 });
    expect(config.epochIso).toBe('2011-08-24T21:07:01.721Z');
    expect(config.migrationsDir).toBe(path.join(dir, 'migrations'));
    expect(config.concurrency).toBe(2);
    expect(config.lockTimeout).toBe('5s');
    expect(config.warnings).toEqual([]);
    expect(config.hosts.map((h) => [h.name, h.shardsSpec, h.shards.length, h.shards[0], h.shards.at(-1)])).toEqual([
      ['pg1', '0-1023', 1024, 0, 1023],
      ['pg2', '1024-2047', 1024, 1024, 2047],
    ]);
  });

  it('reads every field when all are given', () => {
    mkdirSync(path.join(dir, 'sql', 'changes'), { recursive: true });
    const config = parse(`
schemaPrefix: shard_
shards: 8
idLayout:
  epoch: "2020-01-01T00:00:00+02:00"
  shardBits: 4
  sequenceBits: 12
migrations: sql/changes
concurrency: 8
lockTimeout: 1min
hosts:
  - name: db-1.eu
    url: postgresql://app@db1/app
    replicationUrl: postgres://app@10.0.0.1:5432/app
    shards: "0-3"
  - name: db-2.eu
    url: postgres:///app?host=/var/run/postgresql
    shards: 4-7
`);
    expect(config.schemaPrefix).toBe('shard_');
    expect(config.idLayout).toEqual({
      epochMs: BigInt(Date.parse('2019-12-31T22:00:00Z')),
      shardBits: 4,
      sequenceBits: 12,
    });
    expect(typeof config.idLayout.epochMs).toBe('bigint');
    expect(config.epochIso).toBe('2020-01-01T00:00:00+02:00');
    expect(config.migrationsDir).toBe(path.join(dir, 'sql', 'changes'));
    expect(config.concurrency).toBe(8);
    expect(config.lockTimeout).toBe('1min');
    expect(config.hosts[0]!.replicationUrl).toBe('postgres://app@10.0.0.1:5432/app');
    expect(config.hosts[1]!.url).toBe('postgres:///app?host=/var/run/postgresql');
  });

  it('defaults replicationUrl to url', () => {
    const config = parseRaw(validConfig());
    expect(config.hosts[1]!.replicationUrl).toBe('postgres://app@db2:5432/app');
  });

  it('defaults directUrl to url; a directUrl (the server behind a pooler) is also the default replicationUrl', () => {
    const raw = validConfig();
    host(raw, 1)['url'] = 'postgres://app@pgbouncer2:6432/app';
    host(raw, 1)['directUrl'] = 'postgres://${DIRECT_USER}@db2:5432/app';
    const config = parseRaw(raw, { env: { DIRECT_USER: 'ops' } });
    expect(config.hosts[0]!.directUrl).toBe(config.hosts[0]!.url);
    expect(config.hosts[1]!.directUrl).toBe('postgres://ops@db2:5432/app');
    expect(config.hosts[1]!.replicationUrl).toBe('postgres://ops@db2:5432/app');
  });

  it('refuses a malformed directUrl, naming the field, without its password', () => {
    const raw = validConfig();
    host(raw, 0)['directUrl'] = `https://app:${PASSWORD}@10.0.0.1/app`;
    const message = issueAt(issuesOfRaw(raw), 'hosts[0].directUrl');
    expect(message).toContain('"https://app:***@10.0.0.1/app"');
    expect(message).not.toContain(PASSWORD);
  });

  it('sorts each host’s shards ascending, keeping the list as written', () => {
    const raw = validConfig();
    host(raw, 0)['shards'] = '1000-1023, 0-999';
    const config = parseRaw(raw);
    expect(config.hosts[0]!.shardsSpec).toBe('1000-1023, 0-999');
    expect(config.hosts[0]!.shards).toEqual(Array.from({ length: 1024 }, (_, i) => i));
  });

  it('accepts a host’s shards written as a YAML integer', () => {
    const config = parse(
      'shards: 2\nhosts:\n  - {name: a, url: "postgres://a/db", shards: 0}\n  - {name: b, url: "postgres://b/db", shards: 1}\n',
    );
    expect(config.hosts.map((h) => [h.shardsSpec, h.shards])).toEqual([
      ['0', [0]],
      ['1', [1]],
    ]);
  });

  it('expands ${VAR} in url and replicationUrl from the given environment', () => {
    const raw = validConfig();
    host(raw, 1)['url'] = '${PG2_URL}';
    host(raw, 1)['replicationUrl'] = 'postgres://${REPL_USER}@10.0.0.2/app';
    const config = parseRaw(raw, { env: { PG2_URL: 'postgres://x:y@db2/app', REPL_USER: 'repl' } });
    expect(config.hosts[1]!.url).toBe('postgres://x:y@db2/app');
    expect(config.hosts[1]!.replicationUrl).toBe('postgres://repl@10.0.0.2/app');
  });

  it('does not expand ${VAR} outside the URLs', () => {
    const raw = { ...validConfig(), migrations: '${DIR}' };
    expect(issueAt(issuesOfRaw(raw, { env: { DIR: 'migrations' } }), 'migrations')).toContain(path.join(dir, '${DIR}'));
  });

  it('reads JSON when the file name ends in .json', () => {
    const config = parse(JSON.stringify(validConfig()), { file: path.join(dir, 'shardctl.json') });
    expect(config.file).toBe(path.join(dir, 'shardctl.json'));
    expect(config.hosts).toHaveLength(2);
  });

  it('resolves a relative file name against cwd, and the migrations folder against the file’s folder', () => {
    const config = parseRaw(validConfig(), { file: 'shardctl.yaml', cwd: dir });
    expect(config.file).toBe(configFile);
    expect(config.migrationsDir).toBe(path.join(dir, 'migrations'));
  });

  it('skips the migrations folder check when asked to', () => {
    const raw = { ...validConfig(), migrations: './not-there' };
    expect(parseRaw(raw, { checkMigrationsDir: false }).migrationsDir).toBe(path.join(dir, 'not-there'));
  });

  it('maps every shard to exactly one host for any partition of the shards', () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 1, max: 300 }),
        fc.array(fc.integer({ min: 0, max: 4 }), { minLength: 300, maxLength: 300 }),
        (shards, owners) => {
          const byHost = new Map<number, number[]>();
          for (let shard = 0; shard < shards; shard++) {
            const owner = owners[shard]!;
            byHost.set(owner, [...(byHost.get(owner) ?? []), shard]);
          }
          const hosts = [...byHost].map(([owner, list]) => ({
            name: `pg${owner}`,
            url: `postgres://db${owner}/app`,
            shards: formatShardList(list),
          }));
          const config = parseRaw({ shards, hosts });
          for (let shard = 0; shard < shards; shard++) {
            expect(hostForShard(config, shard)?.name).toBe(`pg${owners[shard]}`);
          }
        },
      ),
      { numRuns: 50 },
    );
  });
});

describe('parseConfig: weight and drain', () => {
  it('defaults every host to weight 1 and drain false', () => {
    const config = parseRaw(validConfig());
    expect(config.hosts.map((h) => [h.name, h.weight, h.drain])).toEqual([
      ['pg1', 1, false],
      ['pg2', 1, false],
    ]);
  });

  it('reads a weight (whole or fractional) and drain: true, and a draining host may still hold shards', () => {
    const raw = validConfig();
    host(raw, 0)['weight'] = 2.5;
    host(raw, 0)['drain'] = false;
    host(raw, 1)['drain'] = true;
    const config = parseRaw(raw);
    expect(config.hosts.map((h) => [h.name, h.weight, h.drain, h.shards.length])).toEqual([
      ['pg1', 2.5, false, 1024],
      ['pg2', 1, true, 1024],
    ]);
  });

  it.each([
    [0, '0'],
    [-1, '-1'],
    ['2', '"2"'],
    [null, 'null'],
    [[1], 'a list'],
  ])('refuses weight %j, naming the field and the value', (weight, shown) => {
    const raw = validConfig();
    host(raw, 1)['weight'] = weight;
    expect(issueAt(issuesOfRaw(raw), 'hosts[1].weight')).toBe(
      `must be a positive number such as 1 or 2.5, got ${shown}`,
    );
  });

  it('refuses an infinite weight (.inf in YAML), printing it as Infinity', () => {
    const text = stringify(validConfig()).replace('shards: 1024-2047', 'shards: 1024-2047\n    weight: .inf');
    expect(text).toContain('weight: .inf');
    expect(
      issueAt(
        issuesOf(() => parse(text)),
        'hosts[1].weight',
      ),
    ).toBe('must be a positive number such as 1 or 2.5, got Infinity');
  });

  it.each([
    ['yes', '"yes"'],
    [1, '1'],
    ['true', '"true"'],
  ])('refuses drain %j: it must be a boolean', (drain, shown) => {
    const raw = validConfig();
    host(raw, 0)['drain'] = drain;
    expect(issueAt(issuesOfRaw(raw), 'hosts[0].drain')).toBe(`must be true or false, got ${shown}`);
  });

  it('refuses a map where every host drains: the shards would have nowhere to go', () => {
    const raw = validConfig();
    host(raw, 0)['drain'] = true;
    host(raw, 1)['drain'] = true;
    expect(issueAt(issuesOfRaw(raw), 'hosts')).toBe('every host has drain: true; at least one must keep taking shards');
  });

  it('reports bad weights and drains together with every other problem', () => {
    const raw = { ...validConfig(), concurrency: 0 };
    host(raw, 0)['weight'] = 0;
    host(raw, 1)['drain'] = 'no';
    host(raw, 1)['wieght'] = 2;
    expect(
      issuesOfRaw(raw)
        .map((issue) => issue.path)
        .sort(),
    ).toEqual(['concurrency', 'hosts[0].weight', 'hosts[1].drain', 'hosts[1].wieght'].sort());
    expect(issueAt(issuesOfRaw(raw), 'hosts[1].wieght')).toContain('did you mean "weight"?');
  });
});

describe('parseConfig: problems in the file', () => {
  it('reports every problem at once', () => {
    const raw = { ...validConfig(), shard: 1, concurrency: 0, lockTimeout: '5 s' };
    host(raw, 0)['name'] = 'bad name';
    host(raw, 1)['shards'] = '1024-2046';
    const issues = issuesOfRaw(raw);
    expect(issues.map((issue) => issue.path).sort()).toEqual(
      ['shard', 'concurrency', 'lockTimeout', 'hosts[0].name', 'hosts'].sort(),
    );
  });

  it('puts every problem, with its path, into the error message', () => {
    const raw = { ...validConfig(), concurrency: 0 };
    host(raw, 1)['shards'] = '1024-2046';
    let message = '';
    try {
      parseRaw(raw);
    } catch (error) {
      message = (error as Error).message;
    }
    expect(message).toContain(`${configFile}: 2 problems in the config`);
    expect(message).toContain('  - concurrency: must be an integer from 1 to 64, got 0');
    expect(message).toContain('  - hosts: shard 2047 is on no host');
  });

  it('refuses an unknown top-level key, suggesting the closest known key', () => {
    const raw = { ...validConfig(), shard: 12 };
    expect(issueAt(issuesOfRaw(raw), 'shard')).toBe('unknown key "shard" (did you mean "shards"?)');
  });

  it('refuses an unknown host key, suggesting the closest known key', () => {
    const raw = validConfig();
    host(raw, 0)['shard'] = host(raw, 0)['shards'];
    delete host(raw, 0)['shards'];
    const issues = issuesOfRaw(raw);
    expect(issueAt(issues, 'hosts[0].shard')).toContain('did you mean "shards"?');
    expect(issueAt(issues, 'hosts[0].shards')).toBe('is required');
  });

  it('suggests the key when only case or underscores differ', () => {
    const raw = validConfig();
    host(raw, 0)['replication_url'] = 'postgres://x/y';
    expect(issueAt(issuesOfRaw(raw), 'hosts[0].replication_url')).toContain('did you mean "replicationUrl"?');
  });

  it('refuses an unknown idLayout key', () => {
    const raw = { ...validConfig(), idLayout: { shardbits: 13 } };
    expect(issueAt(issuesOfRaw(raw), 'idLayout.shardbits')).toContain('did you mean "shardBits"?');
  });

  it('lists the known keys when an unknown key resembles none of them', () => {
    const message = issueAt(issuesOfRaw({ ...validConfig(), colour: 'blue' }), 'colour');
    expect(message).not.toContain('did you mean');
    expect(message).toContain('expected one of schemaPrefix, shards, idLayout');
  });

  it('requires shards and hosts', () => {
    const issues = issuesOfRaw({ schemaPrefix: 'insta' });
    expect(issueAt(issues, 'shards')).toBe('is required');
    expect(issueAt(issues, 'hosts')).toBe('is required');
  });

  it('requires name, url and shards on every host', () => {
    const raw = validConfig();
    (raw['hosts'] as Raw[]).push({});
    const issues = issuesOfRaw(raw);
    expect(issueAt(issues, 'hosts[2].name')).toBe('is required');
    expect(issueAt(issues, 'hosts[2].url')).toBe('is required');
    expect(issueAt(issues, 'hosts[2].shards')).toBe('is required');
  });

  it('refuses a config that is not a mapping', () => {
    expect(
      issueAt(
        issuesOf(() => parse('- 1\n- 2\n')),
        '',
      ),
    ).toContain('the config must be a mapping');
    expect(
      issueAt(
        issuesOf(() => parse('- 1\n- 2\n')),
        '',
      ),
    ).toContain('got a list');
  });

  it('refuses an empty file', () => {
    expect(
      issueAt(
        issuesOf(() => parse('# nothing yet\n')),
        '',
      ),
    ).toContain('got null');
  });

  it('refuses hosts that is not a list', () => {
    const raw = { ...validConfig(), hosts: { pg1: 'postgres://x/y' } };
    expect(issueAt(issuesOfRaw(raw), 'hosts')).toBe('must be a list of hosts, got a mapping');
  });

  it('refuses an empty host list', () => {
    expect(issueAt(issuesOfRaw({ ...validConfig(), hosts: [] }), 'hosts')).toBe(
      'must list at least one host, got a list',
    );
  });

  it('refuses a host that is not a mapping', () => {
    const raw = validConfig();
    (raw['hosts'] as unknown[])[1] = 'pg2';
    expect(issueAt(issuesOfRaw(raw), 'hosts[1]')).toContain('got "pg2"');
  });

  it('refuses shards written as a string', () => {
    expect(issueAt(issuesOfRaw({ ...validConfig(), shards: '2048' }), 'shards')).toContain('got "2048"');
  });

  it('refuses a shard count that is not a positive integer', () => {
    for (const shards of [0, -4, 1.5]) {
      const message = issueAt(issuesOfRaw({ ...validConfig(), shards }), 'shards');
      expect(message).toContain('must be a whole number of shards');
      expect(message).toContain(`got ${shards}`);
    }
  });

  it('refuses more shards than shardBits can address, naming both values', () => {
    const raw = { ...validConfig(), idLayout: { shardBits: 10 } };
    expect(issueAt(issuesOfRaw(raw), 'shards')).toBe(
      '2048 shards do not fit in idLayout.shardBits 10, which allows at most 1024 shards',
    );
  });

  it('refuses a schemaPrefix that is not a lower-case identifier', () => {
    for (const schemaPrefix of ['Insta', '1insta', 'in-sta', 'in sta', '']) {
      const message = issueAt(issuesOfRaw({ ...validConfig(), schemaPrefix }), 'schemaPrefix');
      expect(message).toContain('must be a lower-case identifier');
      expect(message).toContain(JSON.stringify(schemaPrefix));
    }
  });

  it('refuses a schemaPrefix starting with pg_', () => {
    const message = issueAt(issuesOfRaw({ ...validConfig(), schemaPrefix: 'pg_shard' }), 'schemaPrefix');
    expect(message).toContain('reserved by PostgreSQL');
    expect(message).toContain('"pg_shard"');
  });

  it('refuses a schemaPrefix whose last shard schema would pass 63 bytes', () => {
    const fits = 'a'.repeat(59); // + "2047" = 63 bytes
    expect(parseRaw({ ...validConfig(), schemaPrefix: fits }).schemaPrefix).toBe(fits);
    const tooLong = 'a'.repeat(60);
    const message = issueAt(issuesOfRaw({ ...validConfig(), schemaPrefix: tooLong }), 'schemaPrefix');
    expect(message).toContain(JSON.stringify(`${tooLong}2047`));
    expect(message).toContain('64 bytes');
  });

  it('refuses a malformed host name', () => {
    for (const name of ['-pg1', 'pg 1', 'pg/1', 'pg@1']) {
      const raw = validConfig();
      host(raw, 1)['name'] = name;
      expect(issueAt(issuesOfRaw(raw), 'hosts[1].name')).toContain(`got ${JSON.stringify(name)}`);
    }
  });

  it('refuses an empty host name', () => {
    const raw = validConfig();
    host(raw, 1)['name'] = '';
    expect(issueAt(issuesOfRaw(raw), 'hosts[1].name')).toBe('must not be empty, got ""');
  });

  it('refuses duplicate host names, naming both indexes', () => {
    const raw = validConfig();
    host(raw, 1)['name'] = 'pg1';
    expect(issueAt(issuesOfRaw(raw), 'hosts[1].name')).toBe(
      '"pg1" is already the name of hosts[0]; host names must be unique',
    );
  });

  it('refuses two hosts whose url reaches the same server and database, whatever the credentials and case', () => {
    const raw = validConfig();
    host(raw, 1)['url'] = 'postgres://other:pw@DB1/app?sslmode=require';
    expect(issueAt(issuesOfRaw(raw), 'hosts[1].url')).toBe(
      'reaches the same server and database as host "pg1" (hosts[0]); each host of the map is a database of its own',
    );
    // Another database of the same server, or one the URL leaves to the user's name: allowed.
    for (const url of ['postgres://app@db1:5432/app2', 'postgres://app@db1:5433/app', 'postgres://app@db1:5432']) {
      host(raw, 1)['url'] = url;
      expect(() => parseRaw(raw), url).not.toThrow();
    }
  });

  it("refuses a url of several addresses that lists another host's server and database", () => {
    const raw = validConfig();
    // pg1 is db1/app: pg2 listing db1 among its addresses would reach pg1 whenever db1 answers first.
    host(raw, 1)['url'] = 'postgres://app@db2:5432,DB1/app';
    expect(issueAt(issuesOfRaw(raw), 'hosts[1].url')).toBe(
      "lists an address and database of host \"pg1\" (hosts[0])'s url; each host of the map is a database of its own, and a host's call must never reach another's",
    );
    // The same addresses for another database: allowed.
    host(raw, 1)['url'] = 'postgres://app@db2:5432,db1/app2';
    expect(() => parseRaw(raw)).not.toThrow();
  });

  it('treats host names differing only in case as duplicates', () => {
    const raw = validConfig();
    host(raw, 1)['name'] = 'PG1';
    expect(issueAt(issuesOfRaw(raw), 'hosts[1].name')).toContain('hosts[0]');
  });

  it('refuses a url that is not a postgres URL, hiding the password', () => {
    const raw = validConfig();
    host(raw, 0)['url'] = `mysql://app:${PASSWORD}@db1/app`;
    expect(issueAt(issuesOfRaw(raw), 'hosts[0].url')).toBe(
      '"mysql://app:***@db1/app" is not a postgres:// or postgresql:// URL',
    );
  });

  it('refuses a url that cannot be parsed, hiding the password', () => {
    const raw = validConfig();
    host(raw, 0)['url'] = `postgres://app:${PASSWORD}@db1:99999/app`;
    const message = issueAt(issuesOfRaw(raw), 'hosts[0].url');
    expect(message).toContain('"postgres://app:***@db1:99999/app" is not a valid URL');
    expect(message).not.toContain(PASSWORD);
  });

  it('refuses a url with whitespace (an unencoded space in a password), showing none of the url', () => {
    for (const url of ['postgres://app:a b@db1/app', 'postgres://app@db1/app?password=a%20b&sslpassword=c d']) {
      const raw = validConfig();
      host(raw, 0)['url'] = url;
      expect(issueAt(issuesOfRaw(raw), 'hosts[0].url')).toBe(
        'is not a valid URL (it holds whitespace; in a password write a space as %20)',
      );
    }
  });

  it('refuses a url that is not a URL at all', () => {
    const raw = validConfig();
    host(raw, 0)['url'] = 'db1:5432';
    expect(issueAt(issuesOfRaw(raw), 'hosts[0].url')).toContain('"db1:5432" is not a postgres:// or postgresql:// URL');
  });

  it('refuses a ${VAR} naming a missing environment variable, naming the variable and the field', () => {
    const raw = validConfig();
    host(raw, 1)['url'] = '${PG2_URL}';
    expect(issueAt(issuesOfRaw(raw, { env: { PG1_URL: 'postgres://x/y' } }), 'hosts[1].url')).toBe(
      'environment variable PG2_URL is not set (in "${PG2_URL}")',
    );
  });

  it('names the variable when an expanded url is not a postgres URL', () => {
    const raw = validConfig();
    host(raw, 1)['url'] = '${PG2_URL}';
    const message = issueAt(issuesOfRaw(raw, { env: { PG2_URL: `http://u:${PASSWORD}@x/` } }), 'hosts[1].url');
    expect(message).toBe('"http://u:***@x/" is not a postgres:// or postgresql:// URL (expanded from "${PG2_URL}")');
  });

  it('refuses a malformed replicationUrl', () => {
    const raw = validConfig();
    host(raw, 0)['replicationUrl'] = `https://app:${PASSWORD}@10.0.0.1/app`;
    const message = issueAt(issuesOfRaw(raw), 'hosts[0].replicationUrl');
    expect(message).toContain('"https://app:***@10.0.0.1/app"');
  });

  it('never puts a password into any message', () => {
    const raw = validConfig();
    host(raw, 0)['url'] = `mysql://app:${PASSWORD}@db1/app`;
    host(raw, 0)['replicationUrl'] = `postgres://app:${PASSWORD}@db1:99999/app?sslpassword=${PASSWORD}`;
    host(raw, 1)['url'] = `postgres://app:${PASSWORD}@\${MISSING}/app`;
    host(raw, 1)['replicationUrl'] = `postgres://app:p@s s/${PASSWORD}@db2/app`;
    const issues = issuesOfRaw(raw);
    expect(issues.map((issue) => issue.path).sort()).toEqual(
      ['hosts[0].replicationUrl', 'hosts[0].url', 'hosts[1].replicationUrl', 'hosts[1].url'].sort(),
    );
    for (const issue of issues) expect(issue.message).not.toContain(PASSWORD);
  });

  it('refuses an unparseable shard list with the message from parseShardList', () => {
    const raw = validConfig();
    host(raw, 1)['shards'] = '1024-2047,2047';
    expect(issueAt(issuesOfRaw(raw), 'hosts[1].shards')).toBe(
      'invalid shard list "1024-2047,2047": shard 2047 is listed more than once',
    );
  });

  it('refuses a negative YAML integer as a host’s shards', () => {
    const raw = validConfig();
    host(raw, 1)['shards'] = -1;
    expect(issueAt(issuesOfRaw(raw), 'hosts[1].shards')).toContain('negative');
  });

  it('refuses shards out of range, listing them compactly', () => {
    const raw = validConfig();
    host(raw, 1)['shards'] = '1024-2050,3000';
    expect(issueAt(issuesOfRaw(raw), 'hosts[1].shards')).toBe(
      'shards 2048-2050,3000 of host "pg2" (hosts[1]) are out of range: shards is 2048, so shards are numbered 0-2047',
    );
  });

  it('refuses overlapping shard ranges, naming both hosts and the shared shards', () => {
    const raw = validConfig();
    host(raw, 1)['shards'] = '1000-2047';
    expect(issueAt(issuesOfRaw(raw), 'hosts[1].shards')).toBe(
      'shards 1000-1023 are on both host "pg1" (hosts[0]) and host "pg2" (hosts[1]); every shard must be on exactly one host',
    );
  });

  it('reports each pair of overlapping hosts separately', () => {
    const raw = validConfig();
    (raw['hosts'] as Raw[]).push({ name: 'pg3', url: 'postgres://db3/app', shards: '5,2000' });
    const issues = issuesOfRaw(raw).filter((issue) => issue.path === 'hosts[2].shards');
    expect(issues.map((issue) => issue.message)).toEqual([
      'shard 5 is on both host "pg1" (hosts[0]) and host "pg3" (hosts[2]); every shard must be on exactly one host',
      'shard 2000 is on both host "pg2" (hosts[1]) and host "pg3" (hosts[2]); every shard must be on exactly one host',
    ]);
  });

  it('refuses shards mapped to no host, listing them compactly', () => {
    const raw = validConfig();
    host(raw, 0)['shards'] = '0-9,11-99,101-1023';
    host(raw, 1)['shards'] = '1024-2000';
    expect(issueAt(issuesOfRaw(raw), 'hosts')).toBe(
      'shards 10,100,2001-2047 are on no host; every shard 0-2047 must be on exactly one host',
    );
  });

  it('reports a shard left out of any valid map as unmapped', () => {
    fc.assert(
      fc.property(fc.integer({ min: 2, max: 500 }), fc.nat(), (shards, pick) => {
        const missing = pick % shards;
        const rest = Array.from({ length: shards }, (_, i) => i).filter((shard) => shard !== missing);
        const raw = { shards, hosts: [{ name: 'pg1', url: 'postgres://db1/app', shards: formatShardList(rest) }] };
        expect(issueAt(issuesOfRaw(raw), 'hosts')).toContain(`shard ${missing} is on no host`);
      }),
      { numRuns: 50 },
    );
  });

  it('does not report unmapped shards while a host’s list cannot be read', () => {
    const raw = validConfig();
    host(raw, 1)['shards'] = '1024-2047,x';
    const issues = issuesOfRaw(raw);
    expect(issues.map((issue) => issue.path)).toEqual(['hosts[1].shards']);
  });

  it('refuses an epoch that is not an ISO 8601 timestamp with a zone', () => {
    for (const epoch of ['2011-08-24', '2011-08-24T21:07:01', 'yesterday', '2011-02-30T00:00:00Z', '1314220021721']) {
      const message = issueAt(issuesOfRaw({ ...validConfig(), idLayout: { epoch } }), 'idLayout.epoch');
      expect(message).toContain('must be an ISO 8601 timestamp');
      expect(message).toContain(JSON.stringify(epoch));
    }
  });

  it('refuses an epoch given as a number', () => {
    const message = issueAt(issuesOfRaw({ ...validConfig(), idLayout: { epoch: 1314220021721 } }), 'idLayout.epoch');
    expect(message).toContain('got 1314220021721');
  });

  it('refuses an epoch in the future', () => {
    const raw = { ...validConfig(), idLayout: { epoch: '2025-06-01T00:00:00Z' } };
    expect(issueAt(issuesOfRaw(raw), 'idLayout.epoch')).toBe(
      '"2025-06-01T00:00:00Z" is in the future (now is 2025-01-01T00:00:00.000Z); ids before it cannot be made',
    );
  });

  it('refuses shardBits and sequenceBits below 1 or not integers', () => {
    const issues = issuesOfRaw({ ...validConfig(), idLayout: { shardBits: 0, sequenceBits: 2.5 } });
    expect(issueAt(issues, 'idLayout.shardBits')).toBe('must be an integer of at least 1, got 0');
    expect(issueAt(issues, 'idLayout.sequenceBits')).toBe('must be an integer of at least 1, got 2.5');
  });

  it('refuses a layout that leaves no time bits', () => {
    const raw = { ...validConfig(), idLayout: { shardBits: 13, sequenceBits: 50 } };
    const message = issueAt(issuesOfRaw(raw), 'idLayout');
    expect(message).toContain('shardBits 13 + sequenceBits 50 leave no bits for the time');
  });

  it('refuses a layout whose ids have already run out, naming the date', () => {
    const issues = issuesOfRaw(validConfig(), { now: new Date('2047-01-01T00:00:00Z') });
    expect(issueAt(issues, 'idLayout')).toContain('ids ran out on 2046-06-27T17:00:49.497Z');
  });

  it('warns, without failing, when ids run out within 10 years', () => {
    const config = parseRaw(validConfig(), { now: new Date('2037-01-01T00:00:00Z') });
    expect(config.warnings).toHaveLength(1);
    expect(config.warnings[0]).toMatch(/^idLayout: ids run out on 2046-06-27T17:00:49\.497Z \(within 10 years\); /);
  });

  it('does not warn when ids last more than 10 years', () => {
    expect(parseRaw(validConfig(), { now: new Date('2036-06-27T00:00:00Z') }).warnings).toEqual([]);
  });

  it('refuses a missing migrations folder, naming the resolved path', () => {
    const raw = { ...validConfig(), migrations: './db/migrations' };
    expect(issueAt(issuesOfRaw(raw), 'migrations')).toBe(`folder ${path.join(dir, 'db', 'migrations')} does not exist`);
  });

  it('refuses a migrations path that is a file', () => {
    writeFileSync(path.join(dir, 'not-a-folder'), '');
    const raw = { ...validConfig(), migrations: 'not-a-folder' };
    expect(issueAt(issuesOfRaw(raw), 'migrations')).toBe(`${path.join(dir, 'not-a-folder')} is not a folder`);
  });

  it('refuses a concurrency outside 1..64', () => {
    for (const concurrency of [0, 65, 1.5, '2']) {
      const message = issueAt(issuesOfRaw({ ...validConfig(), concurrency }), 'concurrency');
      expect(message).toBe(`must be an integer from 1 to 64, got ${JSON.stringify(concurrency)}`);
    }
  });

  it('refuses a lockTimeout that is not like 500ms, 5s or 1min', () => {
    for (const lockTimeout of ['5', '5 s', '1h', '-5s', 5]) {
      const message = issueAt(issuesOfRaw({ ...validConfig(), lockTimeout }), 'lockTimeout');
      expect(message).toContain('must be a duration such as "500ms", "5s" or "1min"');
      expect(message).toContain(`got ${JSON.stringify(lockTimeout)}`);
    }
  });

  it('refuses text that is not YAML, giving the line and column', () => {
    const issues = issuesOf(() => parse('shards: 2048\nhosts: [\n  {name: pg1\n'));
    expect(issues).toHaveLength(1);
    expect(issues[0]!.path).toBe('');
    expect(issues[0]!.message).toMatch(/^not valid YAML at line \d+, column \d+: /);
  });

  it('refuses a YAML file with a repeated key, giving its line', () => {
    const issues = issuesOf(() => parse('shards: 2048\nhosts: []\nshards: 4\n'));
    expect(issueAt(issues, '')).toMatch(/^not valid YAML at line 3, column 1: .*unique/);
  });

  it('refuses a YAML alias bomb instead of expanding it', () => {
    const lines = ['a: &a [x, x, x, x, x, x, x, x, x, x]'];
    for (let i = 1; i <= 12; i++) {
      const [name, previous] = [String.fromCharCode(97 + i), String.fromCharCode(96 + i)];
      lines.push(`${name}: &${name} [${Array(10).fill(`*${previous}`).join(', ')}]`);
    }
    expect(
      issueAt(
        issuesOf(() => parse(lines.join('\n'))),
        '',
      ),
    ).toMatch(/^not valid YAML: Excessive alias count/);
  });

  it('refuses text that is not JSON, giving the line and column', () => {
    const issues = issuesOf(() => parse('{\n  "shards": 2048\n  "hosts": []\n}', { format: 'json' }));
    expect(issueAt(issues, '')).toMatch(/^not valid JSON at line 3, column 3: /);
  });

  it('does not echo the text around a JSON error, which may hold a password', () => {
    const text = `{"hosts": [":pw9@",]}`;
    expect(() => JSON.parse(text)).toThrow('pw9'); // V8 quotes it; the config error must not
    const message = issueAt(
      issuesOf(() => parse(text, { format: 'json' })),
      '',
    );
    expect(message).toBe("not valid JSON: Unexpected token ']'");
  });

  it('refuses a key given twice in one JSON object, naming it and where (as YAML does)', () => {
    // JSON.parse keeps the last one without a word: a second url would replace the first.
    const text = `{\n  "shards": 2048,\n  "hosts": [],\n  "shards": 8\n}`;
    const message = issueAt(
      issuesOf(() => parse(text, { format: 'json' })),
      '',
    );
    expect(message).toBe('not valid JSON at line 4, column 3: key "shards" given twice in one object');
  });

  it('reads a JSON file that starts with a byte order mark, as it reads YAML', () => {
    const config = parse(`\uFEFF${JSON.stringify(validConfig())}`, { file: path.join(dir, 'shardctl.json') });
    expect(config.shards).toBe(validConfig().shards);
  });
});

describe('loadConfig', () => {
  it('reads the file it is given', async () => {
    const file = path.join(dir, 'given.yaml');
    writeFileSync(file, stringify(validConfig()));
    const config = await loadConfig(file, { now: NOW, env: {} });
    expect(config.file).toBe(file);
    expect(config.hosts).toHaveLength(2);
  });

  it('reads $SHARDCTL_CONFIG when no file is given, as JSON when it ends in .json', async () => {
    const file = path.join(dir, 'from-env.json');
    writeFileSync(file, JSON.stringify(validConfig()));
    const config = await loadConfig(undefined, { now: NOW, env: { SHARDCTL_CONFIG: file } });
    expect(config.file).toBe(file);
  });

  it('reads ./shardctl.yaml in cwd by default', async () => {
    writeFileSync(configFile, stringify(validConfig()));
    const config = await loadConfig(undefined, { now: NOW, env: {}, cwd: dir });
    expect(config.file).toBe(configFile);
  });

  it('expands ${VAR} from the environment it is given', async () => {
    const raw = validConfig();
    host(raw, 1)['url'] = '${PG2_URL}';
    const file = path.join(dir, 'with-env.yaml');
    writeFileSync(file, stringify(raw));
    const config = await loadConfig(file, { now: NOW, env: { PG2_URL: 'postgres://db2/app' } });
    expect(config.hosts[1]!.url).toBe('postgres://db2/app');
  });

  it('refuses a missing file, naming the path', async () => {
    const file = path.join(dir, 'missing.yaml');
    const error = await loadConfig(file, { env: {} }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(ConfigError);
    expect((error as ConfigError).message).toContain(`config file ${file} does not exist`);
    expect((error as ConfigError).exitCode).toBe(2);
  });

  it('refuses a folder given as the config file', async () => {
    const error = await loadConfig(dir, { env: {} }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(ConfigError);
    expect((error as ConfigError).message).toContain(`config file ${dir} is a folder`);
  });

  it('refuses a FIFO at once instead of waiting for a writer', async () => {
    const fifo = path.join(dir, 'config.fifo');
    execFileSync('mkfifo', [fifo]);
    const error = await loadConfig(fifo, { env: {} }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(ConfigError);
    expect((error as ConfigError).message).toContain(`config file ${fifo} is not a regular file`);
    expect((error as ConfigError).exitCode).toBe(2);
  });

  it('refuses a config over 1 MiB before parsing it, from a file or from text', async () => {
    const raw = validConfig();
    raw['comment'] = 'x'.repeat(MAX_CONFIG_BYTES);
    const file = path.join(dir, 'huge.yaml');
    writeFileSync(file, stringify(raw));
    const error = await loadConfig(file, { env: {} }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(ConfigError);
    expect((error as ConfigError).message).toMatch(/huge\.yaml is 1\.0 MiB; a config is at most 1 MiB/);
    expect(
      issueAt(
        issuesOf(() => parse(stringify(raw))),
        '',
      ),
    ).toMatch(/is 1\.0 MiB; a config is at most 1 MiB/);
  });
});

describe('resolveConfigPath', () => {
  it('prefers the argument, then $SHARDCTL_CONFIG, then ./shardctl.yaml, resolved against cwd', () => {
    expect(resolveConfigPath('a.yaml', { SHARDCTL_CONFIG: 'b.yaml' }, '/srv')).toBe('/srv/a.yaml');
    expect(resolveConfigPath(undefined, { SHARDCTL_CONFIG: 'b.yaml' }, '/srv')).toBe('/srv/b.yaml');
    expect(resolveConfigPath(undefined, { SHARDCTL_CONFIG: '' }, '/srv')).toBe('/srv/shardctl.yaml');
    expect(resolveConfigPath(undefined, {}, '/srv')).toBe('/srv/shardctl.yaml');
    expect(resolveConfigPath('/etc/shardctl.yaml', {}, '/srv')).toBe('/etc/shardctl.yaml');
  });
});

describe('expandEnv', () => {
  it('replaces each ${NAME} with its value', () => {
    expect(expandEnv('postgres://${USER_1}:${PW}@db/${USER_1}', { USER_1: 'app', PW: 'x' })).toEqual({
      value: 'postgres://app:x@db/app',
    });
  });

  it('leaves a lone $ and $NAME without braces alone', () => {
    expect(expandEnv('a$b$ $', { b: 'no' })).toEqual({ value: 'a$b$ $' });
  });

  it('expands a variable set to the empty string', () => {
    expect(expandEnv('x${EMPTY}y', { EMPTY: '' })).toEqual({ value: 'xy' });
  });

  it('names every missing variable once', () => {
    expect(expandEnv('${A}${B}${A}', { C: '1' })).toEqual({ error: 'environment variables A, B are not set' });
    expect(expandEnv('${A}', {})).toEqual({ error: 'environment variable A is not set' });
  });

  it('refuses a malformed reference', () => {
    expect(expandEnv('${PG2-URL}', {})).toEqual({
      error: '"${PG2-URL}" is not a valid variable reference (names are letters, digits and _)',
    });
    expect(expandEnv('${1X}', {})).toHaveProperty('error');
    expect(expandEnv('abc${X', { X: '1' })).toEqual({ error: 'unterminated "${" (expected ${NAME})' });
  });

  it('does not expand references inside values', () => {
    expect(expandEnv('${A}', { A: '${B}', B: 'no' })).toEqual({ value: '${B}' });
  });
});

describe('redactUrl', () => {
  it('hides the password of a URL', () => {
    expect(redactUrl('postgres://app:secret@db1:5432/app')).toBe('postgres://app:***@db1:5432/app');
  });

  it('leaves a URL without a password alone', () => {
    expect(redactUrl('postgres://app@db1:5432/app')).toBe('postgres://app@db1:5432/app');
    expect(redactUrl('postgres://db1:5432/app')).toBe('postgres://db1:5432/app');
  });

  it('hides passwords containing @, / or ?', () => {
    expect(redactUrl('postgres://app:p@s/s?x@db1/app')).toBe('postgres://app:***@db1/app');
  });

  it('hides password and sslpassword parameters', () => {
    expect(redactUrl('postgres://db1/app?password=secret&sslpassword=other&x=1')).toBe(
      'postgres://db1/app?password=***&sslpassword=***&x=1',
    );
    expect(redactUrl('host=db1 password=secret dbname=app')).toBe('host=db1 password=*** dbname=app');
  });
});

describe('lockTimeout of zero', () => {
  it('is refused, because PostgreSQL would read it as wait forever', async () => {
    const { parseConfig } = await import('../../src/config/load.js');
    expect(() =>
      parseConfig('shards: 2\nlockTimeout: 0s\nhosts:\n  - name: a\n    url: postgres://x@h/db\n    shards: "0-1"\n', {
        file: '/tmp/c.yaml',
        checkMigrationsDir: false,
      }),
    ).toThrow(/lockTimeout: must be more than 0 .*"0s"|lockTimeout.*0s.*more than 0|lockTimeout: must be more than 0/);
  });
});

describe('${VAR:-default}', () => {
  it('takes the default when the variable is unset or empty, the value otherwise', () => {
    expect(expandEnv('postgres://${HOST:-localhost}:${PORT:-5432}/app', {})).toEqual({
      value: 'postgres://localhost:5432/app',
    });
    expect(expandEnv('postgres://${HOST:-localhost}/app', { HOST: '' })).toEqual({ value: 'postgres://localhost/app' });
    expect(expandEnv('postgres://${HOST:-localhost}/app', { HOST: 'db1' })).toEqual({ value: 'postgres://db1/app' });
  });

  it('allows an empty default, and takes the default as written', () => {
    expect(expandEnv('a${X:-}b', {})).toEqual({ value: 'ab' });
    expect(expandEnv('${X:-$Y:-z}', { Y: 'no' })).toEqual({ value: '$Y:-z' });
  });

  it('still refuses a malformed name before the default', () => {
    expect(expandEnv('${PG2-URL:-x}', {})).toEqual({
      error: '"${PG2-URL:-x}" is not a valid variable reference (names are letters, digits and _)',
    });
  });

  it('works in a host url, as in docker-compose.yml', () => {
    const raw = validConfig();
    host(raw, 1)['url'] = 'postgres://app@${PG2_HOST:-db2}:5432/app';
    expect(parseRaw(raw).hosts[1]!.url).toBe('postgres://app@db2:5432/app');
    expect(parseRaw(raw, { env: { PG2_HOST: 'db9' } }).hosts[1]!.url).toBe('postgres://app@db9:5432/app');
  });
});
