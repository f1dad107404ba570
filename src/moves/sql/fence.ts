import { EMPTY, ident, int, lines, list, lit, sql, type Sql } from '../../pg/sql-template.js';
import { CONTROL, shardMovedRaiseSql } from '../../fleet/control.js';
import { placementVersionSql } from '../../fleet/placement.js';
import { dropTriggerIfFreeSql, lockTablesSql, lockTimeoutSql } from './locks.js';
import { FENCE_TRIGGER, fenceGuardName, qualified } from './names.js';
import { insertMarkerSql } from './replication.js';
import { readSequencesSql, sequenceDataSql } from './sequences.js';
import { statementTimeoutSql } from './session.js';

/**
 * The fence of a wave on the source (its guard, triggers, the transactions that lock and mark the
 * shards, what it reads once fenced) and its undo.
 */

export interface FenceInput {
  /**
   * The shards fenced together, each with every one of its tables including partitions, as [schema,
   * table]; `prepared`: its fence triggers exist already and call the move's guard (prepareFenceSql),
   * which `closeGuard` closes: the transaction only locks its tables and marks it fenced.
   */
  readonly shards: readonly {
    readonly shard: number;
    readonly tables: readonly (readonly [string, string])[];
    readonly prepared?: boolean;
  }[];
  /** Where the shards are going, named in the SC100 error. */
  readonly targetHost: string;
  /** How long the LOCK may wait in all, in ms: below deadlock_timeout, so it cannot lose to application lock order. */
  readonly lockWaitMs: number;
  /** The first table waits lockWaitMs, the others less (lockTablesSql's firstAlone): a busy shard's retries. */
  readonly lockFirstAlone?: boolean;
  /** CREATE OR REPLACE TRIGGER exists from PostgreSQL 14. */
  readonly createOrReplaceTrigger: boolean;
  /**
   * The wave's first fence: when it began (wall-clock ms), recorded in the move's detail by the same
   * transaction, so a run killed at any point after it leaves the time its shards began refusing writes.
   */
  readonly fenceStart?: { readonly moveId: string; readonly atMs: number };
  /**
   * Tables (by OID) whose emptiness the transaction reports, as rows (oid, empty), once they are
   * locked and fenced: from then on no write changes it.
   */
  readonly reportEmpty?: readonly number[];
  /** The move's guard closed for waves up to this one (fenceGuardSql): every prepared shard of the wave refuses writes from the commit on. */
  readonly closeGuard?: { readonly moveId: string; readonly wave: number };
  /**
   * Commit without waiting for the WAL flush (synchronous_commit off): only where a transaction
   * that waits for it follows in the same string (fenceWaveSql's marker), whose flush covers this
   * commit. Until then a crash of the server can lose the fence, but nothing acted on it yet.
   */
  readonly flushedLater?: boolean;
}

/**
 * Every table of schemas $1 (text[]), partitioned parents and partitions included, by schema and
 * name, in the order shardTables(…, 'all') returns them: what a fence locks and gives a trigger, and
 * what the clean-up puts a view over. Names only: shardTables also reads every column's type
 * (pg_attribute, pg_type), which neither needs, and which on a host of thousands of shards made
 * that read the longest step between two waves.
 */
export const TABLE_NAMES_SQL = sql`SELECT n.nspname AS schema, c.relname AS table
       FROM pg_catalog.pg_class c
       JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
      WHERE n.nspname = ANY($1::text[]) AND c.relkind IN ('r', 'p')
      ORDER BY n.nspname, c.relname`;

/**
 * The guard of a move's prepared fence triggers: each trigger passes its shard, the shard's new host
 * and its wave; the guard refuses the write with SC100 (as shard_fenced) when that wave is at most
 * `closedUpTo`, else lets it through. A fence closes its wave by replacing this one function (one
 * catalog change for the wave, instead of one per table), which a writer sees from its next lock
 * of the table on (PL/pgSQL checks the function's catalog row on every call); the fence's LOCK
 * then waits for the transactions that passed it before. A wave switched stays closed: its old
 * copies stay fenced; a wave whose cut-over stopped is unfenced by setting the guard back to the
 * waves before it (no table lock), as its next preparation does too.
 */
export function fenceGuardSql(moveId: string, closedUpTo: number): Sql {
  return lines([
    sql`CREATE OR REPLACE FUNCTION ${fenceGuardName(moveId)}() RETURNS trigger`,
    sql`LANGUAGE plpgsql AS $guard$`,
    sql`BEGIN`,
    sql`  IF TG_ARGV[2]::int <= ${int(closedUpTo, 'a wave', -1)} THEN`,
    shardMovedRaiseSql(sql`TG_ARGV[0]`, sql`TG_ARGV[1]`, 'writes to this copy are refused', 4),
    sql`  END IF;`,
    sql`  RETURN NULL;`,
    sql`END`,
    sql`$guard$;`,
  ]);
}

