import { existsSync, readdirSync, readFileSync, realpathSync, rmSync, writeFileSync } from 'node:fs';
import { join, relative } from 'node:path';
import { describe, expect, it } from 'vitest';
import { FIXTURE_MIGRATIONS, makeFleet } from '../helpers/fleet.js';

const ROOT = join(import.meta.dirname, '..', '..');
const CHECKOUT_MIGRATIONS = join(ROOT, 'migrations');
const FIXTURE_FILES = ['0001_photos.sql', '0002_likes.sql', '0003_comments.sql'];

function sourcesUnder(dir: string): string[] {
  return readdirSync(dir, { recursive: true, encoding: 'utf8' })
    .filter((file) => /\.(ts|js)$/.test(file) && !file.includes('node_modules') && !file.startsWith('results'))
    .map((file) => join(dir, file))
    .filter((file) => file !== import.meta.filename);
}

describe("the tests' fixture migrations", () => {
  it("live under test/fixtures/, not in the checkout's migrations/", () => {
    expect(realpathSync(FIXTURE_MIGRATIONS)).not.toBe(realpathSync(CHECKOUT_MIGRATIONS));
    expect(relative(ROOT, FIXTURE_MIGRATIONS)).toBe(join('test', 'fixtures', 'migrations'));
    expect(readdirSync(FIXTURE_MIGRATIONS).sort()).toEqual(FIXTURE_FILES);
  });

  it("give a test fleet exactly the fixture files while a user's new migration sits in the checkout's migrations/", () => {
    // What `shardctl migration new x -c shardctl.dev.yaml` leaves behind in a checkout.
    const userFile = join(CHECKOUT_MIGRATIONS, `0004_user_${process.pid}.sql`);
    writeFileSync(userFile, 'CREATE TABLE user_table (id bigint PRIMARY KEY);\n');
    try {
      const fleet = makeFleet({ urls: ['postgres://a@h1/db'], replicationUrls: ['postgres://a@h1/db'], shards: 2 });
      try {
        expect(readdirSync(fleet.migrationsDir).sort()).toEqual(FIXTURE_FILES);
        for (const file of FIXTURE_FILES)
          expect(readFileSync(join(fleet.migrationsDir, file), 'utf8')).toBe(
            readFileSync(join(FIXTURE_MIGRATIONS, file), 'utf8'),
          );
      } finally {
        rmSync(fleet.dir, { recursive: true, force: true });
      }
    } finally {
      rmSync(userFile, { force: true });
    }
    expect(existsSync(userFile)).toBe(false);
  });

  it("are the only migrations test/ and bench/ read: no source names the checkout's migrations/ folder", () => {
    const offenders = [...sourcesUnder(join(ROOT, 'test')), ...sourcesUnder(join(ROOT, 'bench'))].filter((file) =>
      /(ROOT|'\.\.', '\.\.'), 'migrations'\)/.test(readFileSync(file, 'utf8')),
    );
    expect(offenders.map((file) => relative(ROOT, file))).toEqual([]);
  });
});
