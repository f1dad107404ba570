import { describe, expect, it } from 'vitest';
import { parseConfig } from '../../src/config/load.js';
import { CONTROL_VERSION, controlSchemaSql } from '../../src/fleet/control.js';
import { createShardSql, dropShardSql, recordShardSql } from '../../src/fleet/sql.js';
import type { MigrationFile } from '../../src/migrations/files.js';
import { migrationSql, noTransactionMigrationSteps } from '../../src/migrations/sql.js';
import {
  privilegeVersions,
  rolesNamed,
  syncPrivilegesSql,
  withheldSchemaAcl,
  type AclEntry,
  type PrivilegeObject,
} from '../../src/moves/privileges.js';
import { catchUpSql } from '../../src/moves/sql/catch-up.js';
import { renameWithStubSql } from '../../src/moves/sql/cleanup.js';
import {
  fenceMarkerSql,
  fenceSql,
  type FenceInput,
  fenceGroups,
  fenceWaveSql,
  fenceReadsSql,
  prepareFenceSql,
  fenceGuardSql,
  unfenceSql,
} from '../../src/moves/sql/fence.js';
import { oldCopyName } from '../../src/moves/sql/names.js';
import { createSubscriptionSql, probeSubscriptionSql } from '../../src/moves/sql/replication.js';
import { readSequencesSql, setSequencesSql } from '../../src/moves/sql/sequences.js';
import {
  COPYING_SETTING,
  copyLogOnTargetSql,
  copyLogRowsOnTargetSql,
  startDeltasSql,
  startSourceDeltasSql,
  startTrackingSql,
} from '../../src/moves/sql/tail.js';
import { BEGIN_COPY_SQL } from '../../src/moves/sql/copy.js';
import { keyFilterSql } from '../../src/moves/sql/verify.js';
import { planWaves } from '../../src/moves/waves.js';
import { chunksOf } from '../../src/moves/copy.js';
import { roundTrips } from '../../src/moves/targets.js';
import fc from 'fast-check';
import { sql } from '../../src/pg/sql-template.js';

/** What every worker transaction sets besides asynchronous commit (nothing at session level). */
const CHECK_LOCAL =
  "DO $shardctl$ BEGIN PERFORM pg_catalog.set_config('client_connection_check_interval', '1s', true); EXCEPTION WHEN invalid_parameter_value THEN NULL; END $shardctl$;";
/** The same for the session: a no-transaction migration's statements run outside a transaction. */
const CHECK_SESSION = CHECK_LOCAL.replace("'1s', true", "'1s', false");
import { fromLog, type LogSums } from '../../src/moves/tail.js';

const config = parseConfig(
  'shards: 8\nhosts:\n  - { name: pg1, url: "postgres://a@h1/db", shards: "0-3" }\n  - { name: pg2, url: "postgres://a@h2/db", shards: "4-7" }\n',
  { file: '/tmp/shardctl.yaml', checkMigrationsDir: false },
);

const migration = (over: Partial<MigrationFile> = {}): MigrationFile => ({
  version: 2,
  name: '0002_likes',
  path: '/m/0002_likes.sql',
  sql: 'CREATE TABLE likes (id bigint);',
  checksum: 'abc',
  noTransaction: false,
  lockTimeout: null,
  statementTimeout: null,
  statements: ['CREATE TABLE likes (id bigint)'],
  ...over,
});

describe('fleet SQL', () => {
  it('creates a shard as one transaction: schema, next_id, control row; clearing stale rows first when asked', () => {
    const sql = createShardSql(config, 5, true, 'incoming');
    // Committed without a WAL flush (the run's last transaction makes it durable), set for this
    // transaction only: nothing stays on a pooled server connection.
    expect(
      sql.startsWith(
        'BEGIN;\nSET LOCAL synchronous_commit = off;\n' +
          CHECK_LOCAL +
          '\nDELETE FROM "shardctl".migrations WHERE shard = 5;\nDELETE FROM "shardctl".shards WHERE shard = 5;\nCREATE SCHEMA "insta5";',
      ),
    ).toBe(true);
    expect(sql).toContain(
      `INSERT INTO "shardctl".shards (shard, schema_name, state) VALUES (5, 'insta5', 'incoming');\nCOMMIT;`,
    );
    expect(createShardSql(config, 5)).not.toContain('DELETE');
  });

  it('drops every named schema of a shard once, with its control rows, in one transaction', () => {
    expect(dropShardSql(3, ['insta3_moved_x', 'insta3', 'insta3'])).toBe(
      'BEGIN;\nDROP SCHEMA IF EXISTS "insta3_moved_x" CASCADE;\nDROP SCHEMA IF EXISTS "insta3" CASCADE;\n' +
        'DELETE FROM "shardctl".migrations WHERE shard = 3;\nDELETE FROM "shardctl".shards WHERE shard = 3;\nCOMMIT;',
    );
  });

  it('records a shard idempotently, and the control schema with the layout it was built with', () => {
    expect(recordShardSql(config, 1)).toContain(`VALUES (1, 'insta1') ON CONFLICT (shard) DO NOTHING;`);
    expect(controlSchemaSql(config)).toContain(
      `VALUES (${CONTROL_VERSION}, 'insta', 8, 1314220021721, 13, 10)\nON CONFLICT (singleton) DO UPDATE SET control_version = greatest("shardctl".layout.control_version, EXCLUDED.control_version);`,
    );
    // Every version step, in order, in the one transaction.
    const sql = controlSchemaSql(config);
    expect(sql.indexOf('CREATE TABLE IF NOT EXISTS "shardctl".layout')).toBeLessThan(
      sql.indexOf('CREATE TABLE IF NOT EXISTS "shardctl".placement'),
    );
    expect(sql.indexOf('CREATE TABLE IF NOT EXISTS "shardctl".placement')).toBeLessThan(
      sql.indexOf('CREATE TABLE IF NOT EXISTS "shardctl".runner_lock'),
    );
  });
});