/**
 * The fence of a few shards, in one transaction: their tables locked in SHARE ROW EXCLUSIVE mode
 * (waits for in-flight writers), a statement trigger on every table that refuses every write with
 * SQLSTATE SC100 naming the table's shard, and the shards marked fenced. The caller keeps the
 * number of tables of one transaction bounded (fenceGroups), so a wave of any size needs no more
 * lock slots than a few shards.
 *
 * Why it cannot deadlock an application: the LOCK statement may wait only `lockWaitMs` in all
 * (lock_timeout and statement_timeout; 1.25 × lockWaitMs with lockFirstAlone, whose tables after
 * the first wait a quarter of it), which is below the server's deadlock_timeout. An
 * application transaction waiting for a table the fence already holds started waiting after the
 * fence took it, so it has waited less than lockWaitMs when the fence gives up and rolls back:
 * neither side reaches the deadlock check, nobody is aborted, and the move retries the fence.
 */
export function fenceSql(input: FenceInput): Sql {
  const tables = input.shards.flatMap(({ tables }) => tables.map(([schema, table]) => qualified(schema, table)));
  const triggers = input.shards.flatMap(({ shard, tables: own, prepared }) =>
    own.flatMap(([schema, table]) => {
      const t = qualified(schema, table);
      if (prepared) return [];
      return input.createOrReplaceTrigger
        ? // ENABLE: an unfence leaves the trigger disabled when it cannot drop it (see unfenceSql).
          sql`${fenceTriggerSql(shard, t, input.targetHost)}\nALTER TABLE ${t} ENABLE TRIGGER shardctl_fence;`
        : // Before PostgreSQL 14: drop and create (a stronger lock, held for the few ms of this transaction).
          sql`DROP TRIGGER IF EXISTS shardctl_fence ON ${t};\n${fenceTriggerSql(shard, t, input.targetHost, false)}`;
    }),
  );
  const shards = input.shards.map(({ shard }) => int(shard, 'a shard number'));
  return lines([
    sql`BEGIN;`,
    ...(input.flushedLater ? [sql`SET LOCAL synchronous_commit = off;`] : []),
    ...lockTablesSql(tables, input.lockWaitMs, { firstAlone: input.lockFirstAlone ?? false }),
    ...(input.closeGuard ? [fenceGuardSql(input.closeGuard.moveId, input.closeGuard.wave)] : []),
    ...triggers,
    sql`UPDATE ${CONTROL}.shards SET state = 'fenced' WHERE shard IN (${list(shards)});`,
    ...(input.fenceStart
      ? [
          sql`UPDATE ${CONTROL}.moves SET detail = detail || ${lit(JSON.stringify({ fenceStartedAtMs: Math.round(input.fenceStart.atMs) }))}::jsonb WHERE move_id = ${lit(input.fenceStart.moveId)};`,
        ]
      : []),
    ...(input.reportEmpty && input.reportEmpty.length > 0 ? [reportEmptySql(input.reportEmpty)] : []),
    sql`COMMIT;`,
  ]);
}

/** Rows (oid, empty) for these relations: whether each has no page (pg_relation_size 0). */
export function reportEmptySql(oids: readonly number[]): Sql {
  const array = list(
    oids.map((oid) => int(oid, 'an OID', 1)),
    ',',
  );
  return sql`SELECT o AS oid, pg_relation_size(o) = 0 AS empty FROM unnest('{${array}}'::oid[]) AS o;`;
}

/** The fence trigger of one table (`t` quoted): every write refused with SC100, naming the shard and its new host. */
function fenceTriggerSql(shard: number, t: Sql, targetHost: string, orReplace = true): Sql {
  const fn = sql`${CONTROL}.shard_fenced(${lit(String(shard))}, ${lit(targetHost)})`;
  return sql`CREATE ${orReplace ? sql`OR REPLACE ` : EMPTY}TRIGGER shardctl_fence BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON ${t} FOR EACH STATEMENT EXECUTE FUNCTION ${fn};`;
}

/**
 * The fence triggers of a few shards created while the shards are still writable (PostgreSQL 14 and
 * later), in one transaction, each calling the move's guard with its shard, new host and wave, and
 * the guard (re)set open for `wave` (closed for the waves before it, whose old copies stay fenced):
 * the fence then closes the guard (fenceSql, `prepared`) instead of changing a trigger per table
 * while writes wait. CREATE TRIGGER waits for the tables' writers like the fence's LOCK:
 * `lockWaitMs` bounds that wait the same way, and the caller retries. An unfence opens the guard
 * again and drops these triggers where their tables are free.
 */
