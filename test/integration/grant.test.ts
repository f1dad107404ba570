import { randomBytes } from 'node:crypto';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import pg from 'pg';
import { describe, expect, it } from 'vitest';
import { init } from '../../src/commands/init.js';
import { moveShards } from '../../src/commands/move-shard.js';
import { gc } from '../../src/commands/gc.js';
import { ShardRouter } from '../../src/router/router.js';
import { makeFleet, runCli } from '../helpers/fleet.js';
import { errorOf, useTestDatabases, withClient } from '../helpers/hosts.js';

const PHOTOS_ONLY = {
  '0001_photos.sql': `CREATE SEQUENCE photos_id_seq;
CREATE TABLE photos (id bigint PRIMARY KEY DEFAULT next_id('photos_id_seq'), user_id bigint NOT NULL, image_url text NOT NULL);
ALTER SEQUENCE photos_id_seq OWNED BY photos.id;`,
};

const suffix = randomBytes(4).toString('hex');
const APP = `app_${suffix}`;
const READER = `reader_${suffix}`;
/** A role given nothing. */
const OUTSIDER = `outsider_${suffix}`;
const PASSWORD = `pw_${suffix}`;

function asRole(url: string, role: string): string {
  const u = new URL(url);
  u.username = role;
  u.password = PASSWORD;
  return u.toString();
}