describe('migration SQL', () => {
  it('runs a file on a shard in one transaction with its record, in the shard schema, under lockTimeout', () => {
    expect(migrationSql(config, 6, migration())).toBe(
      [
        'BEGIN;',
        'SET LOCAL synchronous_commit = off;',
        CHECK_LOCAL,
        'SET LOCAL search_path TO "insta6", pg_temp;',
        "SET LOCAL lock_timeout = '5s';",
        '-- 0002_likes.sql',
        'CREATE TABLE likes (id bigint);',
        ';',
        'DO $shardctl$ BEGIN',
        `  IF pg_catalog.current_schemas(false) IS DISTINCT FROM ARRAY['insta6'::pg_catalog.name] AND pg_catalog.current_schemas(false) IS DISTINCT FROM ARRAY['insta6'::pg_catalog.name, (SELECT nspname FROM pg_catalog.pg_namespace WHERE oid = pg_catalog.pg_my_temp_schema())] THEN`,
        `    RAISE EXCEPTION 'migration 0002_likes left search_path at %, not schema %: rolled back', pg_catalog.current_setting('search_path'), 'insta6';`,
        '  END IF;',
        'END $shardctl$;',
        `INSERT INTO "shardctl".migrations (shard, version, name, checksum) VALUES (6, 2, '0002_likes', 'abc');`,
        'COMMIT;',
        // Whatever a function or DO body of the file set for the session is not left to the next shard.
        'RESET ALL; UNLISTEN *; DISCARD TEMP;',
      ].join('\n'),
    );
  });

  it('runs a no-transaction file statement by statement, then refuses invalid indexes before recording it', () => {
    const steps = noTransactionMigrationSteps(
      config,
      0,
      migration({ noTransaction: true, statements: ['CREATE INDEX CONCURRENTLY a ON t (x)', 'SELECT 1'] }),
    );
    expect(steps).toHaveLength(5);
    expect(steps[0]).toBe(`SET search_path TO "insta0", pg_temp; SET lock_timeout = '5s'; ${CHECK_SESSION}`);
    expect(steps[1]).toBe('CREATE INDEX CONCURRENTLY a ON t (x);');
    expect(steps[2]).toBe('SET search_path TO "insta0", pg_temp;');
    expect(steps[3]).toBe('SELECT 1;');
    expect(steps[4]).toContain('NOT i.indisvalid');
    expect(steps[4]).toContain(
      `IF pg_catalog.current_schemas(false) IS DISTINCT FROM ARRAY['insta0'::pg_catalog.name] AND pg_catalog.current_schemas(false) IS DISTINCT FROM ARRAY['insta0'::pg_catalog.name, (SELECT nspname FROM pg_catalog.pg_namespace WHERE oid = pg_catalog.pg_my_temp_schema())] THEN`,
    );
    expect(steps[4]).toMatch(
      /RESET ALL; UNLISTEN \*; DISCARD TEMP; INSERT INTO "shardctl".migrations .* VALUES \(0, 2, '0002_likes', 'abc'\);$/,
    );
    // A move's creating workers have settings of their own, set again after the reset.
    expect(
      noTransactionMigrationSteps(config, 0, migration({ noTransaction: true, statements: ['SELECT 1'] }), {
        session: 'SET check_function_bodies = off',
      }).at(-1),
    ).toContain('RESET ALL; SET check_function_bodies = off; UNLISTEN *; DISCARD TEMP; INSERT INTO');
  });

  it("runs a file with its markers' lock_timeout and statement_timeout instead of the config's", () => {
    const sql = migrationSql(config, 6, migration({ lockTimeout: '2s', statementTimeout: '10min' }));
    expect(sql).toContain(
      `SET LOCAL search_path TO "insta6", pg_temp;\nSET LOCAL lock_timeout = '2s';\nSET LOCAL statement_timeout = '10min';\n-- 0002_likes.sql`,
    );
    const steps = noTransactionMigrationSteps(
      config,
      0,
      migration({ noTransaction: true, lockTimeout: '2s', statementTimeout: '10min', statements: ['SELECT 1'] }),
    );
    expect(steps[0]).toBe(
      `SET search_path TO "insta0", pg_temp; SET lock_timeout = '2s'; SET statement_timeout = '10min'; ${CHECK_SESSION}`,
    );
  });
});