export function prepareFenceSql(
  input: Omit<FenceInput, 'createOrReplaceTrigger' | 'fenceStart' | 'closeGuard'> & {
    readonly moveId: string;
    readonly wave: number;
  },
): Sql {
  const wave = int(input.wave, 'a wave');
  const tables = input.shards.flatMap(({ shard, tables }) =>
    tables.map(([schema, table]) => ({ shard, t: qualified(schema, table) })),
  );
  const guard = fenceGuardName(input.moveId);
  return lines([
    sql`BEGIN;`,
    ...lockTablesSql(
      tables.map(({ t }) => t),
      input.lockWaitMs,
    ),
    fenceGuardSql(input.moveId, input.wave - 1),
    ...tables.map(
      ({ shard, t }) =>
        // Enabled, also where an unfence left the trigger disabled: CREATE OR REPLACE sets it enabled.
        sql`CREATE OR REPLACE TRIGGER shardctl_fence BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON ${t} FOR EACH STATEMENT EXECUTE FUNCTION ${guard}(${lit(String(shard))}, ${lit(input.targetHost)}, ${lit(wave)});`,
    ),
    sql`COMMIT;`,
  ]);
}

/**
 * The wave's shards in fence transactions of at most `maxTables` tables each (at least one shard
 * each), in wave order.
 */
export function fenceGroups(
  shards: readonly number[],
  tableCount: (shard: number) => number,
  maxTables: number,
): number[][] {
  const groups: number[][] = [];
  let group: number[] = [];
  let count = 0;
  for (const shard of shards) {
    const n = tableCount(shard);
    if (group.length > 0 && count + n > maxTables) {
      groups.push(group);
      group = [];
      count = 0;
    }
    group.push(shard);
    count += n;
  }
  if (group.length > 0) groups.push(group);
  return groups;
}

/**
 * After every shard of a wave is fenced: the marker the target waits for (replicated after every
 * change committed before it), and the step `fenced` recorded with the move's `detail` (its marker
 * and fence start among them), in one transaction.
 */
export function fenceMarkerSql(moveId: string, marker: string, detail: Record<string, unknown>): Sql {
  return lines([
    sql`BEGIN;`,
    // Whatever the session's default: this commit's flush covers the fence groups' before it (fenceSql, flushedLater).
    sql`SET LOCAL synchronous_commit = on;`,
    insertMarkerSql(moveId, marker),
    recordFencedSql(moveId, detail),
    sql`COMMIT;`,
  ]);
}

/** The step `fenced` recorded for a move, with its `detail` merged in (one statement). */
export function recordFencedSql(moveId: string, detail: Record<string, unknown>): Sql {
  return sql`UPDATE ${CONTROL}.moves SET step = 'fenced', updated_at = now(), detail = detail || ${lit(JSON.stringify(detail))}::jsonb WHERE move_id = ${lit(moveId)};`;
}

/**
 * A whole wave's fence as one string, one round trip: each fence group's transaction (fenceSql, in
 * order, the first carrying the fence's start), then the marker with the step (fenceMarkerSql), then
 * the session's statement timeout for the cut-over (see underFence in fence-limit.ts). The server runs
 * them in order and stops at the first error: the groups before it stay fenced, the rest is not run.
 */
export function fenceWaveSql(input: {
  readonly groups: readonly FenceInput[];
  readonly marker: { readonly moveId: string; readonly kind: string; readonly detail: Record<string, unknown> };
  readonly statementTimeoutMs: number;
  /** What the cut-over reads once the wave is fenced, in the same round trip (fenceReadsSql). */
  readonly reads?: FenceReads;
}): Sql {
  return lines([
    // The marker's commit flushes the WAL of every group before it.
    ...input.groups.map((group) => fenceSql({ ...group, flushedLater: true })),
    fenceMarkerSql(input.marker.moveId, input.marker.kind, input.marker.detail),
    // Before the reads: a read that waits (behind a lock queued on a sequence) is bounded too.
    sql`${statementTimeoutSql(input.statementTimeoutMs)};`,
    ...(input.reads ? fenceReadsSql(input.reads) : []),
  ]);
}

