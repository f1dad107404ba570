import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import pg from 'pg';
import { describe, expect, it } from 'vitest';
import { ShardMap, shardMovedTo } from '../../src/config/shard-map.js';
import { moveShard } from '../../src/commands/move-shard.js';
import { init } from '../../src/commands/init.js';
import { status } from '../../src/commands/status.js';
import { makeFleet, runCli } from '../helpers/fleet.js';
import { pastIncomingGuard, replicationObjects, seededFleet, startShardWriter } from '../helpers/moves.js';
import { useTestDatabases, withClient } from '../helpers/hosts.js';
import { waitFor } from '../helpers/migrations.js';

const db = useTestDatabases(2);

/** Tracking triggers on any table, and recorded changes of any move, left on a host. */
async function trackingLeftovers(url: string): Promise<{ triggers: number; changes: number }> {
  return withClient(url, async (c) => {
    const r = await c.query<{ triggers: number; changes: number }>(`select
      (select count(*)::int from pg_trigger where tgname like 'shardctl_track%') as triggers,
      (select case when to_regclass('shardctl.move_changes') is null then 0 else (select count(*)::int from shardctl.move_changes) end) as changes`);
    return r.rows[0]!;
  });
}

/** Runs SQL on a host and waits for it: for hooks that are called synchronously (onNotice). */
function runSqlNow(url: string, sql: string): void {
  const script = `const pg = require('pg'); const c = new pg.Client({ connectionString: process.argv[1] });
    c.connect().then(() => c.query(process.argv[2])).then(() => c.end(), (e) => { console.error(e.message); process.exit(1); });`;
  execFileSync(process.execPath, ['-e', script, url, sql], { stdio: ['ignore', 'ignore', 'inherit'] });
}