describe('move SQL', () => {
  it('subscribes from the existing slot without copying, binary only when asked, quoting the URL as a literal', () => {
    const sql = createSubscriptionSql('shardctl_move_m1', "postgres://r@h1/db?application_name=it's", false);
    expect(sql).toContain(`CONNECTION 'postgres://r@h1/db?application_name=it''s'`);
    expect(sql).toContain(
      `WITH (slot_name = 'shardctl_move_m1', create_slot = false, copy_data = false, binary = false)`,
    );
    expect(probeSubscriptionSql('p', 'postgres://h')).toContain(
      'enabled = false, create_slot = false, slot_name = NONE',
    );
  });

  it('fences a shard in one transaction whose lock wait is bounded below the deadlock timeout', () => {
    const input: FenceInput = {
      shards: [
        {
          shard: 4,
          tables: [
            ['insta4', 'likes'],
            ['insta4', 'photos'],
          ],
        },
      ],
      targetHost: 'pg2',
      lockWaitMs: 250,
      createOrReplaceTrigger: true,
    };
    const sql = fenceSql(input);
    expect(sql.split('\n').slice(0, 5)).toEqual([
      'BEGIN;',
      "SET LOCAL lock_timeout = '250ms';",
      "SET LOCAL statement_timeout = '250ms';",
      'LOCK TABLE "insta4"."likes", "insta4"."photos" IN SHARE ROW EXCLUSIVE MODE;',
      'SET LOCAL statement_timeout TO DEFAULT;',
    ]);
    expect(sql.match(/CREATE OR REPLACE TRIGGER shardctl_fence/g)).toHaveLength(2);
    // A busy shard's retry: the first table waits the whole bound, the others a quarter of it.
    const retry = fenceSql({ ...input, lockWaitMs: 120, lockFirstAlone: true });
    expect(retry.split('\n').slice(0, 8)).toEqual([
      'BEGIN;',
      "SET LOCAL lock_timeout = '120ms';",
      "SET LOCAL statement_timeout = '120ms';",
      'LOCK TABLE "insta4"."likes" IN SHARE ROW EXCLUSIVE MODE;',
      "SET LOCAL lock_timeout = '30ms';",
      "SET LOCAL statement_timeout = '30ms';",
      'LOCK TABLE "insta4"."photos" IN SHARE ROW EXCLUSIVE MODE;',
      'SET LOCAL statement_timeout TO DEFAULT;',
    ]);
    expect(sql).toContain('ALTER TABLE "insta4"."photos" ENABLE TRIGGER shardctl_fence;');
    expect(sql).toContain(`EXECUTE FUNCTION "shardctl".shard_fenced('4', 'pg2');`);
    expect(sql.endsWith(`UPDATE "shardctl".shards SET state = 'fenced' WHERE shard IN (4);\nCOMMIT;`)).toBe(true);
    const old = fenceSql({
      shards: [{ shard: 4, tables: [['insta4', 'likes']] }],
      targetHost: 'pg2',
      lockWaitMs: 250,
      createOrReplaceTrigger: false,
    });
    expect(old).toContain('DROP TRIGGER IF EXISTS shardctl_fence ON "insta4"."likes";\nCREATE TRIGGER shardctl_fence');
  });

  it("records the wave's fence start in the first shard's fence transaction", () => {
    const sql = fenceSql({
      shards: [{ shard: 4, tables: [] }],
      targetHost: 'pg2',
      lockWaitMs: 250,
      createOrReplaceTrigger: true,
      fenceStart: { moveId: "m'1", atMs: 1700000000000 },
    });
    expect(sql.split('\n').slice(-3)).toEqual([
      `UPDATE "shardctl".shards SET state = 'fenced' WHERE shard IN (4);`,
      `UPDATE "shardctl".moves SET detail = detail || '{"fenceStartedAtMs":1700000000000}'::jsonb WHERE move_id = 'm''1';`,
      'COMMIT;',
    ]);
  });

  it('fences several shards in one transaction, each trigger naming its own shard', () => {
    const sql = fenceSql({
      shards: [
        { shard: 4, tables: [['insta4', 'likes']] },
        {
          shard: 7,
          tables: [
            ['insta7', 'likes'],
            ['insta7', 'photos'],
          ],
        },
      ],
      targetHost: 'pg2',
      lockWaitMs: 250,
      createOrReplaceTrigger: true,
    });
    expect(sql).toContain(
      'LOCK TABLE "insta4"."likes", "insta7"."likes", "insta7"."photos" IN SHARE ROW EXCLUSIVE MODE;',
    );
    expect(sql).toContain(
      `ON "insta4"."likes" FOR EACH STATEMENT EXECUTE FUNCTION "shardctl".shard_fenced('4', 'pg2');`,
    );
    expect(sql).toContain(
      `ON "insta7"."photos" FOR EACH STATEMENT EXECUTE FUNCTION "shardctl".shard_fenced('7', 'pg2');`,
    );
    expect(sql).toContain(`UPDATE "shardctl".shards SET state = 'fenced' WHERE shard IN (4, 7);`);
    expect(sql.match(/^BEGIN;$/gm)).toHaveLength(1);
  });

  it("prepares fence triggers that call the move's guard behind one bounded LOCK, and a prepared fence only closes the guard", () => {
    const shards = [
      {
        shard: 4,
        tables: [
          ['insta4', 'likes'],
          ['insta4', 'photos'],
        ] as const,
      },
    ];
    const prepare = prepareFenceSql({ shards, targetHost: 'pg2', lockWaitMs: 250, moveId: 'm1', wave: 2 });
    expect(prepare.split('\n').slice(0, 5)).toEqual([
      'BEGIN;',
      "SET LOCAL lock_timeout = '250ms';",
      "SET LOCAL statement_timeout = '250ms';",
      'LOCK TABLE "insta4"."likes", "insta4"."photos" IN SHARE ROW EXCLUSIVE MODE;',
      'SET LOCAL statement_timeout TO DEFAULT;',
    ]);
    // The guard open for this wave, closed for the waves before it (their old copies stay fenced).
    expect(prepare).toContain(fenceGuardSql('m1', 1));
    expect(prepare).toContain(
      `CREATE OR REPLACE TRIGGER shardctl_fence BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON "insta4"."photos" FOR EACH STATEMENT EXECUTE FUNCTION "shardctl"."shardctl_move_m1"('4', 'pg2', '2');`,
    );
    expect(prepare).not.toContain('DISABLE');
    expect(prepare).not.toContain('UPDATE "shardctl".shards');
    expect(prepare.endsWith('COMMIT;')).toBe(true);
    expect(fenceGuardSql('m1', 1)).toContain('IF TG_ARGV[2]::int <= 1 THEN');
    expect(fenceGuardSql('m1', 1)).toContain("USING ERRCODE = 'SC100'");
    expect(() => fenceGuardSql('m1', 0.5)).toThrow('not a wave: 0.5');
    expect(() => prepareFenceSql({ shards, targetHost: 'pg2', lockWaitMs: 250, moveId: 'm1', wave: -1 })).toThrow(
      'not a wave: -1',
    );

    const fence = fenceSql({
      shards: [
        { ...shards[0]!, prepared: true },
        { shard: 5, tables: [['insta5', 'likes']] },
      ],
      targetHost: 'pg2',
      lockWaitMs: 250,
      createOrReplaceTrigger: true,
      closeGuard: { moveId: 'm1', wave: 2 },
    });
    expect(fence).toContain(
      'LOCK TABLE "insta4"."likes", "insta4"."photos", "insta5"."likes" IN SHARE ROW EXCLUSIVE MODE;',
    );
    // The prepared shard's triggers are left as they are: the guard closes this wave, after the LOCK.
    expect(fence.indexOf(fenceGuardSql('m1', 2))).toBeGreaterThan(fence.indexOf('LOCK TABLE'));
    expect(fence).not.toContain('"insta4"."likes" ENABLE');
    expect(fence).not.toContain('"insta4"."photos" ENABLE');
    // The other's triggers are created as before.
    expect(fence.match(/CREATE OR REPLACE TRIGGER shardctl_fence/g)).toHaveLength(1);
    expect(fence).toContain(
      `ON "insta5"."likes" FOR EACH STATEMENT EXECUTE FUNCTION "shardctl".shard_fenced('5', 'pg2');`,
    );
    expect(fence).toContain(`UPDATE "shardctl".shards SET state = 'fenced' WHERE shard IN (4, 5);`);
    // Asked for, the transaction reports which tables are empty once they are fenced, last.
    const reporting = fenceSql({
      shards: [{ shard: 5, tables: [['insta5', 'likes']] }],
      targetHost: 'pg2',
      lockWaitMs: 250,
      createOrReplaceTrigger: true,
      reportEmpty: [16384, 16390],
    });
    expect(reporting.split('\n').slice(-2)).toEqual([
      `SELECT o AS oid, pg_relation_size(o) = 0 AS empty FROM unnest('{16384,16390}'::oid[]) AS o;`,
      'COMMIT;',
    ]);
    expect(() =>
      fenceSql({
        shards: [{ shard: 5, tables: [['insta5', 'likes']] }],
        targetHost: 'pg2',
        lockWaitMs: 250,
        createOrReplaceTrigger: true,
        reportEmpty: [1.5],
      }),
    ).toThrow('not an OID: 1.5');
  });

  it("sends a wave's fence groups, its marker with the step, and the session's statement timeout as one string", () => {
    const group = (shard: number, first: boolean) => ({
      shards: [{ shard, tables: [[`insta${shard}`, 'likes']] as const, prepared: true }],
      targetHost: 'pg2',
      lockWaitMs: 250,
      createOrReplaceTrigger: true,
      ...(first ? { fenceStart: { moveId: 'm1', atMs: 1700000000000 }, closeGuard: { moveId: 'm1', wave: 0 } } : {}),
    });
    const sql = fenceWaveSql({
      groups: [group(4, true), group(5, false)],
      marker: { moveId: 'm1', kind: 'fenced-x-0', detail: { fenceMarker: 'fenced-x-0', wave: 0 } },
      statementTimeoutMs: 20_000,
    });
    expect(sql.match(/^BEGIN;$/gm)).toHaveLength(3);
    expect(sql.match(/^COMMIT;$/gm)).toHaveLength(3);
    // In order: the first group with the fence's start, the second, the marker and step, the timeout.
    const at = (text: string) => sql.indexOf(text);
    expect(at('LOCK TABLE "insta4"."likes"')).toBeLessThan(at('"fenceStartedAtMs":1700000000000'));
    expect(at('"fenceStartedAtMs":1700000000000')).toBeLessThan(at('LOCK TABLE "insta5"."likes"'));
    expect(sql.match(/fenceStartedAtMs/g)).toHaveLength(1);
    // The guard of the wave's prepared shards is closed once, by the first group.
    expect(sql.match(/CREATE OR REPLACE FUNCTION "shardctl"."shardctl_move_m1"/g)).toHaveLength(1);
    expect(at('CREATE OR REPLACE FUNCTION')).toBeLessThan(at('LOCK TABLE "insta5"."likes"'));
    expect(sql).not.toContain('ENABLE TRIGGER');
    expect(at('LOCK TABLE "insta5"."likes"')).toBeLessThan(at(`VALUES ('m1', 'fenced-x-0')`));
    expect(sql).toContain(
      `UPDATE "shardctl".moves SET step = 'fenced', updated_at = now(), detail = detail || '{"fenceMarker":"fenced-x-0","wave":0}'::jsonb WHERE move_id = 'm1';\nCOMMIT;\nSET statement_timeout = 20000;`,
    );
    expect(sql.endsWith('SET statement_timeout = 20000;')).toBe(true);
    // Each group commits without waiting for the WAL flush; the marker's transaction waits for it,
    // which covers the groups' commits before it.
    const transactions = sql.split(/^COMMIT;$/m);
    expect(transactions.slice(0, 2).every((t) => t.includes('SET LOCAL synchronous_commit = off;'))).toBe(true);
    expect(transactions[2]).toContain(`VALUES ('m1', 'fenced-x-0')`);
    // Whatever the session's default.
    expect(transactions[2]).toContain('SET LOCAL synchronous_commit = on;');
    expect(fenceSql(group(4, true))).not.toContain('synchronous_commit');
  });

  it("reads the wave's sequences and placement version after its marker, in the fence's string", () => {
    const group = {
      shards: [{ shard: 4, tables: [['insta4', 'likes']] as const, prepared: true }],
      targetHost: 'pg2',
      lockWaitMs: 250,
      createOrReplaceTrigger: true,
    };
    const marker = { moveId: 'm1', kind: 'fenced-x-0', detail: {} };
    const sequences = [['insta4', 'likes_id_seq'] as const, ['insta4', 'a"b'] as const];
    const pg18 = fenceWaveSql({
      groups: [group],
      marker,
      statementTimeoutMs: 20_000,
      reads: { sequences, sequenceData: true, shards: [4, 5] },
    });
    const at = (text: string) => pg18.indexOf(text);
    expect(at('pg_get_sequence_data')).toBeGreaterThan(at(`VALUES ('m1', 'fenced-x-0')`));
    expect(at('pg_get_sequence_data')).toBeGreaterThan(pg18.lastIndexOf('COMMIT;'));
    expect(pg18).toContain(`ARRAY['"insta4"."likes_id_seq"'::regclass, '"insta4"."a""b"'::regclass]`);
    // The reads come under the cut-over's statement timeout: a read that waits is bounded too.
    expect(at('SET statement_timeout = 20000;')).toBeLessThan(at('pg_get_sequence_data'));
    expect(
      pg18.endsWith(
        `SELECT greatest(coalesce((SELECT placement_version FROM "shardctl".fleet), 0), coalesce((SELECT max(version) FROM "shardctl".placement WHERE shard IN (4, 5)), 0))::text AS "placement_version";`,
      ),
    ).toBe(true);
    const pg15 = fenceReadsSql({ sequences, sequenceData: false, shards: [4] });
    expect(pg15[0]).toBe(`${readSequencesSql(sequences)};`);
    expect(fenceReadsSql({ sequences: [], sequenceData: true, shards: [4] })).toHaveLength(1);
    expect(() => fenceReadsSql({ sequences: [], sequenceData: true, shards: [1.5] })).toThrow(/not a shard number/);
  });

  it("waits for the fence marker on the target's server, then reads the target's sizes and changes, in one string", () => {
    const sql = catchUpSql({
      moveId: "m'1",
      kind: 'fenced-x-0',
      limitMs: 1234.4,
      readsWithinMs: 5000,
      leaves: [16384, 16390],
      changes: true,
    });
    const at = (text: string) => sql.indexOf(text);
    // READ COMMITTED whatever the session's default: each look of the loop sees new commits.
    expect(sql.startsWith('BEGIN ISOLATION LEVEL READ COMMITTED;\n')).toBe(true);
    expect(sql.endsWith('\nCOMMIT;')).toBe(true);
    expect(sql).toContain(`WHERE move_id = 'm''1' AND kind = 'fenced-x-0'`);
    expect(sql).toContain(
      `interval '1234 milliseconds' THEN RAISE EXCEPTION 'the fence marker was not applied within 1234 ms'`,
    );
    // In order: the wait (which fails past its limit, so nothing after it runs), the statement
    // timeout of what follows (what is left of the fence limit), the sizes, the changes.
    expect(at('PERFORM pg_sleep(0.001)')).toBeLessThan(at(`set_config('statement_timeout', greatest(50, 5000 - `));
    expect(at(`set_config('statement_timeout'`)).toBeLessThan(at(`'{16384,16390}'::oid[]`));
    expect(at(`'{16384,16390}'::oid[]`)).toBeLessThan(at(`move_changes WHERE move_id = 'm''1'`));
    const bare = catchUpSql({ moveId: 'm1', kind: 'k', limitMs: -5, readsWithinMs: 0, leaves: [], changes: false });
    expect(bare).not.toContain('pg_relation_size');
    expect(bare).not.toContain('move_changes');
    expect(bare).toContain(`interval '0 milliseconds'`);
    expect(() =>
      catchUpSql({ moveId: 'm1', kind: '$catch_up$', limitMs: 1, readsWithinMs: 1, leaves: [], changes: false }),
    ).toThrow(/cannot contain/);
    expect(() =>
      catchUpSql({ moveId: 'm1', kind: 'k', limitMs: 1, readsWithinMs: 1, leaves: [0], changes: false }),
    ).toThrow(/not an OID/);
  });

  it('groups a wave into fence transactions of bounded table count, in order', () => {
    const three = () => 3;
    expect(fenceGroups([0, 1, 2, 3, 4, 5, 6], three, 9)).toEqual([[0, 1, 2], [3, 4, 5], [6]]);
    // A shard with more tables than the bound still gets a transaction (of its own).
    expect(fenceGroups([0, 1, 2], (s) => (s === 1 ? 20 : 3), 9)).toEqual([[0], [1], [2]]);
    expect(fenceGroups([], three, 9)).toEqual([]);
    // Every shard exactly once, in order, and no group over the bound unless it is one shard.
    for (let n = 0; n < 40; n++) {
      const shards = Array.from({ length: n }, (_, i) => i * 2);
      const count = (s: number) => 1 + (s % 7);
      const groups = fenceGroups(shards, count, 10);
      expect(groups.flat()).toEqual(shards);
      for (const g of groups) expect(g.length === 1 || g.reduce((t, s) => t + count(s), 0) <= 10).toBe(true);
    }
  });

  it('writes the wave marker and the fence start in one transaction', () => {
    expect(fenceMarkerSql('m1', 'fenced-x', { fenceMarker: 'fenced-x', fenceStartedAtMs: 1700000000000 })).toBe(
      [
        'BEGIN;',
        // Whatever the session's default: its flush covers the fence groups' commits before it.
        'SET LOCAL synchronous_commit = on;',
        `INSERT INTO "shardctl".move_markers (move_id, kind) VALUES ('m1', 'fenced-x') ON CONFLICT DO NOTHING;`,
        `UPDATE "shardctl".moves SET step = 'fenced', updated_at = now(), detail = detail || '{"fenceMarker":"fenced-x","fenceStartedAtMs":1700000000000}'::jsonb WHERE move_id = 'm1';`,
        'COMMIT;',
      ].join('\n'),
    );
  });

  it('reads sequences from the sequences themselves and sets them with their is_called flag', () => {
    expect(
      readSequencesSql([
        ['insta4', 'photos_id_seq'],
        ['insta4', 'likes_id_seq'],
      ]),
    ).toBe(
      'SELECT 0 AS i, last_value::text AS last_value, is_called FROM "insta4"."photos_id_seq"\nUNION ALL ' +
        'SELECT 1 AS i, last_value::text AS last_value, is_called FROM "insta4"."likes_id_seq"\nORDER BY 1',
    );
    expect(setSequencesSql([{ schema: 'insta4', name: 'a"b', lastValue: 101n, isCalled: false }])).toBe(
      `SELECT setval('"insta4"."a""b"'::regclass, 101, false)`,
    );
  });

  it('unfences with its lock waits bounded: triggers disabled (no wait for readers), the shard active again, the fence markers of this move gone', () => {
    expect(unfenceSql(4, [['insta4', 'likes']], 'm1', 250)).toBe(
      [
        'BEGIN;',
        "SET LOCAL lock_timeout = '250ms';",
        'ALTER TABLE "insta4"."likes" DISABLE TRIGGER shardctl_fence;',
        `UPDATE "shardctl".shards SET state = 'active' WHERE shard = 4 AND state = 'fenced';`,
        `DELETE FROM "shardctl".move_markers WHERE move_id = 'm1' AND kind LIKE 'fenced%';`,
        'COMMIT;',
      ].join('\n'),
    );
  });

  it('renames the old copy and leaves guarded views with the old grants under the old name', () => {
    const sql = renameWithStubSql({
      shard: 4,
      schema: 'insta4',
      renamed: oldCopyName('insta4', 'm1'),
      targetHost: 'pg2',
      tables: ['photos'],
      schemaGrants: [{ grantee: 'app', privilege: 'USAGE' }],
      tableGrants: [
        { relname: 'photos', grantee: null, privilege: 'SELECT' },
        { relname: 'photos', grantee: 'app', privilege: 'TRUNCATE' },
      ],
    });
    expect(sql).toContain('ALTER SCHEMA "insta4" RENAME TO "insta4_moved_m1";');
    expect(sql).toContain(
      `CREATE VIEW "insta4"."photos" AS SELECT * FROM "insta4_moved_m1"."photos" WHERE "shardctl".shard_moved('4', 'pg2');`,
    );
    expect(sql).toContain('GRANT USAGE ON SCHEMA "insta4" TO "app";');
    expect(sql).toContain('GRANT SELECT ON "insta4"."photos" TO PUBLIC;');
    expect(sql).not.toContain('TRUNCATE');
    expect(oldCopyName('x'.repeat(60), 'm1')).toHaveLength(63);
  });
});