describe('shardctl grant', () => {
  const db = useTestDatabases(2);

  it('gives an application role what a router needs, from a file and from seeds, through a move and a gc, and no control table to write', async () => {
    const fleet = makeFleet({ urls: db.urls, shards: 8, schemaPrefix: 'gr', migrations: PHOTOS_ONLY });
    const config = await fleet.config();
    expect((await init(config)).ok).toBe(true);
    for (const url of db.urls) {
      await withClient(url, async (client) => {
        for (const role of [APP, READER, OUTSIDER]) {
          await client.query(`DROP ROLE IF EXISTS ${role}`).catch(() => undefined);
          await client.query(`CREATE ROLE ${role} LOGIN PASSWORD '${PASSWORD}'`);
        }
      });
    }
    const both = await runCli(['grant', APP, '--app', '--readonly', '-c', fleet.configFile]);
    expect(both.code).toBe(2);
    expect(both.stderr).toContain('exactly one of --app and --readonly');
    // A predefined role reaches every member PostgreSQL gave it for other reasons: refused, even as a dry run.
    for (const predefined of ['pg_signal_backend', 'pg_read_all_data']) {
      const refused = await runCli(['grant', predefined, '--app', '--dry-run', '-c', fleet.configFile]);
      expect(refused.code, refused.stderr).toBe(2);
      expect(refused.stderr).toContain(`"${predefined}": is one of PostgreSQL's predefined roles`);
      expect(refused.stdout).toBe('');
    }
    const missing = await runCli(['grant', `nobody_${suffix}`, '--app', '-c', fleet.configFile]);
    expect(missing.code).toBe(1);
    expect(missing.stderr).toMatch(/host pg\d: role "nobody_\w+" does not exist/);
    const dry = await runCli(['grant', APP, '--app', '--dry-run', '-c', fleet.configFile]);
    expect(dry.code).toBe(0);
    expect(dry.stdout).toContain(
      `GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA "gr0", "gr1", "gr2", "gr3" TO "${APP}";`,
    );
    // The dry run granted nothing.
    await withClient(db.urls[0]!, async (client) => {
      const r = await client.query<{ ok: boolean }>(`SELECT has_schema_privilege($1, 'gr0', 'USAGE') AS ok`, [APP]);
      expect(r.rows[0]!.ok).toBe(false);
    });
    for (const [role, flag] of [
      [APP, '--app'],
      [READER, '--readonly'],
    ] as const) {
      const run = await runCli(['grant', role, flag, '-c', fleet.configFile]);
      expect({ code: run.code, stderr: run.stderr }).toEqual({ code: 0, stderr: expect.stringContaining('grant: ') });
    }

    // The application's config: the same hosts, as the application role.
    const appFile = join(fleet.dir, 'app.yaml');
    writeFileSync(
      appFile,
      db.urls.reduce((text, url) => text.replace(url, asRole(url, APP)), readFileSync(fleet.configFile, 'utf8')),
    );
    const fromFile = await ShardRouter.open(appFile);
    const fromSeed = await ShardRouter.open({ seeds: [asRole(db.urls[1]!, APP)] });
    let failed = 0;
    let written = 0;
    let stop = false;
    const write = async (router: ShardRouter, key: bigint) => {
      try {
        await router.withKey(key, (client) =>
          client.query(`INSERT INTO photos (user_id, image_url) VALUES ($1, 'x')`, [key.toString()]),
        );
        written += 1;
      } catch {
        failed += 1;
      }
    };
    // Every write to shard 0 (keys that are multiples of 8), the shard that moves.
    const writers = [fromFile, fromSeed].map(async (router) => {
      for (let n = 0; !stop || n < 20; n++) await write(router, BigInt(n * 8));
    });
    try {
      const moved = await moveShards(config, [0], 'pg2', { configFile: fleet.configFile });
      expect(moved.moves.map((m) => m.outcome)).toEqual(['moved']);
      expect((await gc(await fleet.config())).oldCopies.map((c) => c.shard)).toEqual([0]);
      await new Promise((resolve) => setTimeout(resolve, 300));
    } finally {
      stop = true;
      await Promise.all(writers);
    }
    expect(failed).toBe(0);
    expect(written).toBeGreaterThan(40);

    // Rows and their sequences on the moved shard still work for the role, and it writes no control table.
    const app = new pg.Client({ connectionString: asRole(db.urls[1]!, APP) });
    await app.connect();
    try {
      const r = await app.query<{ n: number }>('SELECT count(*)::int AS n FROM gr0.photos');
      expect(r.rows[0]!.n).toBe(written);
      const update = await errorOf(app.query(`UPDATE shardctl.hosts SET address = 'postgres://evil:5432/x'`));
      expect(update.code).toBe('42501');
      const lock = await errorOf(app.query(`DELETE FROM shardctl.placement`));
      expect(lock.code).toBe('42501');
      const ddl = await errorOf(app.query('CREATE TABLE gr0.mine (x int)'));
      expect(ddl.code).toBe('42501');
    } finally {
      await app.end();
    }
    await fromFile.close();
    await fromSeed.close();

    // A migration's new table is the role's too (default privileges); the read-only role reads, never writes.
    fleet.writeMigration('0002_tags.sql', 'CREATE TABLE tags (photo_id bigint NOT NULL, tag text NOT NULL);\n');
    expect((await runCli(['migrate', '-c', fleet.configFile])).code).toBe(0);
    const router = await ShardRouter.open(appFile);
    try {
      await router.withShard(5, (client) => client.query(`INSERT INTO tags VALUES (1, 'a')`));
    } finally {
      await router.close();
    }
    const reader = new pg.Client({ connectionString: asRole(db.urls[1]!, READER) });
    await reader.connect();
    try {
      expect((await reader.query<{ n: number }>('SELECT count(*)::int AS n FROM gr5.tags')).rows[0]!.n).toBe(1);
      expect((await errorOf(reader.query(`INSERT INTO gr5.tags VALUES (2, 'b')`))).code).toBe('42501');
    } finally {
      await reader.end();
    }

    // Monitoring: status runs as the read-only role; the application role is told what to grant.
    const asFile = (role: string) => {
      const file = join(fleet.dir, `${role}.yaml`);
      writeFileSync(
        file,
        db.urls.reduce((text, url) => text.replace(url, asRole(url, role)), readFileSync(fleet.configFile, 'utf8')),
      );
      return file;
    };
    const monitored = await runCli(['status', '-c', asFile(READER)]);
    expect(monitored.code, monitored.stdout + monitored.stderr).toBe(0);
    expect(monitored.stdout).toMatch(/^pg1: ok — /m);
    const denied = await runCli(['status', '-c', appFile]);
    expect(denied.code).toBe(1);
    expect(denied.stdout).toMatch(
      new RegExp(
        `^pg1: NOT READABLE: .*permission denied for table \\w+ \\(SQLSTATE 42501\\); the role ${APP} may not read the control schema: \`shardctl grant ${APP} --readonly\` \\(run with the owner's config\\) lets it run status, map show and map pull`,
        'm',
      ),
    );

    // map set-address as a role that may read the registry but not write it: refused on every host
    // before any is written, naming the owner; not "unreachable, run again".
    const registryBefore = await withClient(db.urls[0]!, (c) =>
      c.query('SELECT name, address FROM shardctl.hosts ORDER BY 1'),
    );
    for (const file of [appFile, asFile(READER)]) {
      const set = await runCli(['map', 'set-address', 'pg1', '-c', file]);
      expect(set.code, set.stdout + set.stderr).toBe(1);
      expect(set.stderr).toContain('map set-address: this role may not write the host registry; nothing was changed');
      expect(set.stderr).toMatch(/host pg1: \w+ has no rights on the control schema shardctl, which belongs to \w+/);
      expect(set.stderr).toMatch(/host pg2: /);
      expect(set.stdout + set.stderr).not.toContain('UNREACHABLE');
      expect(set.stdout + set.stderr).not.toContain(PASSWORD);
    }
    // grant as a role that does not own the fleet: refused before anything is sent, naming the owner.
    const notOwner = await runCli(['grant', OUTSIDER, '--readonly', '-c', appFile]);
    expect(notOwner.code, notOwner.stdout + notOwner.stderr).toBe(1);
    expect(notOwner.stderr).toMatch(
      /host pg\d: \w+ has no rights on the control schema shardctl, which belongs to \w+/,
    );
    await withClient(db.urls[0]!, async (client) => {
      const r = await client.query<{ ok: boolean }>(`SELECT has_schema_privilege($1, 'gr1', 'USAGE') AS ok`, [
        OUTSIDER,
      ]);
      expect(r.rows[0]!.ok).toBe(false);
    });
    const registryAfter = await withClient(db.urls[0]!, (c) =>
      c.query('SELECT name, address FROM shardctl.hosts ORDER BY 1'),
    );
    expect(registryAfter.rows).toEqual(registryBefore.rows);

    // A role given nothing: map show, map pull and a router opened from seeds say what to grant.
    const hint = `the role ${OUTSIDER} may not read the control schema: \`shardctl grant ${OUTSIDER} --readonly\` (run with the owner's config) lets it run status, map show and map pull, \`--app\` lets an application's router read the map`;
    for (const command of [
      ['map', 'show'],
      ['map', 'pull'],
    ]) {
      const run = await runCli([...command, '-c', asFile(OUTSIDER)]);
      expect(run.code, run.stdout + run.stderr).toBe(1);
      expect(run.stdout + run.stderr).toContain('permission denied for schema shardctl');
      expect(run.stdout + run.stderr).toContain(hint);
      expect(run.stdout + run.stderr).not.toContain(PASSWORD);
      if (command[1] === 'show') expect(run.stdout).toMatch(/^fleet \(unknown: no host could be read\)/);
    }
    const refused = await errorOf(ShardRouter.open({ seeds: [asRole(db.urls[0]!, OUTSIDER)] }));
    expect(refused.message).toContain(hint);
    expect(refused.message).not.toContain(PASSWORD);
  });
});