describe('shardctl move-shard', () => {
  it('moves a shard online under a write load: every committed row arrives, the old copy refuses writes, ids keep growing', async () => {
    const fleet = makeFleet({ urls: db.urls, shards: 8, split: ['0-3', '4-7'] });
    const config = await fleet.config();
    expect((await init(config)).ok).toBe(true);
    // Existing rows before the move.
    await withClient(db.urls[0]!, (c) =>
      c.query(`insert into insta1.photos (user_id, image_url) select g, 'seed' from generate_series(1, 5000) g`),
    );

    // An application role with its own grants, as production has; roles are per cluster, so on both hosts.
    for (const url of db.urls) {
      await withClient(url, (c) =>
        c.query(
          `do $$ begin if not exists (select from pg_roles where rolname = 'shardctl_move_app') then create role shardctl_move_app; end if; end $$`,
        ),
      );
    }
    await withClient(db.urls[0]!, (c) =>
      c.query(
        `grant usage on schema insta1 to shardctl_move_app; grant select, insert on insta1.photos to shardctl_move_app`,
      ),
    );
    const map = await ShardMap.load(fleet.configFile);
    const writer = startShardWriter(map, 1);
    await waitFor('writes on the source', async () => writer.acknowledged.length > 10);
    const result = await moveShard(config, 1, 'pg2', { configFile: fleet.configFile });
    // Keep writing for a moment on the new host.
    await waitFor('writes on the target', async () => writer.acknowledged.filter((a) => a.host === 'pg2').length > 10);
    await writer.stop();

    expect(result.outcome).toBe('moved');
    expect(result.writeBlockedMs).not.toBeNull();
    expect(writer.fenceErrors).toBeGreaterThan(0);
    // photos was checksummed before the fence; while fenced only the rows written since were compared.
    expect(result.verification?.byKey.tables).toBeGreaterThanOrEqual(1);
    expect(await trackingLeftovers(db.urls[1]!)).toEqual({ triggers: 0, changes: 0 });
    const onSource = writer.acknowledged.filter((a) => a.host === 'pg1');
    const onTarget = writer.acknowledged.filter((a) => a.host === 'pg2');
    expect(onSource.length).toBeGreaterThan(10);
    expect(onTarget.length).toBeGreaterThan(10);

    await withClient(db.urls[1]!, async (client) => {
      const ids = (await client.query<{ id: string }>('select id from insta1.photos')).rows.map((r) => BigInt(r.id));
      const present = new Set(ids);
      // Every row acknowledged by the source before the fence is on the target.
      expect(onSource.filter((a) => !present.has(a.id))).toEqual([]);
      expect(ids.length).toBe(5000 + onSource.length + onTarget.length);
      // New ids on the target are greater than every moved id.
      const maxMoved = onSource.reduce((m, a) => (a.id > m ? a.id : m), 0n);
      expect(onTarget.every((a) => a.id > maxMoved)).toBe(true);
    });
    await withClient(db.urls[0]!, async (client) => {
      // The old copy was renamed; it accepts no write, with SQLSTATE SC100 naming the new host.
      const renamed = (
        await client.query<{ nspname: string }>(
          `select nspname from pg_namespace where nspname like 'insta1\\_moved\\_%'`,
        )
      ).rows;
      expect(renamed).toHaveLength(1);
      const error = await client
        .query(`insert into "${renamed[0]!.nspname}".photos (user_id, image_url) values (1, 'late')`)
        .then(
          () => null,
          (e: pg.DatabaseError) => e,
        );
      expect(error?.code).toBe('SC100');
      expect(error?.message).toBe('shard 1 has moved to host pg2; writes to this copy are refused');
      // A client still on the old map writes to insta1.photos: the views left under the old name
      // keep answering with the fence's SC100, so it knows to reload (not 42P01).
      const stale = await client.query(`insert into insta1.photos (user_id, image_url) values (1, 'stale map')`).then(
        () => null,
        (e: pg.DatabaseError) => e,
      );
      expect(stale?.code).toBe('SC100');
      expect(shardMovedTo(stale)).toEqual({ shard: 1, host: 'pg2' });
      // Reads too, even by the application's own role (the grants came along), so no stale rows are served.
      for (const role of ['postgres', 'shardctl_move_app']) {
        await client.query(`set role ${role}`);
        for (const sql of [
          'select count(*) from insta1.photos',
          `insert into insta1.photos (user_id, image_url) values (1, 'x')`,
        ]) {
          const e = await client.query(sql).then(
            () => null,
            (x: pg.DatabaseError) => x,
          );
          expect([role, sql, e?.code]).toEqual([role, sql, 'SC100']);
        }
        await client.query('reset role');
      }
      // Nothing the source accepted after the fence: its row count is what the target got from it.
      const count = await client.query<{ n: string }>(`select count(*) as n from "${renamed[0]!.nspname}".photos`);
      expect(Number(count.rows[0]!.n)).toBe(5000 + onSource.length);
    });

    expect(readFileSync(fleet.configFile, 'utf8')).toMatch(
      /name: pg1\n\s+url: .*\n(?:\s+replicationUrl: .*\n)?\s+shards: "0,2-3"/,
    );

    // A clean-up interrupted after its rename is finished by --resume, not stuck on the existing names.
    for (const url of db.urls) {
      await withClient(url, (c) =>
        c.query(`update shardctl.moves set step = 'switched', status = 'running' where move_id = $1`, [result.moveId]),
      );
    }
    const resumed = await moveShard(await fleet.config(), 1, undefined, { resume: true, configFile: fleet.configFile });
    expect(resumed.outcome).toBe('moved');
    await withClient(db.urls[0]!, async (client) => {
      const r = await client.query<{ status: string }>(`select status from shardctl.moves where move_id = $1`, [
        result.moveId,
      ]);
      expect(r.rows[0]!.status).toBe('done');
    });
    expect(await replicationObjects(db.urls)).toEqual([]);
    const report = await status(await fleet.config());
    expect(report.ok).toBe(true);
    expect(report.hosts[0]!.fenced).toEqual([1]);

    // gc removes the old copy once the operator says so.
    const gcRun = await runCli(['gc', '--yes', '-c', fleet.configFile]);
    expect(gcRun.code).toBe(0);
    expect(gcRun.stdout).toContain('pg1: shard 1');
    expect((await status(await fleet.config())).hosts[0]!.fenced).toEqual([]);
  });
});