describe('cut-over waves', () => {
  const rows = (entries: [number, number][]) => new Map(entries);

  it.each([
    { name: 'one wave when the batch is small', shards: [1, 2, 3], rows: [], limits: {}, waves: [[1, 2, 3]] },
    {
      name: 'at most maxShards a wave',
      shards: [1, 2, 3, 4, 5],
      rows: [],
      limits: { maxShards: 2 },
      waves: [[1, 2], [3, 4], [5]],
    },
    {
      name: 'a new wave before maxRows is passed',
      shards: [1, 2, 3],
      rows: [
        [1, 600],
        [2, 600],
        [3, 100],
      ],
      limits: { maxRows: 1000 },
      waves: [[1], [2, 3]],
    },
    {
      name: 'a shard over maxRows alone',
      shards: [1, 2],
      rows: [[1, 5000]],
      limits: { maxRows: 1000 },
      waves: [[1], [2]],
    },
  ] as const)('$name', ({ shards, rows: r, limits, waves }) => {
    expect(planWaves(shards, rows(r as unknown as [number, number][]), limits)).toEqual(waves);
  });
});

describe('round trips of the target creation (moves/targets.ts roundTrips)', () => {
  const work = (shard: number, noTransaction = false) => ({
    shard,
    statements: [
      'BEGIN; CREATE SCHEMA x; COMMIT;',
      ...(noTransaction ? ['CREATE INDEX CONCURRENTLY i ON t (a);'] : []),
    ],
  });

  it('sends the copies a few shards per round trip, and a shard with a no-transaction step alone', () => {
    const groups = roundTrips([work(0), work(1), work(2), work(3, true), work(4), work(5)], 2);
    expect(groups.map((g) => g.map((w) => w.shard))).toEqual([[0, 1], [3], [2, 4], [5]]);
  });

  it('keeps every shard once', () => {
    fc.assert(
      fc.property(fc.array(fc.boolean(), { maxLength: 40 }), fc.integer({ min: 1, max: 8 }), (alone, size) => {
        const groups = roundTrips(
          alone.map((a, i) => work(i, a)),
          size,
        );
        expect(
          groups
            .flat()
            .map((w) => w.shard)
            .sort((a, b) => a - b),
        ).toEqual(alone.map((_, i) => i));
        expect(groups.every((g) => g.length >= 1 && g.length <= size)).toBe(true);
      }),
    );
  });
});