/** What the source's fence string also reads once every shard of the wave is fenced (fenceWaveSql). */
export interface FenceReads {
  /**
   * The wave's sequences, to be carried: every writer that got past the fence has finished, so
   * every value the shard's rows hold was drawn before this read.
   */
  readonly sequences: readonly (readonly [string, string])[];
  /** Read with pg_get_sequence_data (PostgreSQL 18), else from each sequence. */
  readonly sequenceData: boolean;
  /** The wave's shards: the placement version the switch's source statement will start from (PLACEMENT_VERSION_FIELD). */
  readonly shards: readonly number[];
  /**
   * The name under which the source's session prepared the sequences' read before the fence
   * (prepareSequencesReadSql): run by name (and deallocated), its plan already made. Before
   * PostgreSQL 18 the read is one SELECT per sequence, whose parsing and planning for a whole wave
   * was the longest part of the fence's round trip while writes waited.
   */
  readonly prepared?: string;
}

/** The field of the placement version that fenceReadsSql returns. */
export const PLACEMENT_VERSION_FIELD = 'placement_version';

/**
 * The reads of fenceWaveSql: the sequences' states as readSequencesSql or READ_SEQUENCE_DATA_SQL
 * return them (none when there are none), and the version the source's placement copy of the
 * shards is at (switchPlacementSql starts from the greater of the two it reads here).
 */
export function fenceReadsSql(reads: FenceReads): Sql[] {
  const shards = reads.shards.map((shard) => int(shard, 'a shard number'));
  const sequences =
    reads.sequences.length === 0
      ? []
      : reads.prepared !== undefined
        ? [sql`EXECUTE ${ident(reads.prepared)};`, sql`DEALLOCATE ${ident(reads.prepared)};`]
        : [sql`${sequencesReadSql(reads)};`];
  return [
    ...sequences,
    sql`SELECT ${placementVersionSql(sql`shard IN (${shards.length > 0 ? list(shards) : sql`NULL`})`)}::text AS ${ident(PLACEMENT_VERSION_FIELD)};`,
  ];
}

/** The read of the sequences' states that fenceReadsSql makes (rows i, last_value, is_called, in order). */
function sequencesReadSql(reads: Pick<FenceReads, 'sequences' | 'sequenceData'>): Sql {
  return reads.sequenceData
    ? sequenceDataSql(
        sql`ARRAY[${list(reads.sequences.map(([schema, name]) => sql`${lit(qualified(schema, name))}::regclass`))}]`,
      )
    : readSequencesSql(reads.sequences);
}

/**
 * The sequences' read of a wave's fence prepared as `name` on the source's session while the wave
 * still takes writes, and run once there (its rows are the states then): the fence string runs it
 * again by name (FenceReads.prepared), with the plan this made. A statement without parameters
 * keeps its generic plan; only a change to one of the sequences (or a cache reset) makes the server
 * plan it again, as the fence would have without it.
 */
export function prepareSequencesReadSql(name: string, reads: Pick<FenceReads, 'sequences' | 'sequenceData'>): Sql {
  return sql`PREPARE ${ident(name)} AS ${sequencesReadSql(reads)};\nEXECUTE ${ident(name)};`;
}

/** A prepared statement of the session gone (the sequences' read of a fence that stopped before running it). */
export function deallocateSql(name: string): Sql {
  return sql`DEALLOCATE ${ident(name)}`;
}

/**
 * Undoes the fence: the fence triggers of `tables` (those that have one and do not call the move's
 * guard) disabled, the shard active again, this move's fence markers gone. Disabling takes the
 * lock CREATE TRIGGER takes (SHARE ROW EXCLUSIVE), which readers do not block; dropping would take
 * ACCESS EXCLUSIVE and wait for every reader of the table (dropFenceTriggersSql does that
 * afterwards, without waiting). Its lock waits are bounded like the fence's (see fenceSql); the
 * caller retries.
 */
export function unfenceSql(
  shard: number,
  tables: readonly (readonly [string, string])[],
  moveId: string,
  lockWaitMs = 500,
): Sql {
  return lines([
    sql`BEGIN;`,
    lockTimeoutSql(lockWaitMs),
    ...tables.map(([schema, table]) => sql`ALTER TABLE ${qualified(schema, table)} DISABLE TRIGGER shardctl_fence;`),
    sql`UPDATE ${CONTROL}.shards SET state = 'active' WHERE shard = ${int(shard, 'a shard number')} AND state = 'fenced';`,
    sql`DELETE FROM ${CONTROL}.move_markers WHERE move_id = ${lit(moveId)} AND kind LIKE 'fenced%';`,
    sql`COMMIT;`,
  ]);
}

/**
 * The disabled fence triggers of an unfenced shard dropped, each only if its table is free now
 * (lock_timeout 1 ms), so that no application statement queues behind the drop; one left behind is
 * disabled, and the next fence replaces it.
 */
export function dropFenceTriggerSql(schema: string, table: string): Sql {
  return dropTriggerIfFreeSql(schema, table, FENCE_TRIGGER);
}