describe('shardctl move-shard verifying before the fence, under updates and deletes', () => {
  const db = useTestDatabases(2);

  it('updates, deletes and inserts during the move: only the changed rows are compared while fenced, and both copies match', async () => {
    const fleet = makeFleet({ urls: db.urls, shards: 4, split: ['0-1', '2-3'] });
    const config = await fleet.config();
    expect((await init(config)).ok).toBe(true);
    await withClient(db.urls[0]!, (c) =>
      c.query(
        `insert into insta0.photos (user_id, image_url) select g % 2000, 'seed' from generate_series(1, 20000) g`,
      ),
    );
    const map = await ShardMap.load(fleet.configFile);
    const churn = startShardWriter(
      map,
      0,
      (i) =>
        `begin; update insta0.photos set caption = 'edit ${i}' where user_id = ${i % 2000};
       delete from insta0.photos where user_id = ${(i * 7) % 2000} and caption is null;
       insert into insta0.photos (user_id, image_url) values (${i}, 'churn'); commit`,
    );
    await new Promise((resolve) => setTimeout(resolve, 300));
    const notices: string[] = [];
    const result = await moveShard(config, 0, 'pg2', {
      configFile: fleet.configFile,
      onNotice: (m) => notices.push(m),
    });
    await new Promise((resolve) => setTimeout(resolve, 200));
    await churn.stop();

    expect(result.outcome).toBe('moved');
    expect(churn.writes).toBeGreaterThan(10);
    expect(notices.some((m) => m.includes('checksummed before the fence'))).toBe(true);
    expect(result.verification).toMatchObject({ ok: true, byKey: { tables: expect.any(Number) as number } });
    expect(result.verification!.byKey.tables).toBeGreaterThanOrEqual(1);
    expect(result.verification!.byKey.keys).toBeGreaterThan(0);
    expect(await trackingLeftovers(db.urls[1]!)).toEqual({ triggers: 0, changes: 0 });
  });
});

describe('shardctl move-shard verifying before the fence, a composite text key and a NOT NULL domain', () => {
  const db = useTestDatabases(2);

  it('looks the changed rows up by both key columns, whatever the other columns allow', async () => {
    const migrations = {
      '0001_items.sql': `CREATE DOMAIN label AS text NOT NULL CHECK (VALUE <> '');
        CREATE TABLE items (owner bigint NOT NULL, name varchar(40) NOT NULL, tag label NOT NULL DEFAULT 'x', n int NOT NULL DEFAULT 0, PRIMARY KEY (owner, name));`,
    };
    const fleet = makeFleet({ urls: db.urls, shards: 4, split: ['0-1', '2-3'], migrations });
    const config = await fleet.config();
    expect((await init(config)).ok).toBe(true);
    await withClient(db.urls[0]!, (c) =>
      c.query(`insert into insta0.items (owner, name) select g % 50, 'item ' || g from generate_series(1, 5000) g`),
    );
    const map = await ShardMap.load(fleet.configFile);
    const churn = startShardWriter(
      map,
      0,
      (i) =>
        `begin; update insta0.items set n = n + 1, tag = 't${i}' where owner = ${i % 50} and name like 'item 1%';
       delete from insta0.items where owner = ${(i * 7) % 50} and name = 'item ${i}';
       insert into insta0.items (owner, name) values (${i % 50}, 'new ${i}'); commit`,
    );
    await new Promise((resolve) => setTimeout(resolve, 200));
    const notices: string[] = [];
    const result = await moveShard(config, 0, 'pg2', {
      configFile: fleet.configFile,
      onNotice: (m) => notices.push(m),
    });
    await churn.stop();
    expect(notices.filter((m) => m.includes('no verification before the fence'))).toEqual([]);
    expect(result.outcome).toBe('moved');
    expect(result.verification).toMatchObject({ ok: true, byKey: { tables: 1 } });
    expect(result.verification!.byKey.keys).toBeGreaterThan(0);
  });
});

