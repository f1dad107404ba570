import { cpSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { readMigrations } from '../../src/migrations/files.js';
import { FIXTURE_MIGRATIONS, runCli } from '../helpers/fleet.js';
import { tempDir } from '../helpers/temp.js';

/** A config over hosts that are never contacted, with the example migrations 0001-0003. */
function project(): { dir: string; configFile: string; migrationsDir: string } {
  const dir = tempDir('shardctl-new-');
  const migrationsDir = join(dir, 'migrations');
  cpSync(FIXTURE_MIGRATIONS, migrationsDir, { recursive: true });
  const configFile = join(dir, 'shardctl.yaml');
  writeFileSync(
    configFile,
    'shards: 8\nmigrations: ./migrations\nhosts:\n  - { name: pg1, url: "postgres://a@h1/db", shards: "0-7" }\n',
  );
  return { dir, configFile, migrationsDir };
}

describe('shardctl migration new', () => {
  it('writes consecutive numbers, each file loading as the loader reads it', async () => {
    const { configFile, migrationsDir } = project();
    const first = await runCli(['migration', 'new', 'add_views', '-c', configFile]);
    expect(first.code).toBe(0);
    expect(first.stdout.trim()).toBe(join(migrationsDir, '0004_add_views.sql'));
    expect(first.stderr).toContain('migration new: wrote 0004_add_views.sql (version 4)');
    const second = await runCli(['migration', 'new', 'photo_idx', '--no-transaction', '--json', '-c', configFile]);
    expect(second.code).toBe(0);
    expect(JSON.parse(second.stdout)).toEqual({
      path: join(migrationsDir, '0005_photo_idx.sql'),
      name: '0005_photo_idx',
      version: 5,
      noTransaction: true,
    });

    const loaded = await readMigrations(migrationsDir);
    expect(loaded.map((m) => [m.name, m.noTransaction, m.lockTimeout])).toEqual([
      ['0001_photos', false, null],
      ['0002_likes', false, null],
      ['0003_comments', false, null],
      ['0004_add_views', false, null],
      ['0005_photo_idx', true, null],
    ]);
    expect(readFileSync(join(migrationsDir, '0004_add_views.sql'), 'utf8')).toMatch(
      /^-- 0004_add_views: applied once to every shard schema.*in one transaction with its record/s,
    );
    expect(readFileSync(join(migrationsDir, '0005_photo_idx.sql'), 'utf8')).toMatch(
      /^-- shardctl:no-transaction\n-- 0005_photo_idx: .*OUTSIDE a transaction.*IF NOT EXISTS/s,
    );
  });

  it('keeps the width of the numbers already in the folder', async () => {
    const { configFile, migrationsDir } = project();
    writeFileSync(join(migrationsDir, '000120_wide.sql'), 'SELECT 1;\n');
    const run = await runCli(['migration', 'new', 'next', '-c', configFile]);
    expect(run.code).toBe(0);
    expect(readdirSync(migrationsDir)).toContain('000121_next.sql');
  });

  it.each(['add views', '_views', 'a/b', 'views;drop'])(
    'refuses the name %j (exit 2), writing nothing',
    async (name) => {
      const { configFile, migrationsDir } = project();
      const run = await runCli(['migration', 'new', name, '-c', configFile]);
      expect(run.code).toBe(2);
      expect(run.stderr).toContain(`argument <name> ${JSON.stringify(name)}: expected letters, digits, _ . or -`);
      expect(readdirSync(migrationsDir).sort()).toEqual(['0001_photos.sql', '0002_likes.sql', '0003_comments.sql']);
    },
  );
});

describe('reading migration files', () => {
  it('leaves out a UTF-8 byte-order mark (the server would read it as part of the first word); the checksum is of the bytes', async () => {
    const { migrationsDir } = project();
    const text = 'CREATE TABLE tags (id bigint);\n';
    writeFileSync(join(migrationsDir, '0004_tags.sql'), `\uFEFF${text}`);
    const tags = (await readMigrations(migrationsDir)).find((m) => m.version === 4)!;
    expect(tags.sql).toBe(text);
    expect(tags.statements).toEqual(['CREATE TABLE tags (id bigint)']);
    writeFileSync(join(migrationsDir, '0004_tags.sql'), text);
    expect((await readMigrations(migrationsDir)).find((m) => m.version === 4)!.checksum).not.toBe(tags.checksum);
  });
});
