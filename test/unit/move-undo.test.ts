import { describe, expect, it } from 'vitest';
import { undosAfter } from '../../src/moves/move.js';
import type { MoveMode, MoveStep } from '../../src/moves/state.js';
import { dropFenceTriggerSql } from '../../src/moves/sql/fence.js';
import { leftoverReplicationSql } from '../../src/moves/sql/leftovers.js';
import { dropTriggerIfFreeSql } from '../../src/moves/sql/locks.js';
import { deltaFunctionName } from '../../src/moves/sql/names.js';
import { targetShardStatesSql } from '../../src/moves/sql/preflight.js';
import { logsOffSql, stopTrackingSql } from '../../src/moves/sql/tail.js';
import { checksumsSql, hashProbeSql } from '../../src/moves/sql/verify.js';

const names = (mode: MoveMode, step: MoveStep): string[] => undosAfter(mode, step).map((undo) => undo.name);

describe('abortMove undoes the recorded steps backwards, each undo beside its step (moves/move.ts STEPS)', () => {
  it.each<[MoveMode, MoveStep, string[]]>([
    // The replication goes before the unfence, the copies before their tracking's rows, the markers last.
    ['online', 'synced', ['dropReplication', 'undoFence', 'dropTargets', 'deleteMarkers']],
    ['online', 'sequences-carried', ['dropReplication', 'undoFence', 'dropTargets', 'deleteMarkers']],
    ['online', 'fenced', ['dropReplication', 'undoFence', 'dropTargets', 'deleteMarkers']],
    // Nothing was fenced yet: a subscription cut off half made is dropped with the rest of the replication.
    ['online', 'copied', ['dropReplication', 'dropTargets', 'deleteMarkers']],
    // Online the creation runs with the publication and the copy (createAndCopy): a run cut off in it
    // may have left a slot. Offline there is none to drop, and dropping none is harmless.
    ['online', 'prepared', ['dropReplication', 'dropTargets', 'deleteMarkers']],
    ['offline', 'prepared', ['dropReplication', 'dropTargets', 'deleteMarkers']],
    ['offline', 'target-created', ['dropReplication', 'undoFence', 'dropTargets', 'deleteMarkers']],
    ['offline', 'copied', ['dropReplication', 'undoFence', 'dropTargets', 'deleteMarkers']],
  ])('%s, recorded at %s: %j', (mode, step, expected) => {
    expect(names(mode, step)).toEqual(expected);
  });
});

describe('move SQL of the cut-over and the leftovers (moves/sql.ts)', () => {
  it('drops a trigger only if its table is free now, the name quoted', () => {
    expect(dropTriggerIfFreeSql('insta"1', 'photo likes', 'shardctl_delta')).toBe(
      `BEGIN;\nSET LOCAL lock_timeout = '1ms';\nDROP TRIGGER IF EXISTS "shardctl_delta" ON "insta""1"."photo likes";\nCOMMIT;`,
    );
    expect(dropFenceTriggerSql('insta1', 'photos')).toBe(
      `BEGIN;\nSET LOCAL lock_timeout = '1ms';\nDROP TRIGGER IF EXISTS "shardctl_fence" ON "insta1"."photos";\nCOMMIT;`,
    );
  });

  it("stops the tracking: its triggers dropped, the move's keys deleted only when their table exists", () => {
    const triggers = [{ schema: 'insta1', table: 'photos', trigger: 'shardctl_track' }];
    expect(stopTrackingSql("m'1", triggers, true)).toBe(
      `BEGIN;\nSET LOCAL lock_timeout = '5s';\nDROP TRIGGER IF EXISTS "shardctl_track" ON "insta1"."photos";\nDELETE FROM "shardctl".move_changes WHERE move_id = 'm''1';\nCOMMIT;`,
    );
    expect(stopTrackingSql('m1', triggers, false)).not.toContain('DELETE');
  });

  it("switches the change logs off by replacing their functions, with no table lock, and deletes the move's entries", () => {
    const sql = logsOffSql([['shardctl', deltaFunctionName('m1', 2)]], 'm1', true);
    expect(sql).toBe(
      `BEGIN;\nCREATE OR REPLACE FUNCTION "shardctl"."shardctl_move_m1_log2"() RETURNS trigger LANGUAGE plpgsql AS $off$ BEGIN RETURN NULL; END $off$;\nDELETE FROM "shardctl".move_deltas WHERE move_id = 'm1';\nCOMMIT;`,
    );
    expect(sql).not.toMatch(/ALTER TABLE|LOCK/);
    expect(logsOffSql([], 'm1', false)).toBe('BEGIN;\nCOMMIT;');
    expect(() => deltaFunctionName('m1', -1)).toThrow(/not a wave/);
  });

  it('checksums several tables in one statement, key subsets as parameters', () => {
    const { sql, params } = checksumsSql([
      { table: { schema: 'insta1', table: 'photos' }, method: 'record' },
      {
        table: { schema: 'insta1', table: 'likes' },
        method: 'text',
        keys: {
          keyed: { table: { schema: 'insta1', table: 'likes' }, columns: ['id'], types: ['bigint'] },
          json: '[{"id":1}]',
        },
      },
    ]);
    expect(sql).toBe(
      `SELECT 0 AS i, count(*)::text AS rows, coalesce(sum(hash_record_extended(t.*, 0)), 0)::text AS checksum FROM "insta1"."photos" t\n` +
        `UNION ALL SELECT 1 AS i, count(*)::text AS rows, coalesce(sum(hashtextextended((t.*)::text, 0)), 0)::text AS checksum FROM "insta1"."likes" t` +
        ` WHERE (t."id") IN (SELECT k."id" FROM jsonb_to_recordset($1::jsonb) AS k("id" bigint))\nORDER BY 1`,
    );
    expect(params).toEqual(['[{"id":1}]']);
  });

  it('probes the record hash of several column types in one statement, each on an all-NULL row', () => {
    expect(hashProbeSql(['bigint', 'timestamp with time zone', '"char"', 'json[]'])).toBe(
      `SELECT hash_record_extended(ROW(NULL::bigint), 0)\n` +
        `UNION ALL SELECT hash_record_extended(ROW(NULL::timestamp with time zone), 0)\n` +
        `UNION ALL SELECT hash_record_extended(ROW(NULL::"char"), 0)\n` +
        `UNION ALL SELECT hash_record_extended(ROW(NULL::json[]), 0)`,
    );
    // Only names of built-in types: nothing else reaches the SQL.
    expect(() => hashProbeSql(['int); DROP TABLE x; --'])).toThrow(/not a built-in type name/);
    expect(() => hashProbeSql(['"evil"'])).toThrow(/not a built-in type name/);
  });

  it('lists as leftovers the replication objects no running move accounts for, or all of them on a host without moves', () => {
    expect(leftoverReplicationSql(true)).toContain(
      `NOT IN (SELECT 'shardctl_move_' || move_id FROM "shardctl".moves WHERE status = 'running')`,
    );
    expect(leftoverReplicationSql(false)).toContain('NOT IN (SELECT NULL::text WHERE false)');
    expect(leftoverReplicationSql(false)).toContain(`LIKE 'shardctl\\_move\\_%'`);
  });

  it("reads the target's shard states only where it has a control schema", () => {
    expect(targetShardStatesSql(true)).toContain(
      '(SELECT state FROM "shardctl".shards c WHERE c.shard = s.shard) AS state',
    );
    expect(targetShardStatesSql(false)).toContain('NULL::text AS state');
  });
});