describe('shardctl move-shard verifying before the fence, with a row changed on the target', () => {
  const db = useTestDatabases(2);

  it('a row changed on the target after the pre-verification, while the source was still writable, fails verification: aborted, source writable', async () => {
    const { fleet, config } = await seededFleet(db.urls, 1, 3000);
    const before = readFileSync(fleet.configFile, 'utf8');
    const error = await moveShard(config, 1, 'pg2', {
      configFile: fleet.configFile,
      onNotice: (m) => {
        // The pre-verification's snapshots are taken; the fence has not begun.
        if (m.includes('checksummed before the fence'))
          runSqlNow(
            db.urls[1]!,
            pastIncomingGuard(
              `update insta1.photos set caption = 'tampered' where id = (select min(id) from insta1.photos)`,
            ),
          );
      },
    }).then(
      () => null,
      (e: unknown) => e,
    );
    expect(error).toMatchObject({
      code: 'VERIFY_FAILED',
      details: ['table insta1.photos: 3000 rows on both, but their contents differ (checksum)'],
    });
    expect(readFileSync(fleet.configFile, 'utf8')).toBe(before);
    await withClient(db.urls[0]!, async (c) => {
      expect((await c.query(`select state from shardctl.shards where shard = 1`)).rows).toEqual([{ state: 'active' }]);
      await c.query(`insert into insta1.photos (user_id, image_url) values (1, 'writable again')`);
    });
    expect(await trackingLeftovers(db.urls[1]!)).toEqual({ triggers: 0, changes: 0 });
    expect(await replicationObjects(db.urls)).toEqual([]);
  });
});

describe('shardctl move-shard with partitioned and seeded tables', () => {
  const db = useTestDatabases(2);

  it('moves partitioned tables and tables seeded by migrations, fencing every partition', async () => {
    const migrations = {
      '0001_events.sql': `CREATE SEQUENCE events_id_seq;
CREATE TABLE events (id bigint NOT NULL DEFAULT next_id('events_id_seq'), kind int NOT NULL, PRIMARY KEY (id, kind)) PARTITION BY LIST (kind);
CREATE TABLE events_a PARTITION OF events FOR VALUES IN (1);
CREATE TABLE events_b PARTITION OF events FOR VALUES IN (2);`,
      '0002_kinds.sql': `CREATE TABLE kinds (id int PRIMARY KEY, name text NOT NULL);
INSERT INTO kinds VALUES (1, 'a'), (2, 'b');`,
    };
    const fleet = makeFleet({ urls: db.urls, shards: 8, split: ['0-3', '4-7'], schemaPrefix: 'part', migrations });
    const config = await fleet.config();
    expect((await init(config)).ok).toBe(true);
    await withClient(db.urls[0]!, (c) =>
      c.query(`insert into part2.events (kind) select 1 + g % 2 from generate_series(1, 1000) g`),
    );

    for (const mode of ['online', 'offline'] as const) {
      const shard = mode === 'online' ? 2 : 3;
      if (mode === 'offline')
        await withClient(db.urls[0]!, (c) =>
          c.query(`insert into part3.events (kind) select 1 + g % 2 from generate_series(1, 500) g`),
        );
      const result = await moveShard(await fleet.config(), shard, 'pg2', { mode, configFile: fleet.configFile });
      expect(result.outcome, mode).toBe('moved');
      await withClient(db.urls[1]!, async (client) => {
        const r = await client.query<{ a: string; b: string; kinds: string }>(
          `select (select count(*) from part${shard}.events_a) as a, (select count(*) from part${shard}.events_b) as b, (select count(*) from part${shard}.kinds) as kinds`,
        );
        // The seed rows came once (from the source), not twice (migration on the target + copy).
        expect(r.rows[0], mode).toEqual(
          mode === 'online' ? { a: '500', b: '500', kinds: '2' } : { a: '250', b: '250', kinds: '2' },
        );
      });
      await withClient(db.urls[0]!, async (client) => {
        // A write sent straight to a partition of the old copy is refused too.
        const old = (
          await client.query<{ nspname: string }>(
            `select nspname from pg_namespace where nspname like 'part${shard}\\_moved\\_%'`,
          )
        ).rows[0]!.nspname;
        const e = await client.query(`insert into "${old}".events_a (id, kind) values (1, 1)`).then(
          () => null,
          (x: pg.DatabaseError) => x,
        );
        expect(e?.code, mode).toBe('SC100');
      });
    }
    expect(await replicationObjects(db.urls)).toEqual([]);
  });
});