describe('chunks of the target creation (moves/copy.ts chunksOf)', () => {
  it('keeps every shard once, in order, in at most count chunks plus the halves of the last', () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 0, max: 300 }),
        fc.integer({ min: 1, max: 16 }),
        fc.integer({ min: 1, max: 8 }),
        (n, count, least) => {
          const list = Array.from({ length: n }, (_, i) => i);
          const chunks = chunksOf(list, count, least);
          expect(chunks.flat()).toEqual(list);
          expect(chunks.every((c) => c.length > 0)).toBe(true);
          if (n === 0) return;
          const size = Math.ceil(n / count);
          // Every chunk but the split tail has the common size; the tail's last chunk is under twice `least`.
          const tail = chunks.findIndex((c) => c.length < size);
          const whole = tail === -1 ? chunks : chunks.slice(0, tail);
          expect(whole.every((c) => c.length === size)).toBe(true);
          expect(chunks.at(-1)!.length < 2 * least || chunks.length === 1 || chunks.at(-1)!.length === size).toBe(true);
        },
      ),
    );
  });

  it('splits the last chunk of 64 shards down to the two workers building it', () => {
    const chunks = chunksOf(
      Array.from({ length: 64 }, (_, i) => i),
      8,
      2,
    );
    expect(chunks.map((c) => c.length)).toEqual([8, 8, 8, 8, 8, 8, 8, 4, 2, 2]);
    expect(chunksOf([1, 2, 3], 8, 2).map((c) => c.length)).toEqual([1, 1, 1]);
  });
});