describe('shardctl move-shard with tables that have no page', () => {
  const db = useTestDatabases(2);

  it('empties a table the migrations seeded on the target when the source emptied it (no page left there)', async () => {
    const migrations = {
      '0001_kinds.sql': `CREATE TABLE kinds (id int PRIMARY KEY, name text NOT NULL);
INSERT INTO kinds VALUES (1, 'a'), (2, 'b');`,
      '0002_notes.sql': `CREATE TABLE notes (id bigint PRIMARY KEY, body text NOT NULL);`,
    };
    const fleet = makeFleet({ urls: db.urls, shards: 4, split: ['0-1', '2-3'], schemaPrefix: 'seeded', migrations });
    expect((await init(await fleet.config())).ok).toBe(true);
    // On the source the seed rows are gone and the table has no page: nothing to copy from it.
    await withClient(db.urls[0]!, (c) => c.query(`truncate seeded1.kinds`));
    const result = await moveShard(await fleet.config(), 1, 'pg2', { configFile: fleet.configFile });
    expect(result.outcome).toBe('moved');
    const counts = await withClient(
      db.urls[1]!,
      async (c) =>
        (
          await c.query(
            `select (select count(*) from seeded1.kinds) as kinds, (select count(*) from seeded1.notes) as notes`,
          )
        ).rows[0],
    );
    expect(counts).toEqual({ kinds: '0', notes: '0' });
    expect(await replicationObjects(db.urls)).toEqual([]);
  });
});

describe('shardctl move-shard copying large tables', () => {
  const db = useTestDatabases(2);

  /** Every index and constraint of a schema as text, with the schema's name taken out (the old copy is renamed). */
  async function catalog(url: string, schema: string): Promise<unknown> {
    return withClient(url, async (client) => {
      const r = await client.query(
        `select 'index' as what, c.relname as tbl, i.relname as name, pg_get_indexdef(x.indexrelid) as def,
                x.indisreplident as replident, x.indisclustered as clustered, x.indisvalid as valid,
                obj_description(x.indexrelid, 'pg_class') as comment,
                (select string_agg(coalesce(a.attstattarget::text, '-1'), ',' order by a.attnum) from pg_attribute a where a.attrelid = x.indexrelid) as stats,
                (select count(*) from pg_inherits h where h.inhrelid = x.indexrelid)::int as attached
           from pg_index x join pg_class c on c.oid = x.indrelid join pg_class i on i.oid = x.indexrelid
          where c.relnamespace = to_regnamespace($1)
         union all
         select 'constraint', c.relname, k.conname, k.contype::text || ' ' || pg_get_constraintdef(k.oid), null, null, k.convalidated, null, null, null
           from pg_constraint k join pg_class c on c.oid = k.conrelid where c.relnamespace = to_regnamespace($1)
         union all
         select 'column', c.relname, a.attname, format_type(a.atttypid, a.atttypmod) || case when a.attnotnull then ' not null' else '' end, null, null, null, null, null, null
           from pg_attribute a join pg_class c on c.oid = a.attrelid
          where c.relnamespace = to_regnamespace($1) and c.relkind in ('r', 'p') and a.attnum > 0 and not a.attisdropped
         union all
         select 'replica identity', c.relname, c.relreplident::text, null, null, null, null, null, null, null
           from pg_class c where c.relnamespace = to_regnamespace($1) and c.relkind in ('r', 'p')
          order by 1, 2, 3`,
        [schema],
      );
      return JSON.parse(JSON.stringify(r.rows).replaceAll(`${schema}.`, 'SCHEMA.'));
    });
  }

  it('loads large tables without their indexes and builds them again after the copy, exactly as they were; keeps the ones it must', async () => {
    const migrations = {
      '0001_items.sql': `CREATE SEQUENCE items_id_seq;
CREATE TABLE items (
  id bigint PRIMARY KEY DEFAULT next_id('items_id_seq'),
  code int NOT NULL,
  name text,
  span int4range,
  note text,
  filler text,
  CONSTRAINT items_code_key UNIQUE (code) DEFERRABLE INITIALLY DEFERRED,
  CONSTRAINT items_span_excl EXCLUDE USING gist (span WITH &&)
);
CREATE INDEX items_name_idx ON items (lower(name)) WITH (fillfactor = 70) WHERE name IS NOT NULL;
CREATE INDEX items_note_idx ON items (note);
COMMENT ON INDEX items_note_idx IS 'kept with its comment';
CREATE INDEX items_expr_idx ON items ((code + 1));
ALTER INDEX items_expr_idx ALTER COLUMN 1 SET STATISTICS 500;
CREATE TABLE item_tags (item_id bigint NOT NULL REFERENCES items (id), tag text NOT NULL, filler text, PRIMARY KEY (item_id, tag));
CREATE INDEX item_tags_tag_idx ON item_tags (tag DESC NULLS LAST);
CREATE TABLE events (id bigint NOT NULL, kind int NOT NULL, filler text, PRIMARY KEY (id, kind)) PARTITION BY LIST (kind);
CREATE TABLE events_a PARTITION OF events FOR VALUES IN (1);
CREATE UNIQUE INDEX events_a_local ON events_a (id);
CREATE TABLE clustered (id bigint PRIMARY KEY, v int, filler text);
CREATE INDEX clustered_v ON clustered (v);
ALTER TABLE clustered CLUSTER ON clustered_v;
CREATE TABLE ident (id bigint NOT NULL, v int, filler text);
CREATE UNIQUE INDEX ident_id ON ident (id);
ALTER TABLE ident REPLICA IDENTITY USING INDEX ident_id;
CREATE UNIQUE INDEX ident_v ON ident (v) NULLS NOT DISTINCT;`,
    };
    const fleet = makeFleet({ urls: db.urls, shards: 8, split: ['0-3', '4-7'], schemaPrefix: 'big', migrations });
    const config = await fleet.config();
    expect((await init(config)).ok).toBe(true);
    const { INDEXES_AFTER_BYTES } = await import('../../src/moves/copy.js');

    for (const mode of ['online', 'offline'] as const) {
      const shard = mode === 'online' ? 1 : 2;
      const schema = `big${shard}`;
      const before = await withClient(db.urls[0]!, async (client) => {
        await client.query(`set search_path = ${schema};
          insert into items (code, name, span, note, filler)
            select g, case when g % 3 = 0 then null else 'Item ' || g end, int4range(g * 10, g * 10 + 5), 'note ' || (g % 100), repeat('x', 200)
              from generate_series(1, 25000) g;
          insert into item_tags select id, 'tag-' || (code % 7), repeat('y', 200) from items;
          insert into events select g, 1, repeat('z', 200) from generate_series(1, 25000) g;
          insert into clustered select g, g % 1000, repeat('c', 200) from generate_series(1, 25000) g;
          insert into ident select g, g, repeat('i', 200) from generate_series(1, 25000) g;
          analyze`);
        const sizes = await client.query<{ relname: string; bytes: string }>(
          `select relname, pg_relation_size(oid)::text as bytes from pg_class where relnamespace = to_regnamespace($1) and relkind = 'r'`,
          [schema],
        );
        // Every table is large enough to be loaded without its indexes.
        for (const s of sizes.rows) expect(Number(s.bytes), s.relname).toBeGreaterThanOrEqual(INDEXES_AFTER_BYTES);
        return catalog(db.urls[0]!, schema);
      });

      const result = await moveShard(await fleet.config(), shard, 'pg2', { mode, configFile: fleet.configFile });
      expect(result.outcome, mode).toBe('moved');
      expect(result.verification?.ok, mode).toBe(true);
      expect(await catalog(db.urls[1]!, schema), mode).toEqual(before);
      await withClient(db.urls[1]!, async (client) => {
        const r = await client.query<{ items: string; tags: string; bad: string }>(
          `select (select count(*) from ${schema}.items) as items, (select count(*) from ${schema}.item_tags) as tags,
                  (select count(*) from pg_index x join pg_class c on c.oid = x.indrelid where c.relnamespace = to_regnamespace($1) and not (x.indisvalid and x.indisready)) as bad`,
          [schema],
        );
        expect(r.rows[0], mode).toEqual({ items: '25000', tags: '25000', bad: '0' });
        // The rebuilt constraints hold: a duplicate is refused on the target.
        const dup = await client.query(`insert into ${schema}.clustered values (1, 1, 'dup')`).then(
          () => null,
          (e: pg.DatabaseError) => e.code,
        );
        expect(dup, mode).toBe('23505');
      });
    }
    expect(await replicationObjects(db.urls)).toEqual([]);
  });
});