describe('pre-fence verification SQL (moves/tail.ts)', () => {
  const keyed = {
    table: { schema: 'insta"1', table: 'photo likes', portable: true },
    columns: ['photo_id', 'user "id"'],
    types: ['bigint', 'character varying(20)'],
  };

  it('looks rows up by their key columns, read back with their types, identifiers quoted', () => {
    expect(keyFilterSql(keyed, sql`$3`)).toBe(
      '(t."photo_id", t."user ""id""") IN (SELECT k."photo_id", k."user ""id""" FROM jsonb_to_recordset($3::jsonb) AS k("photo_id" bigint, "user ""id""" character varying(20)))',
    );
  });

  it('tracks every write with ALWAYS triggers (the apply worker runs as replica), the move id and key columns as literals', () => {
    const sql = startTrackingSql("m'1", [keyed]);
    expect(sql.startsWith('BEGIN;')).toBe(true);
    expect(sql.endsWith('COMMIT;')).toBe(true);
    expect(sql).toContain(`DELETE FROM "shardctl".move_changes WHERE move_id = 'm''1';`);
    expect(sql).toContain(
      `CREATE OR REPLACE TRIGGER "shardctl_track" AFTER INSERT OR UPDATE OR DELETE ON "insta""1"."photo likes" FOR EACH ROW EXECUTE FUNCTION "shardctl".move_track('m''1', 'photo_id', 'user "id"');`,
    );
    expect(sql).toContain(
      `ALTER TABLE "insta""1"."photo likes" ENABLE ALWAYS TRIGGER "shardctl_track", ENABLE ALWAYS TRIGGER "shardctl_track_truncate";`,
    );
    expect(sql).not.toContain('{{');
  });
  it('logs the rows of keyless tables with ALWAYS triggers, the move id and checksum method as literals, its lock waits bounded', () => {
    const sql = startDeltasSql("m'1", [{ table: { schema: 'insta"1', table: 'audit log' }, method: 'text' }], 250);
    expect(sql.startsWith('BEGIN;')).toBe(true);
    expect(sql.endsWith('COMMIT;')).toBe(true);
    expect(sql).toContain(`SET LOCAL lock_timeout = '250ms';`);
    expect(sql).toContain(`DELETE FROM "shardctl".move_deltas WHERE move_id = 'm''1';`);
    expect(sql).toContain(
      `CREATE OR REPLACE TRIGGER "shardctl_delta" AFTER INSERT OR UPDATE OR DELETE ON "insta""1"."audit log" FOR EACH ROW EXECUTE FUNCTION "shardctl"."shardctl_move_m'1_log0"('m''1', 'text');`,
    );
    expect(sql).toContain(
      `CREATE OR REPLACE TRIGGER "shardctl_delta_truncate" AFTER TRUNCATE ON "insta""1"."audit log" FOR EACH STATEMENT`,
    );
    expect(sql).toContain(
      `ALTER TABLE "insta""1"."audit log" ENABLE ALWAYS TRIGGER "shardctl_delta", ENABLE ALWAYS TRIGGER "shardctl_delta_truncate";`,
    );
    expect(sql).not.toContain('{{');
  });
  it("on the source, logs each table in a transaction of its own (one table's lock at a time), after the log's own, each lock wait bounded", () => {
    const tables = [
      { table: { schema: 'insta1', table: 'a' }, method: 'record' as const },
      { table: { schema: 'insta1', table: 'b' }, method: 'text' as const },
    ];
    const sql = startSourceDeltasSql('m1', tables, 250, 3);
    const transactions = sql.split('COMMIT;').slice(0, -1);
    expect(sql.trim().endsWith('COMMIT;')).toBe(true);
    expect(transactions).toHaveLength(3);
    for (const t of transactions) {
      expect(t.trim().startsWith('BEGIN;')).toBe(true);
      expect(t).toContain(`SET LOCAL lock_timeout = '250ms';`);
      expect(t.match(/BEGIN;/g)).toHaveLength(1);
    }
    expect(transactions[0]).toContain(`DELETE FROM "shardctl".move_deltas WHERE move_id = 'm1';`);
    expect(transactions[0]).not.toContain('CREATE OR REPLACE TRIGGER');
    expect(transactions[1]).toContain(
      `ON "insta1"."a" FOR EACH ROW EXECUTE FUNCTION "shardctl"."shardctl_move_m1_log3"('m1', 'record');`,
    );
    expect(transactions[1]).not.toContain('"insta1"."b"');
    expect(transactions[2]).toContain(
      `ON "insta1"."b" FOR EACH ROW EXECUTE FUNCTION "shardctl"."shardctl_move_m1_log3"('m1', 'text');`,
    );
    expect(transactions[2]).not.toContain('"insta1"."a"');
  });
  it('keeps the log entries when asked (the logs run since the copy)', () => {
    const tables = [{ table: { schema: 'insta1', table: 'a' }, method: 'record' as const }];
    expect(startSourceDeltasSql('m1', tables, 250, 0, true)).not.toContain('DELETE FROM');
    expect(startDeltasSql('m1', tables, 250, 0, true)).not.toContain('DELETE FROM');
  });
  it("logs a table on the target during the copy, leaving out the copy's own transactions, without a transaction of its own", () => {
    const sql = copyLogOnTargetSql('m1', 0, { table: { schema: 'insta1', table: 'photos' }, method: 'record' });
    expect(sql).not.toContain('BEGIN;');
    expect(sql).not.toContain('DELETE FROM');
    // A row trigger an earlier run left gives way to the statement trigger (a resumed copy).
    expect(sql).toContain(`DROP TRIGGER IF EXISTS "shardctl_delta" ON "insta1"."photos";`);
    expect(sql.indexOf('DROP TRIGGER')).toBeLessThan(sql.indexOf('CREATE OR REPLACE TRIGGER'));
    expect(sql).toContain(
      `CREATE OR REPLACE TRIGGER "shardctl_delta" AFTER INSERT OR UPDATE OR DELETE ON "insta1"."photos" FOR EACH STATEMENT WHEN (current_setting('shardctl.copying', true) IS DISTINCT FROM 'on') EXECUTE FUNCTION "shardctl"."shardctl_move_m1_log0"('m1', 'record');`,
    );
    expect(sql).toContain(
      `CREATE OR REPLACE TRIGGER "shardctl_delta_truncate" AFTER TRUNCATE ON "insta1"."photos" FOR EACH STATEMENT WHEN (current_setting('shardctl.copying', true) IS DISTINCT FROM 'on') EXECUTE FUNCTION`,
    );
    expect(sql).toContain(`ENABLE ALWAYS TRIGGER "shardctl_delta", ENABLE ALWAYS TRIGGER "shardctl_delta_truncate";`);
    // The copy's transactions set what the triggers read.
    expect(BEGIN_COPY_SQL).toContain(`SET LOCAL ${COPYING_SETTING} = 'on';`);
    // After the copy: by row, for every writer.
    const rows = copyLogRowsOnTargetSql('m1', 0, { table: { schema: 'insta1', table: 'photos' }, method: 'record' });
    expect(rows.startsWith('BEGIN;')).toBe(true);
    expect(rows).toContain(`DROP TRIGGER IF EXISTS "shardctl_delta" ON "insta1"."photos";`);
    expect(rows).toContain(
      `CREATE OR REPLACE TRIGGER "shardctl_delta" AFTER INSERT OR UPDATE OR DELETE ON "insta1"."photos" FOR EACH ROW EXECUTE FUNCTION "shardctl"."shardctl_move_m1_log0"('m1', 'record');`,
    );
  });
});