describe('shardctl move-shard with tables empty when the cut-over begins', () => {
  const db = useTestDatabases(2);

  it('leaves them untracked: one still empty on both is verified by its size, one written meanwhile whole (listed as filled)', async () => {
    const { fleet, config } = await seededFleet(db.urls, 1, 2000);
    const result = await moveShard(config, 1, 'pg2', {
      configFile: fleet.configFile,
      onNotice: (m) => {
        // The pre-verification has begun (photos tracked); likes and comments were empty then.
        if (m.includes('checksummed before the fence'))
          runSqlNow(
            db.urls[0]!,
            `insert into insta1.likes (photo_id, user_id) select g, g from generate_series(1, 50) g`,
          );
      },
    });
    expect(result.outcome).toBe('moved');
    expect(result.verification).toMatchObject({
      ok: true,
      byKey: { tables: 1 },
      filled: ['insta1.likes'],
      empty: 1,
      whole: [],
    });
    await withClient(db.urls[1]!, async (c) => {
      expect((await c.query(`select count(*)::int as n from insta1.likes`)).rows).toEqual([{ n: 50 }]);
    });
    expect(await trackingLeftovers(db.urls[1]!)).toEqual({ triggers: 0, changes: 0 });
  });
});

describe('shardctl move-shard with a table empty on the source written by hand on the target', () => {
  const db = useTestDatabases(2);

  it('a row written by hand into the target copy of a table empty on the source is found: aborted, source writable', async () => {
    const { fleet, config } = await seededFleet(db.urls, 0, 500);
    const error = await moveShard(config, 0, 'pg2', {
      configFile: fleet.configFile,
      onNotice: (m) => {
        if (m.includes('checksummed before the fence'))
          runSqlNow(
            db.urls[1]!,
            pastIncomingGuard(`insert into insta0.comments (photo_id, user_id, body) values (1, 1, 'by hand')`),
          );
      },
    }).then(
      () => null,
      (e: unknown) => e,
    );
    expect(error).toMatchObject({
      code: 'VERIFY_FAILED',
      details: ['table insta0.comments: 0 rows on the source, 1 on the target'],
    });
    await withClient(db.urls[0]!, async (c) => {
      expect((await c.query(`select state from shardctl.shards where shard = 0`)).rows).toEqual([{ state: 'active' }]);
      await c.query(`insert into insta0.comments (photo_id, user_id, body) values (2, 2, 'writable again')`);
    });
    expect(await replicationObjects(db.urls)).toEqual([]);
  });
});