describe('a logged table counted from its value at P and its log (moves/tail.ts fromLog)', () => {
  const atP = { rows: 100n, checksum: '5000' };
  const log = (
    entries: number,
    rows: number,
    checksum: number,
    truncatedAt: bigint | null = null,
    after: [number, number] = [0, 0],
  ): LogSums => ({
    truncatedAt,
    entries: BigInt(entries),
    rows: BigInt(rows),
    checksum: String(checksum),
    rowsAfterTruncate: BigInt(after[0]),
    checksumAfterTruncate: String(after[1]),
  });

  it.each([
    {
      case: 'no log entry at all',
      logAtP: undefined,
      logNow: undefined,
      want: { rows: 100n, checksum: '5000', changes: 0n },
    },
    {
      case: 'entries before P only (they cancel out)',
      logAtP: log(3, 1, 70),
      logNow: log(3, 1, 70),
      want: { rows: 100n, checksum: '5000', changes: 0n },
    },
    {
      case: 'entries after P',
      logAtP: log(3, 1, 70),
      logNow: log(6, 2, -30),
      want: { rows: 101n, checksum: '4900', changes: 3n },
    },
    {
      case: 'a truncate before P (already in the value at P)',
      logAtP: log(2, 0, 0, 7n),
      logNow: log(4, 2, 90, 7n, [2, 90]),
      want: { rows: 102n, checksum: '5090', changes: 2n },
    },
    {
      case: 'a truncate after P: only the entries after it count',
      logAtP: log(2, 2, 40),
      logNow: log(6, 3, 70, 9n, [1, 30]),
      want: { rows: 1n, checksum: '30', changes: 4n },
    },
    {
      case: 'a second truncate after P',
      logAtP: log(2, 0, 0, 3n),
      logNow: log(5, 0, 0, 11n, [0, 0]),
      want: { rows: 0n, checksum: '0', changes: 3n },
    },
  ])('$case', ({ logAtP, logNow, want }) => {
    expect(fromLog(atP, logAtP, logNow)).toEqual(want);
  });
});

describe('owners, grants and default privileges carried by a move', () => {
  const entry = (grantee: string | null, grantor: string, privilege: string, grantable = false): AclEntry => ({
    grantee,
    grantor,
    privilege,
    grantable,
  });
  const object = (over: Partial<PrivilegeObject> & Pick<PrivilegeObject, 'kind'>): PrivilegeObject => ({
    schema: 'insta3',
    name: null,
    args: null,
    column: null,
    owner: 'mover',
    linked: false,
    acl: [],
    ...over,
  });
  const table = (owner: string, acl: AclEntry[], name = 'photos') => object({ kind: 'table', name, owner, acl });

  it("keeps a guarded copy's schema to its owner's entries and everything in it as the source has it; the switch grants the rest", () => {
    const schemaAcl = [
      entry('app', 'app', 'USAGE'),
      entry('app', 'app', 'CREATE'),
      entry('reader', 'app', 'USAGE'),
      entry(null, 'app', 'USAGE'),
    ];
    const source = [
      object({ kind: 'schema', owner: 'app', acl: schemaAcl }),
      table('app', [entry('reader', 'app', 'SELECT')]),
    ];
    const withheld = withheldSchemaAcl(source);
    expect(withheld).toEqual([
      object({ kind: 'schema', owner: 'app', acl: [entry('app', 'app', 'USAGE'), entry('app', 'app', 'CREATE')] }),
      source[1],
    ]);
    // The carry to a copy whose schema has its owner's default ACL: nothing to change.
    expect(syncPrivilegesSql(withheld, [object({ kind: 'schema', owner: 'app', acl: withheld[0]!.acl })])).toEqual([]);
    // The switch: the source's schema ACL over the withheld one.
    expect(syncPrivilegesSql([source[0]!], [withheld[0]!])).toEqual([
      'REVOKE ALL ON SCHEMA "insta3" FROM PUBLIC, "app" CASCADE;',
      'GRANT CREATE, USAGE ON SCHEMA "insta3" TO "app";',
      'GRANT USAGE ON SCHEMA "insta3" TO "reader";',
      'GRANT USAGE ON SCHEMA "insta3" TO PUBLIC;',
    ]);
  });

  it('changes nothing when both copies have the same owners and ACLs (entry order aside)', () => {
    const acl = [entry('mover', 'mover', 'SELECT'), entry('reader', 'mover', 'SELECT')];
    expect(syncPrivilegesSql([table('mover', acl)], [table('mover', [...acl].reverse())])).toEqual([]);
  });

  it('gives an object to its owner, and nothing more when the ACL follows the owner as the server moves it', () => {
    expect(
      syncPrivilegesSql(
        [table('app', [entry('app', 'app', 'SELECT'), entry('reader', 'app', 'SELECT')])],
        [table('mover', [entry('mover', 'mover', 'SELECT'), entry('reader', 'mover', 'SELECT')])],
      ),
    ).toEqual(['ALTER TABLE "insta3"."photos" OWNER TO "app";']);
  });

  it('revokes everything from every role the target names and PUBLIC, then grants the source ACL, grouped by grantee and grant option', () => {
    const sql = syncPrivilegesSql(
      [
        table('app', [
          entry('app', 'app', 'SELECT'),
          entry('app', 'app', 'INSERT'),
          entry('reader', 'app', 'SELECT', true),
        ]),
      ],
      [
        table('app', [
          entry('app', 'app', 'SELECT'),
          entry('app', 'app', 'INSERT'),
          entry(null, 'app', 'SELECT'),
          entry('old"role', 'app', 'UPDATE'),
        ]),
      ],
    );
    expect(sql).toEqual([
      'REVOKE ALL ON TABLE "insta3"."photos" FROM PUBLIC, "app", "old""role" CASCADE;',
      'GRANT INSERT, SELECT ON TABLE "insta3"."photos" TO "app";',
      'GRANT SELECT ON TABLE "insta3"."photos" TO "reader" WITH GRANT OPTION;',
    ]);
  });

  it("orders the schema first and default privileges last, uses each kind's own statements, and leaves a linked sequence to its table", () => {
    const source = [
      object({ kind: 'default', name: 'r', owner: 'app', acl: [entry('reader', 'app', 'SELECT')] }),
      object({
        kind: 'routine',
        name: 'count',
        args: 'min_user bigint',
        owner: 'app',
        acl: [entry('app', 'app', 'EXECUTE')],
      }),
      object({
        kind: 'sequence',
        name: 'photos_id_seq',
        owner: 'app',
        linked: true,
        acl: [entry('app', 'app', 'USAGE')],
      }),
      object({ kind: 'sequence', name: 'free_seq', owner: 'app', acl: [entry('app', 'app', 'USAGE')] }),
      object({ kind: 'materialized view', name: 'stats', owner: 'app', acl: [] }),
      object({ kind: 'schema', owner: 'app', acl: [entry('app', 'app', 'USAGE'), entry('app', 'app', 'CREATE')] }),
    ];
    const target = source
      .filter((o) => o.kind !== 'default')
      .map((o) => ({ ...o, owner: 'mover', acl: o.acl.map((a) => ({ ...a, grantee: 'mover', grantor: 'mover' })) }));
    expect(syncPrivilegesSql(source, target)).toEqual([
      'ALTER SCHEMA "insta3" OWNER TO "app";',
      'ALTER SEQUENCE "insta3"."free_seq" OWNER TO "app";',
      'ALTER MATERIALIZED VIEW "insta3"."stats" OWNER TO "app";',
      'ALTER ROUTINE "insta3"."count"(min_user bigint) OWNER TO "app";',
      'ALTER DEFAULT PRIVILEGES FOR ROLE "app" IN SCHEMA "insta3" REVOKE ALL ON TABLES FROM PUBLIC CASCADE;',
      'ALTER DEFAULT PRIVILEGES FOR ROLE "app" IN SCHEMA "insta3" GRANT SELECT ON TABLES TO "reader";',
    ]);
  });

  it("grants column privileges again after their table's REVOKE, and revokes those the source does not have", () => {
    const column = (name: string, acl: AclEntry[]) =>
      object({ kind: 'column', name: 'comments', column: name, owner: null, acl });
    const sql = syncPrivilegesSql(
      [table('app', [entry('app', 'app', 'SELECT')], 'comments'), column('body', [entry('reader', 'app', 'SELECT')])],
      [
        table('app', [entry('app', 'app', 'SELECT'), entry(null, 'app', 'SELECT')], 'comments'),
        column('body', [entry('reader', 'app', 'SELECT')]),
        column('secret', [entry(null, 'app', 'SELECT')]),
      ],
    );
    expect(sql).toEqual([
      'REVOKE ALL ON TABLE "insta3"."comments" FROM PUBLIC, "app" CASCADE;',
      'GRANT SELECT ON TABLE "insta3"."comments" TO "app";',
      'REVOKE ALL ("body") ON TABLE "insta3"."comments" FROM PUBLIC, "reader" CASCADE;',
      'GRANT SELECT ("body") ON TABLE "insta3"."comments" TO "reader";',
      'REVOKE ALL ("secret") ON TABLE "insta3"."comments" FROM PUBLIC CASCADE;',
    ]);
  });

  it('removes default privileges the target has and the source does not', () => {
    const defaults = object({ kind: 'default', name: 'S', owner: 'mover', acl: [entry('reader', 'mover', 'USAGE')] });
    expect(syncPrivilegesSql([], [defaults])).toEqual([
      'ALTER DEFAULT PRIVILEGES FOR ROLE "mover" IN SCHEMA "insta3" REVOKE ALL ON SEQUENCES FROM PUBLIC, "reader" CASCADE;',
    ]);
  });

  it('between majors, keeps the privileges only the target has and gives none only the source has (MAINTAIN from 17)', () => {
    const upgraded = [entry('app', 'app', 'SELECT'), entry('app', 'app', 'MAINTAIN'), entry('reader', 'app', 'SELECT')];
    expect(
      syncPrivilegesSql(
        [table('app', [entry('app', 'app', 'SELECT'), entry('reader', 'app', 'SELECT')])],
        [table('app', upgraded)],
        privilegeVersions(160004, 170000),
      ),
    ).toEqual([]);
    expect(
      syncPrivilegesSql(
        [table('app', upgraded)],
        [table('app', [entry('app', 'app', 'SELECT')])],
        privilegeVersions(170000, 160004),
      ),
    ).toEqual([
      'REVOKE ALL ON TABLE "insta3"."photos" FROM PUBLIC, "app" CASCADE;',
      'GRANT SELECT ON TABLE "insta3"."photos" TO "app";',
      'GRANT SELECT ON TABLE "insta3"."photos" TO "reader";',
    ]);
    expect(privilegeVersions(180000, 170000)).toEqual({ sourceOnly: new Set(), targetOnly: new Set() });
  });

  it('refuses a privilege or default object type it does not know instead of writing it into SQL', () => {
    expect(() => syncPrivilegesSql([table('app', [entry('app', 'app', 'SELECT; DROP')])], [table('app', [])])).toThrow(
      /unknown privilege/,
    );
    expect(() =>
      syncPrivilegesSql([object({ kind: 'default', name: 'x', owner: 'app', acl: [entry('r', 'app', 'SELECT')] })], []),
    ).toThrow(/unknown default privilege object type/);
  });

  it('names every role the objects name, and which of them own something', () => {
    expect(
      rolesNamed([
        table('app', [entry('reader', 'app', 'SELECT'), entry(null, 'app', 'SELECT')]),
        object({ kind: 'default', name: 'r', owner: 'mover', acl: [entry('r2', 'mover', 'SELECT')] }),
      ]),
    ).toEqual({
      all: ['app', 'mover', 'r2', 'reader'],
      owners: ['app', 'mover'],
    });
  });
});
