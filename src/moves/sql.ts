import { CONTROL, CONTROL_SCHEMA, MOVE_ABORTING_SQL } from '../fleet/control.js';
import { TRACKING_LOCK_SQL } from '../fleet/locks.js';
import { quoteIdent, quoteLiteral } from '../pg/quote.js';
import { loadSqlTemplate, renderSql } from '../pg/template.js';

/**
 * The SQL a move sends, one pure function or named constant per statement or transaction, so each
 * can be read and unit-tested as text. The steps decide when; these decide what. Elsewhere in
 * moves/ are only the catalog reads (catalog.ts) and transaction control (BEGIN, COMMIT, ROLLBACK,
 * SAVEPOINT) written where the transaction is.
 */

export function qualified(schema: string, table: string): string {
  return `${quoteIdent(schema)}.${quoteIdent(table)}`;
}

/** A table by schema and name (a ShardTable of catalog.ts, or anything with these two). */
export interface TableName {
  readonly schema: string;
  readonly table: string;
}

/** A table with its replica-identity key columns and their types (catalog.ts, KeyedTable). */
export interface KeyedTableName {
  readonly table: TableName;
  readonly columns: readonly string[];
  /** format_type() of each key column (built-in types only, see EXACT_KEY_TYPES in catalog.ts). */
  readonly types: readonly string[];
}

/** A trigger on a table, as catalog.ts reads it. */
export interface TriggerName {
  readonly schema: string;
  readonly table: string;
  readonly trigger: string;
}

/** SET LOCAL lock_timeout, in whole ms (at least 1: 0 would mean no limit). */
export function lockTimeoutSql(ms: number): string {
  return `SET LOCAL lock_timeout = '${Math.max(1, Math.round(ms))}ms';`;
}

/** The shard's tables (every schema of the shard) and this move's marker rows, replicated to the target. */
export function createPublicationSql(name: string, schemas: readonly string[], moveId: string): string {
  return (
    `CREATE PUBLICATION ${quoteIdent(name)} FOR TABLES IN SCHEMA ${schemas.map(quoteIdent).join(', ')},\n` +
    `  TABLE ${CONTROL}.move_markers WHERE (move_id = ${quoteLiteral(moveId)})`
  );
}

/**
 * Streams from the slot the copy step created, without copying again (the rows came from the slot's
 * snapshot). Binary only between equal major versions. `failover` (PostgreSQL 17 on both ends): the
 * slot is kept on standbys that sync slots (moves/failover.ts).
 */
export function createSubscriptionSql(
  name: string,
  sourceReplicationUrl: string,
  binary: boolean,
  enabled = true,
  failover = false,
): string {
  return (
    `CREATE SUBSCRIPTION ${quoteIdent(name)} CONNECTION ${quoteLiteral(sourceReplicationUrl)}\n` +
    `  PUBLICATION ${quoteIdent(name)}\n` +
    `  WITH (slot_name = ${quoteLiteral(name)}, create_slot = false, copy_data = false, binary = ${binary}${enabled ? '' : ', enabled = false'}${failover ? ', failover = true' : ''})`
  );
}

export function enableSubscriptionSql(name: string): string {
  return `ALTER SUBSCRIPTION ${quoteIdent(name)} ENABLE`;
}

/**
 * Half the server's deadlock_timeout, in ms (float8): the longest a lock of the move may wait on a
 * lock an application's transaction (or the move's own copy) could be waiting on in turn, so that
 * the move's wait runs out before either side's deadlock check cancels the other's statement.
 */
const HALF_DEADLOCK_TIMEOUT_MS = `(extract(epoch FROM current_setting('deadlock_timeout')::interval) * 500)::float8`;

/** A transaction's lock waits bounded by 50 ms, or half the deadlock timeout if that is shorter (see subscribeEarly). */
export const EARLY_SUBSCRIPTION_LOCK_WAIT_SQL = `SELECT set_config('lock_timeout', greatest(1, least(50, ${HALF_DEADLOCK_TIMEOUT_MS}::int)) || 'ms', true);`;

/** The replication connection's command: a logical slot whose snapshot the copy reads. */
export function createSlotCommand(name: string): string {
  return `CREATE_REPLICATION_SLOT ${quoteIdent(name)} LOGICAL pgoutput EXPORT_SNAPSHOT`;
}

export function dropSubscriptionSql(name: string, options: { ifExists?: boolean } = {}): string {
  return `DROP SUBSCRIPTION ${options.ifExists ? 'IF EXISTS ' : ''}${quoteIdent(name)}`;
}

/**
 * A disabled subscription with no slot: creating it makes the target open a replication connection
 * to the source, which is the point (preflight's "target reaches source").
 */
export function probeSubscriptionSql(name: string, sourceReplicationUrl: string): string {
  return (
    `CREATE SUBSCRIPTION ${quoteIdent(name)} CONNECTION ${quoteLiteral(sourceReplicationUrl)} PUBLICATION shardctl_probe
` + `  WITH (connect = true, enabled = false, create_slot = false, slot_name = NONE)`
  );
}

/** Detaches a subscription from its slot, for when the source cannot be reached to drop the slot. */
export function detachSubscriptionSql(name: string): string {
  return `ALTER SUBSCRIPTION ${quoteIdent(name)} DISABLE;\nALTER SUBSCRIPTION ${quoteIdent(name)} SET (slot_name = NONE)`;
}

export function dropPublicationSql(name: string): string {
  return `DROP PUBLICATION IF EXISTS ${quoteIdent(name)}`;
}

export function insertMarkerSql(moveId: string, kind: string): string {
  return `INSERT INTO ${CONTROL}.move_markers (move_id, kind) VALUES (${quoteLiteral(moveId)}, ${quoteLiteral(kind)}) ON CONFLICT DO NOTHING;`;
}

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
 * The guard function of a move's prepared fence triggers (fenceGuardSql), in the control schema,
 * named like its replication objects (dropUnusedFenceGuardsSql removes it once unused).
 */
export function fenceGuardName(moveId: string): string {
  return `${CONTROL}.${quoteIdent(replicationName(moveId))}`;
}

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
export function fenceGuardSql(moveId: string, closedUpTo: number): string {
  if (!Number.isInteger(closedUpTo) || closedUpTo < -1) throw new Error(`fenceGuardSql: not a wave: ${closedUpTo}`);
  return [
    `CREATE OR REPLACE FUNCTION ${fenceGuardName(moveId)}() RETURNS trigger`,
    'LANGUAGE plpgsql AS $guard$',
    'BEGIN',
    `  IF TG_ARGV[2]::int <= ${closedUpTo} THEN`,
    "    RAISE EXCEPTION 'shard % has moved to host %; writes to this copy are refused', TG_ARGV[0], TG_ARGV[1]",
    "      USING ERRCODE = 'SC100',",
    "            DETAIL = format('shardctl-moved shard=%s host=%s', TG_ARGV[0], TG_ARGV[1]),",
    "            HINT = 'Reload the shard map and retry on the new host.';",
    '  END IF;',
    '  RETURN NULL;',
    'END',
    '$guard$;',
  ].join('\n');
}

/** The names of the running moves' objects (replicationName): their publication, slot, subscription, fence guard. */
const RUNNING_MOVE_NAMES_SQL = `SELECT 'shardctl_move_' || move_id FROM ${CONTROL}.moves WHERE status = 'running'`;

/**
 * The fence guards (fenceGuardSql) and change-log functions (deltaFunctionName) that no trigger
 * calls any more, dropped: those of moves whose old copies are gone (gc, --drop-source), or whose
 * fence was undone. `moveId`: that move's only; else every one but a running move's guard (its
 * next wave creates it again, and its log function with its logs).
 */
export function dropUnusedFenceGuardsSql(
  which: { readonly moveId: string } | { readonly movesRecorded: boolean },
): string {
  const names =
    'moveId' in which
      ? `(p.proname = ${quoteLiteral(replicationName(which.moveId))} OR left(p.proname, ${deltaFunctionPrefix(which.moveId).length}) = ${quoteLiteral(deltaFunctionPrefix(which.moveId))})`
      : `p.proname LIKE 'shardctl\\_move\\_%'` +
        (which.movesRecorded ? ` AND p.proname NOT IN (${RUNNING_MOVE_NAMES_SQL})` : '');
  return [
    'DO $guards$',
    'DECLARE f regprocedure;',
    'BEGIN',
    '  FOR f IN SELECT p.oid::regprocedure FROM pg_catalog.pg_proc p',
    `            WHERE p.pronamespace = pg_catalog.to_regnamespace(${quoteLiteral(CONTROL)}) AND ${names}`,
    '              AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_trigger t WHERE t.tgfoid = p.oid) LOOP',
    "    EXECUTE pg_catalog.format('DROP FUNCTION %s', f);",
    '  END LOOP;',
    'END',
    '$guards$',
  ].join('\n');
}

/**
 * The triggers of moves (the fence's, the change logs', the target's tracking) that are left on
 * tables of shards active on this host and in no running move this host records, each kept by a
 * table that was busy at every removal: a fence trigger that is disabled or calls a move's guard,
 * a change-log or tracking trigger (calling a function of the control schema: a finished move's
 * log function does nothing). An enabled trigger calling shard_fenced refuses writes, and is not
 * one of these. A partition's copy of its parent's trigger goes with the parent's, and is not
 * listed. Rows: shard, schema, table, trigger.
 */
export function leftTriggersSql(movesRecorded: boolean): string {
  const names = [FENCE_TRIGGER, ...DELTA_TRIGGERS, ...TRACK_TRIGGERS].map(quoteLiteral).join(', ');
  return `SELECT s.shard, n.nspname AS schema, c.relname AS table, t.tgname AS trigger
       FROM pg_catalog.pg_trigger t
       JOIN pg_catalog.pg_class c ON c.oid = t.tgrelid
       JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
       JOIN pg_catalog.pg_proc p ON p.oid = t.tgfoid
       JOIN ${CONTROL}.shards s ON s.schema_name = n.nspname AND s.state = 'active'
      WHERE t.tgname IN (${names})
        AND p.pronamespace = pg_catalog.to_regnamespace(${quoteLiteral(CONTROL)})
        AND NOT (p.proname = 'shard_fenced' AND t.tgenabled <> 'D')
        AND t.tgparentid = 0${
          movesRecorded
            ? `
        AND NOT EXISTS (SELECT 1 FROM ${CONTROL}.moves m WHERE m.status = 'running' AND s.shard = ANY(coalesce(m.shards, ARRAY[m.shard])))`
            : ''
        }
      ORDER BY 2, 3, 4`;
}

/**
 * The fence of a few shards, in one transaction: their tables locked in SHARE ROW EXCLUSIVE mode
 * (waits for in-flight writers), a statement trigger on every table that refuses every write with
 * SQLSTATE SC100 naming the table's shard, and the shards marked fenced. The caller keeps the
 * number of tables of one transaction bounded (fenceGroups), so a wave of any size needs no more
 * lock slots than a few shards.
 *
 * Why it cannot deadlock an application: the LOCK statement may wait only `lockWaitMs` in all
 * (lock_timeout and statement_timeout), which is below the server's deadlock_timeout. An
 * application transaction waiting for a table the fence already holds started waiting after the
 * fence took it, so it has waited less than lockWaitMs when the fence gives up and rolls back:
 * neither side reaches the deadlock check, nobody is aborted, and the move retries the fence.
 */
export function fenceSql(input: FenceInput): string {
  const tables = input.shards.flatMap(({ tables }) => tables.map(([schema, table]) => qualified(schema, table)));
  const triggers = input.shards.flatMap(({ shard, tables: own, prepared }) =>
    own.flatMap(([schema, table]) => {
      const t = qualified(schema, table);
      if (prepared) return [];
      return input.createOrReplaceTrigger
        ? // ENABLE: an unfence leaves the trigger disabled when it cannot drop it (see unfenceSql).
          `${fenceTriggerSql(shard, t, input.targetHost)}\nALTER TABLE ${t} ENABLE TRIGGER shardctl_fence;`
        : // Before PostgreSQL 14: drop and create (a stronger lock, held for the few ms of this transaction).
          `DROP TRIGGER IF EXISTS shardctl_fence ON ${t};\n${fenceTriggerSql(shard, t, input.targetHost).replace('CREATE OR REPLACE', 'CREATE')}`;
    }),
  );
  const shards = input.shards.map(({ shard }) => {
    if (!Number.isInteger(shard) || shard < 0) throw new Error(`fenceSql: not a shard number: ${shard}`);
    return String(shard);
  });
  return [
    'BEGIN;',
    ...(input.flushedLater ? ['SET LOCAL synchronous_commit = off;'] : []),
    ...lockTablesSql(tables, input.lockWaitMs),
    ...(input.closeGuard ? [fenceGuardSql(input.closeGuard.moveId, input.closeGuard.wave)] : []),
    ...triggers,
    `UPDATE ${CONTROL}.shards SET state = 'fenced' WHERE shard IN (${shards.join(', ')});`,
    ...(input.fenceStart
      ? [
          `UPDATE ${CONTROL}.moves SET detail = detail || ${quoteLiteral(JSON.stringify({ fenceStartedAtMs: Math.round(input.fenceStart.atMs) }))}::jsonb ` +
            `WHERE move_id = ${quoteLiteral(input.fenceStart.moveId)};`,
        ]
      : []),
    ...(input.reportEmpty && input.reportEmpty.length > 0 ? [reportEmptySql(input.reportEmpty)] : []),
    'COMMIT;',
  ].join('\n');
}

/** Rows (oid, empty) for these relations: whether each has no page (pg_relation_size 0). */
function reportEmptySql(oids: readonly number[]): string {
  for (const oid of oids) if (!Number.isInteger(oid) || oid <= 0) throw new Error(`reportEmptySql: not an OID: ${oid}`);
  return `SELECT o AS oid, pg_relation_size(o) = 0 AS empty FROM unnest('{${oids.join(',')}}'::oid[]) AS o;`;
}

/**
 * The first statements of a fence transaction (and of its preparation): every table locked in SHARE
 * ROW EXCLUSIVE mode by one LOCK whose wait is bounded in all by `lockWaitMs` (see fenceSql); none
 * when there is no table.
 */
function lockTablesSql(tables: readonly string[], lockWaitMs: number): string[] {
  if (tables.length === 0) return [];
  const wait = `'${Math.max(1, Math.round(lockWaitMs))}ms'`;
  return [
    `SET LOCAL lock_timeout = ${wait};`,
    `SET LOCAL statement_timeout = ${wait};`,
    `LOCK TABLE ${tables.join(', ')} IN SHARE ROW EXCLUSIVE MODE;`,
    'SET LOCAL statement_timeout TO DEFAULT;',
  ];
}

/** The fence trigger of one table (`t` quoted): every write refused with SC100, naming the shard and its new host. */
function fenceTriggerSql(shard: number, t: string, targetHost: string): string {
  const fn = `${CONTROL}.shard_fenced(${quoteLiteral(String(shard))}, ${quoteLiteral(targetHost)})`;
  return `CREATE OR REPLACE TRIGGER shardctl_fence BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON ${t} FOR EACH STATEMENT EXECUTE FUNCTION ${fn};`;
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
): string {
  if (!Number.isInteger(input.wave) || input.wave < 0) throw new Error(`prepareFenceSql: not a wave: ${input.wave}`);
  const tables = input.shards.flatMap(({ shard, tables }) =>
    tables.map(([schema, table]) => ({ shard, t: qualified(schema, table) })),
  );
  const guard = fenceGuardName(input.moveId);
  return [
    'BEGIN;',
    ...lockTablesSql(
      tables.map(({ t }) => t),
      input.lockWaitMs,
    ),
    fenceGuardSql(input.moveId, input.wave - 1),
    ...tables.map(
      ({ shard, t }) =>
        `CREATE OR REPLACE TRIGGER shardctl_fence BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON ${t} FOR EACH STATEMENT ` +
        // Enabled, also where an unfence left the trigger disabled: CREATE OR REPLACE sets it enabled.
        `EXECUTE FUNCTION ${guard}(${quoteLiteral(String(shard))}, ${quoteLiteral(input.targetHost)}, ${quoteLiteral(String(input.wave))});`,
    ),
    'COMMIT;',
  ].join('\n');
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
export function fenceMarkerSql(moveId: string, marker: string, detail: Record<string, unknown>): string {
  return [
    'BEGIN;',
    // Whatever the session's default: this commit's flush covers the fence groups' before it (fenceSql, flushedLater).
    'SET LOCAL synchronous_commit = on;',
    insertMarkerSql(moveId, marker),
    recordFencedSql(moveId, detail),
    'COMMIT;',
  ].join('\n');
}

/** The step `fenced` recorded for a move, with its `detail` merged in (one statement). */
export function recordFencedSql(moveId: string, detail: Record<string, unknown>): string {
  return `UPDATE ${CONTROL}.moves SET step = 'fenced', updated_at = now(), detail = detail || ${quoteLiteral(JSON.stringify(detail))}::jsonb WHERE move_id = ${quoteLiteral(moveId)};`;
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
}): string {
  return [
    // The marker's commit flushes the WAL of every group before it.
    ...input.groups.map((group) => fenceSql({ ...group, flushedLater: true })),
    fenceMarkerSql(input.marker.moveId, input.marker.kind, input.marker.detail),
    // Before the reads: a read that waits (behind a lock queued on a sequence) is bounded too.
    `${statementTimeoutSql(input.statementTimeoutMs)};`,
    ...(input.reads ? fenceReadsSql(input.reads) : []),
  ].join('\n');
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
}

/** The field of the placement version that fenceReadsSql returns. */
export const PLACEMENT_VERSION_FIELD = 'placement_version';

/**
 * The reads of fenceWaveSql: the sequences' states as readSequencesSql or READ_SEQUENCE_DATA_SQL
 * return them (none when there are none), and the version the source's placement copy of the
 * shards is at (switchPlacementSql starts from the greater of the two it reads here).
 */
export function fenceReadsSql(reads: FenceReads): string[] {
  const shards = reads.shards.map((shard) => {
    if (!Number.isInteger(shard) || shard < 0) throw new Error(`fenceReadsSql: not a shard number: ${shard}`);
    return shard;
  });
  const sequences =
    reads.sequences.length === 0
      ? []
      : [
          reads.sequenceData
            ? `${sequenceDataSql(`ARRAY[${reads.sequences.map(([schema, name]) => `${quoteLiteral(qualified(schema, name))}::regclass`).join(', ')}]`)};`
            : `${readSequencesSql(reads.sequences)};`,
        ];
  return [
    ...sequences,
    `SELECT greatest(coalesce((SELECT placement_version FROM ${CONTROL}.fleet), 0), coalesce((SELECT max(version) FROM ${CONTROL}.placement WHERE shard IN (${shards.join(', ') || 'NULL'})), 0))::text AS ${PLACEMENT_VERSION_FIELD};`,
  ];
}

/** The trigger of the fence (fenceSql) on every table of a fenced shard. */
export const FENCE_TRIGGER = 'shardctl_fence';

/** The triggers of a move's change logs (src/moves/tail.ts), on a table without a usable key. */
export const DELTA_TRIGGERS = ['shardctl_delta', 'shardctl_delta_truncate'] as const;

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
): string {
  const wait = `'${Math.max(1, Math.round(lockWaitMs))}ms'`;
  return [
    'BEGIN;',
    `SET LOCAL lock_timeout = ${wait};`,
    ...tables.map(([schema, table]) => `ALTER TABLE ${qualified(schema, table)} DISABLE TRIGGER shardctl_fence;`),
    `UPDATE ${CONTROL}.shards SET state = 'active' WHERE shard = ${shard} AND state = 'fenced';`,
    `DELETE FROM ${CONTROL}.move_markers WHERE move_id = ${quoteLiteral(moveId)} AND kind LIKE 'fenced%';`,
    'COMMIT;',
  ].join('\n');
}

/**
 * The disabled fence triggers of an unfenced shard dropped, each only if its table is free now
 * (lock_timeout 1 ms), so that no application statement queues behind the drop; one left behind is
 * disabled, and the next fence replaces it.
 */
export function dropFenceTriggerSql(schema: string, table: string): string {
  return dropTriggerIfFreeSql(schema, table, FENCE_TRIGGER);
}

/** A trigger dropped only if its table is free now (lock_timeout 1 ms): no statement queues behind the drop. */
export function dropTriggerIfFreeSql(schema: string, table: string, trigger: string): string {
  return `BEGIN;\nSET LOCAL lock_timeout = '1ms';\nDROP TRIGGER IF EXISTS ${quoteIdent(trigger)} ON ${qualified(schema, table)};\nCOMMIT;`;
}

/** A trigger disabled only if no writer holds its table now (lock_timeout 1 ms; readers do not block it). */
export function disableTriggerIfFreeSql(schema: string, table: string, trigger: string): string {
  return `BEGIN;\nSET LOCAL lock_timeout = '1ms';\nALTER TABLE ${qualified(schema, table)} DISABLE TRIGGER ${quoteIdent(trigger)};\nCOMMIT;`;
}

/** A sequence's state, as read from the sequence itself (pg_sequences hides a setval(..., false)). */
export function readSequencesSql(sequences: readonly (readonly [string, string])[]): string {
  return sequences
    .map(
      ([schema, name], i) =>
        `SELECT ${i} AS i, last_value::text AS last_value, is_called FROM ${qualified(schema, name)}`,
    )
    .join('\nUNION ALL ')
    .concat('\nORDER BY 1');
}

/**
 * The state of the sequences $1 (regclass[]), in order, from PostgreSQL 18 (pg_get_sequence_data):
 * one statement whatever their number, where readSequencesSql parses one SELECT per sequence.
 */
export const READ_SEQUENCE_DATA_SQL = sequenceDataSql('$1::regclass[]');

/** READ_SEQUENCE_DATA_SQL of the sequences an array expression of regclass gives. */
function sequenceDataSql(regclasses: string): string {
  return `SELECT s.i::int - 1 AS i, d.last_value::text AS last_value, d.is_called
       FROM unnest(${regclasses}) WITH ORDINALITY AS s(seq, i), pg_get_sequence_data(s.seq) AS d ORDER BY s.i`;
}

export interface SequenceValue {
  readonly schema: string;
  readonly name: string;
  readonly lastValue: bigint;
  readonly isCalled: boolean;
}

/** setval() for each sequence, in one statement. */
export function setSequencesSql(values: readonly SequenceValue[]): string {
  return `SELECT ${values
    .map(
      (v) =>
        `setval(${quoteLiteral(`${quoteIdent(v.schema)}.${quoteIdent(v.name)}`)}::regclass, ${v.lastValue}, ${v.isCalled})`,
    )
    .join(',\n       ')}`;
}

export function refreshMaterializedViewSql(schema: string, view: string): string {
  return `REFRESH MATERIALIZED VIEW ${qualified(schema, view)}`;
}

/** Recorded before the probe subscription is created, so a kill in between leaves a recorded leftover. */
export function recordObjectSql(name: string, kind: 'probe-subscription'): string {
  return `INSERT INTO ${CONTROL}.objects (name, kind) VALUES (${quoteLiteral(name)}, ${quoteLiteral(kind)}) ON CONFLICT DO NOTHING`;
}

export function forgetObjectSql(name: string): string {
  return `DELETE FROM ${CONTROL}.objects WHERE name = ${quoteLiteral(name)}`;
}

export interface Grant {
  /** The table, for a table grant. */
  readonly relname?: string;
  /** Null: PUBLIC. */
  readonly grantee: string | null;
  readonly privilege: string;
}

export interface RenameWithStubInput {
  readonly shard: number;
  readonly schema: string;
  readonly renamed: string;
  readonly targetHost: string;
  /** Every table of the shard including partitions. */
  readonly tables: readonly string[];
  readonly schemaGrants: readonly Grant[];
  readonly tableGrants: readonly Grant[];
}

/**
 * The old copy renamed, and under the old name a view per table over the renamed copy, with the
 * old schema's and tables' grants: a client still on the old map gets SC100 for reads (the
 * shard_moved guard) and writes (writes through a simple view hit the base table's fence), not
 * "does not exist" or "permission denied", and reloads its map.
 */
export function renameWithStubSql(input: RenameWithStubInput): string {
  const { shard, schema, renamed, targetHost } = input;
  const to = (grantee: string | null): string => (grantee === null ? 'PUBLIC' : quoteIdent(grantee));
  const guard = `${CONTROL}.shard_moved(${quoteLiteral(String(shard))}, ${quoteLiteral(targetHost)})`;
  return [
    'BEGIN;',
    `ALTER SCHEMA ${quoteIdent(schema)} RENAME TO ${quoteIdent(renamed)};`,
    `CREATE SCHEMA ${quoteIdent(schema)};`,
    `COMMENT ON SCHEMA ${quoteIdent(schema)} IS ${quoteLiteral(`shardctl: shard ${shard} moved to ${targetHost}; views over the fenced old copy ${renamed} until shardctl gc`)};`,
    ...input.tables.map(
      (t) => `CREATE VIEW ${qualified(schema, t)} AS SELECT * FROM ${qualified(renamed, t)} WHERE ${guard};`,
    ),
    ...input.schemaGrants
      .filter((g) => g.privilege === 'USAGE')
      .map((g) => `GRANT USAGE ON SCHEMA ${quoteIdent(schema)} TO ${to(g.grantee)};`),
    ...input.tableGrants
      .filter((g) => g.relname !== undefined && ['SELECT', 'INSERT', 'UPDATE', 'DELETE'].includes(g.privilege))
      .map((g) => `GRANT ${g.privilege} ON ${qualified(schema, g.relname!)} TO ${to(g.grantee)};`),
    `UPDATE ${CONTROL}.shards SET schema_name = ${quoteLiteral(renamed)} WHERE shard = ${shard};`,
    'COMMIT;',
  ].join('\n');
}

/** The name the old copy gets after a move (PostgreSQL truncates identifiers at 63 bytes). */
export function oldCopyName(schema: string, moveId: string): string {
  return `${schema}_moved_${moveId}`.slice(0, 63);
}

/** Names of the replication objects of a move: publication, subscription and slot share it. */
export function replicationName(moveId: string): string {
  return `shardctl_move_${moveId}`;
}

/** One entry of an ACL, by role name. */
export interface AclEntry {
  /** Null: PUBLIC. */
  readonly grantee: string | null;
  readonly grantor: string;
  readonly privilege: string;
  readonly grantable: boolean;
}

export type PrivilegeKind =
  | 'schema'
  | 'type'
  | 'table'
  | 'foreign table'
  | 'sequence'
  | 'view'
  | 'materialized view'
  | 'routine'
  | 'column'
  | 'default';

/**
 * An object of a shard schema with its owner and ACL, as read by shardPrivileges (verify.ts), or a
 * pg_default_acl row of the schema ('default': `name` is the object type letter, `owner` the role
 * whose new objects it applies to).
 */
export interface PrivilegeObject {
  readonly kind: PrivilegeKind;
  readonly schema: string;
  /** The relation or routine; a column's table; null for the schema. */
  readonly name: string | null;
  /** A routine's identity arguments (pg_get_function_identity_arguments). */
  readonly args: string | null;
  readonly column: string | null;
  /** Null for a column. */
  readonly owner: string | null;
  /** A sequence owned by a table column: its owner follows the table's and cannot be set alone. */
  readonly linked: boolean;
  /** The effective ACL (the default one where the catalog holds none). */
  readonly acl: readonly AclEntry[];
}

const PRIVILEGES = new Set([
  'SELECT',
  'INSERT',
  'UPDATE',
  'DELETE',
  'TRUNCATE',
  'REFERENCES',
  'TRIGGER',
  'EXECUTE',
  'USAGE',
  'CREATE',
  'MAINTAIN',
]);
const DEFAULT_OBJECT_TYPES: Record<string, string> = { r: 'TABLES', S: 'SEQUENCES', f: 'FUNCTIONS', T: 'TYPES' };
const KIND_ORDER: readonly PrivilegeKind[] = [
  'schema',
  'type',
  'table',
  'foreign table',
  'sequence',
  'view',
  'materialized view',
  'routine',
  'column',
  'default',
];

/** Privileges that exist on only one side of a move (by server version), which syncPrivilegesSql leaves alone. */
export interface PrivilegeVersions {
  readonly sourceOnly: ReadonlySet<string>;
  readonly targetOnly: ReadonlySet<string>;
}

/** MAINTAIN exists from PostgreSQL 17 (and is in the owner's default ACL there). */
export function privilegeVersions(sourceVersionNum: number, targetVersionNum: number): PrivilegeVersions {
  const maintain = (v: number): boolean => v >= 170000;
  return {
    sourceOnly: new Set(maintain(sourceVersionNum) && !maintain(targetVersionNum) ? ['MAINTAIN'] : []),
    targetOnly: new Set(maintain(targetVersionNum) && !maintain(sourceVersionNum) ? ['MAINTAIN'] : []),
  };
}

/** The roles a shard's objects name: owners, grantees, grantors, roles with default privileges. */
export function rolesNamed(objects: readonly PrivilegeObject[]): { all: string[]; owners: string[] } {
  const all = new Set<string>();
  const owners = new Set<string>();
  for (const o of objects) {
    if (o.owner !== null) {
      all.add(o.owner);
      owners.add(o.owner);
    }
    for (const a of o.acl) {
      if (a.grantee !== null) all.add(a.grantee);
      all.add(a.grantor);
    }
  }
  return { all: [...all].sort(), owners: [...owners].sort() };
}

/**
 * The statements that give the target's copy of one shard schema the source's owners, ACLs and
 * default privileges, computed from both catalogs (nothing for what is already equal). An object
 * whose ACL differs has every privilege revoked (from every role the target's ACL names, and
 * PUBLIC) and the source's granted again, so privileges a migration granted and the source revoked
 * by hand are gone too. Grants are made by the owner (as the server records a superuser's or a
 * member's grant), so an entry the source got from another grantor comes back granted by the owner.
 * Objects the source has and the target lacks are not the migrations' and are left alone.
 */
export function syncPrivilegesSql(
  source: readonly PrivilegeObject[],
  target: readonly PrivilegeObject[],
  versions: PrivilegeVersions = { sourceOnly: new Set(), targetOnly: new Set() },
): string[] {
  // A privilege only one side's server has: the target keeps its own entries of one only it has
  // (MAINTAIN moving from 16 to 17: the owner keeps it), and is not given one it lacks.
  const wantedFrom = (s: readonly AclEntry[], current: readonly AclEntry[]): AclEntry[] => [
    ...s.filter((e) => !versions.sourceOnly.has(e.privilege)),
    ...current.filter((e) => versions.targetOnly.has(e.privilege)),
  ];
  const onTarget = new Map(target.map((o) => [privilegeKey(o), o]));
  const ordered = [...source].sort((a, b) => KIND_ORDER.indexOf(a.kind) - KIND_ORDER.indexOf(b.kind));
  const statements: string[] = [];
  const revokedTables = new Set<string>();
  for (const s of ordered) {
    if (s.kind === 'default') continue;
    // A column without an ACL of its own is not read: on the target that is an empty one.
    const t = onTarget.get(privilegeKey(s)) ?? (s.kind === 'column' ? { ...s, acl: [] } : undefined);
    if (!t) continue;
    let current = t.acl;
    if (s.owner !== null && t.owner !== null && s.owner !== t.owner) {
      if (!s.linked)
        statements.push(`ALTER ${ALTER_KEYWORD[s.kind]} ${objectName(s)} OWNER TO ${quoteIdent(s.owner)};`);
      // ALTER … OWNER TO moves the old owner's entries to the new owner, as grantee and as grantor.
      const from = t.owner;
      const to = s.owner;
      current = current.map((a) => ({
        ...a,
        grantee: a.grantee === from ? to : a.grantee,
        grantor: a.grantor === from ? to : a.grantor,
      }));
    }
    const tableRevoked = s.kind === 'column' && revokedTables.has(qualified(s.schema, s.name!));
    const wanted = wantedFrom(s.acl, current);
    if (!sameAcl(wanted, current) || (tableRevoked && wanted.length > 0)) {
      statements.push(
        ...replaceAclSql(GRANT_TARGET[s.kind](s), current, wanted, s.kind === 'column' ? s.column : null),
      );
      if (s.kind === 'table' || s.kind === 'foreign table' || s.kind === 'view' || s.kind === 'materialized view')
        revokedTables.add(qualified(s.schema, s.name!));
    }
  }
  // Column privileges the target has and the source does not (a migration's, revoked by hand).
  const onSource = new Set(source.map(privilegeKey));
  for (const t of target) {
    if (t.kind === 'column' && t.acl.length > 0 && !onSource.has(privilegeKey(t)))
      statements.push(...replaceAclSql(GRANT_TARGET.column(t), t.acl, [], t.column));
  }
  // Default privileges: every (role, object type) either side has.
  const defaults = new Map<string, { s?: PrivilegeObject; t?: PrivilegeObject }>();
  for (const [side, list] of [
    ['s', source],
    ['t', target],
  ] as const) {
    for (const o of list) {
      if (o.kind !== 'default') continue;
      const key = privilegeKey(o);
      defaults.set(key, { ...defaults.get(key), [side]: o });
    }
  }
  for (const { s, t } of [...defaults.values()].sort((a, b) =>
    privilegeKey((a.s ?? a.t)!).localeCompare(privilegeKey((b.s ?? b.t)!)),
  )) {
    const o = (s ?? t)!;
    const wanted = wantedFrom(s?.acl ?? [], t?.acl ?? []);
    if (sameAcl(wanted, t?.acl ?? [])) continue;
    statements.push(...alterDefaultPrivilegesSql(o.schema, o.owner!, o.name!, t?.acl ?? [], wanted));
  }
  return statements;
}

function privilegeKey(o: PrivilegeObject): string {
  return JSON.stringify([o.kind, o.schema, o.name, o.args, o.column, o.kind === 'default' ? o.owner : null]);
}

function sameAcl(a: readonly AclEntry[], b: readonly AclEntry[]): boolean {
  const text = (acl: readonly AclEntry[]): string =>
    JSON.stringify(
      [...new Set(acl.map((e) => JSON.stringify([e.grantee, e.grantor, e.privilege, e.grantable])))].sort(),
    );
  return text(a) === text(b);
}

function objectName(o: PrivilegeObject): string {
  if (o.kind === 'schema') return quoteIdent(o.schema);
  // Identity arguments are the server's own rendering of the signature (names and types), as pg_get_indexdef is of an index.
  if (o.kind === 'routine') return `${qualified(o.schema, o.name!)}(${o.args ?? ''})`;
  return qualified(o.schema, o.name!);
}

const ALTER_KEYWORD: Record<PrivilegeKind, string> = {
  schema: 'SCHEMA',
  type: 'TYPE',
  table: 'TABLE',
  'foreign table': 'FOREIGN TABLE',
  sequence: 'SEQUENCE',
  view: 'VIEW',
  'materialized view': 'MATERIALIZED VIEW',
  routine: 'ROUTINE',
  column: 'TABLE',
  default: '',
};

const GRANT_TARGET: Record<PrivilegeKind, (o: PrivilegeObject) => string> = {
  schema: (o) => `SCHEMA ${objectName(o)}`,
  type: (o) => `TYPE ${objectName(o)}`,
  table: (o) => `TABLE ${objectName(o)}`,
  'foreign table': (o) => `TABLE ${objectName(o)}`,
  sequence: (o) => `SEQUENCE ${objectName(o)}`,
  view: (o) => `TABLE ${objectName(o)}`,
  'materialized view': (o) => `TABLE ${objectName(o)}`,
  routine: (o) => `ROUTINE ${objectName(o)}`,
  column: (o) => `TABLE ${objectName(o)}`,
  default: () => '',
};

function grantee(name: string | null): string {
  return name === null ? 'PUBLIC' : quoteIdent(name);
}

function privilegeList(entries: readonly AclEntry[], column: string | null): string {
  const names = [...new Set(entries.map((e) => e.privilege))].sort();
  for (const p of names) if (!PRIVILEGES.has(p)) throw new Error(`unknown privilege ${JSON.stringify(p)}`);
  return names.map((p) => (column === null ? p : `${p} (${quoteIdent(column)})`)).join(', ');
}

/** Grants grouped by grantee and grant option: GRANT a, b ON … TO r [WITH GRANT OPTION]. */
function grantGroups(acl: readonly AclEntry[]): { grantee: string | null; grantable: boolean; entries: AclEntry[] }[] {
  const groups = new Map<string, { grantee: string | null; grantable: boolean; entries: AclEntry[] }>();
  for (const e of acl) {
    const key = JSON.stringify([e.grantee, e.grantable]);
    if (!groups.has(key)) groups.set(key, { grantee: e.grantee, grantable: e.grantable, entries: [] });
    groups.get(key)!.entries.push(e);
  }
  return [...groups.values()].sort((a, b) =>
    JSON.stringify([a.grantee, a.grantable]).localeCompare(JSON.stringify([b.grantee, b.grantable])),
  );
}

function revokedFrom(current: readonly AclEntry[]): string {
  const names = [...new Set(current.map((e) => e.grantee).filter((g): g is string => g !== null))].sort();
  return ['PUBLIC', ...names.map(quoteIdent)].join(', ');
}

/** REVOKE ALL from every role the target's ACL names and PUBLIC, then the source's grants (column ones when `column`). */
export function replaceAclSql(
  on: string,
  current: readonly AclEntry[],
  wanted: readonly AclEntry[],
  column: string | null = null,
): string[] {
  const all = column === null ? 'ALL' : `ALL (${quoteIdent(column)})`;
  return [
    `REVOKE ${all} ON ${on} FROM ${revokedFrom(current)} CASCADE;`,
    ...grantGroups(wanted).map(
      (g) =>
        `GRANT ${privilegeList(g.entries, column)} ON ${on} TO ${grantee(g.grantee)}${g.grantable ? ' WITH GRANT OPTION' : ''};`,
    ),
  ];
}

/** One pg_default_acl row of a schema made equal to the source's: everything revoked, then granted again. */
export function alterDefaultPrivilegesSql(
  schema: string,
  role: string,
  objectType: string,
  current: readonly AclEntry[],
  wanted: readonly AclEntry[],
): string[] {
  const on = DEFAULT_OBJECT_TYPES[objectType];
  if (on === undefined) throw new Error(`unknown default privilege object type ${JSON.stringify(objectType)}`);
  const prefix = `ALTER DEFAULT PRIVILEGES FOR ROLE ${quoteIdent(role)} IN SCHEMA ${quoteIdent(schema)}`;
  return [
    `${prefix} REVOKE ALL ON ${on} FROM ${revokedFrom(current)} CASCADE;`,
    ...grantGroups(wanted).map(
      (g) =>
        `${prefix} GRANT ${privilegeList(g.entries, null)} ON ${on} TO ${grantee(g.grantee)}${g.grantable ? ' WITH GRANT OPTION' : ''};`,
    ),
  ];
}

// The statements of the steps that read and record, each named for what it asks.

/** The migration versions applied to shards $1, in order. */
export const APPLIED_VERSIONS_SQL = `SELECT shard, version FROM ${CONTROL}.migrations WHERE shard = ANY($1) ORDER BY version`;

/** The transactions holding a transaction id on the server (any database) but backend $1, oldest first. */
export const XID_HOLDERS_SQL = `SELECT pid, datname, application_name, extract(epoch FROM now() - xact_start)::int AS age, left(query, 80) AS query
       FROM pg_stat_activity
      WHERE (backend_xid IS NOT NULL OR backend_xmin IS NOT NULL) AND pid <> pg_backend_pid() AND pid <> $1 AND backend_type = 'client backend'
      ORDER BY xact_start LIMIT 3`;

/** Which of shards $1 are fenced on this host. */
export const FENCED_SHARDS_SQL = `SELECT shard FROM ${CONTROL}.shards WHERE shard = ANY($1) AND state = 'fenced'`;

/**
 * What bounds the fence's locks on the source: half its deadlock_timeout in ms, and the lock slots
 * one transaction can count on (the shared lock table holds max_locks_per_transaction per connection).
 */
export const LOCK_LIMITS_SQL = `SELECT ${HALF_DEADLOCK_TIMEOUT_MS} AS half_deadlock_ms, current_setting('max_locks_per_transaction')::int AS max_locks`;

/** Who holds locks on the relations of schemas $1: the first three sessions, each named by a table or sequence it holds when it holds one (not one of their indexes). */
export const LOCK_HOLDERS_SQL = `SELECT DISTINCT ON (a.pid) a.pid, a.application_name, extract(epoch FROM now() - a.xact_start)::int AS age, c.relname, left(a.query, 80) AS query
       FROM pg_locks l JOIN pg_class c ON c.oid = l.relation JOIN pg_stat_activity a ON a.pid = l.pid
      WHERE c.relnamespace IN (SELECT to_regnamespace(s) FROM unnest($1::text[]) AS s) AND l.granted AND l.pid <> pg_backend_pid()
      ORDER BY a.pid, c.relkind NOT IN ('r', 'p', 'S', 'v', 'm', 'f'), c.relname LIMIT 3`;

/** Which of shards $1 are active on this host. */
export const ACTIVE_SHARDS_SQL = `SELECT shard FROM ${CONTROL}.shards WHERE shard = ANY($1) AND state = 'active'`;

/** The probe subscriptions recorded on this host. */
export const PROBE_SUBSCRIPTIONS_SQL = `SELECT name FROM ${CONTROL}.objects WHERE kind = 'probe-subscription' ORDER BY name`;

/** The walsender holding slot $1 (a row only while the slot exists). */
export const SLOT_ACTIVE_PID_SQL = `SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1`;

/** The current schema name of shards $1 on this host. */
export const SHARD_SCHEMA_NAMES_SQL = `SELECT shard, schema_name FROM ${CONTROL}.shards WHERE shard = ANY($1)`;

/** Shards $1 with schemas $2: whether each schema exists, and its control state. */
export const SOURCE_SHARD_STATES_SQL = `SELECT s.shard, to_regnamespace(s.schema) IS NOT NULL AS exists, (SELECT state FROM ${CONTROL}.shards c WHERE c.shard = s.shard) AS state
       FROM unnest($1::int[], $2::text[]) AS s(shard, schema)`;

/** wal_level, and the free replication slots and WAL senders. */
export const REPLICATION_SETTINGS_SQL = `SELECT current_setting('wal_level') AS wal_level,
              current_setting('max_replication_slots')::int - (SELECT count(*) FROM pg_replication_slots)::int AS free_slots,
              current_setting('max_wal_senders')::int - (SELECT count(*) FROM pg_stat_replication)::int AS free_senders`;

/** The migrations applied to shards $1, with their checksums. */
export const APPLIED_CHECKSUMS_SQL = `SELECT shard, version, checksum FROM ${CONTROL}.migrations WHERE shard = ANY($1) ORDER BY shard, version`;

/** Which of roles $1 exist, and whether the current role is a member of each. */
/** From PostgreSQL 16 on, giving an object to a role needs a membership that may SET ROLE to it. */
export function ownerNeedsSet(serverVersionNum: number): boolean {
  return serverVersionNum >= 160000;
}

/**
 * Roles $1 that exist, and whether the current role may give objects to each: on PostgreSQL 16 and
 * later it must be able to SET ROLE to it (a membership granted WITH SET FALSE is not enough), before
 * that be a member (superusers may always).
 */
export function rolesSql(serverVersionNum: number): string {
  const may = ownerNeedsSet(serverVersionNum) ? 'SET' : 'MEMBER';
  return `SELECT r.rolname, pg_has_role(r.oid, '${may}') AS member FROM pg_roles r WHERE r.rolname = ANY($1::text[])`;
}

/** The running moves carrying any of shards $1. */
export const RUNNING_MOVES_OF_SQL = `SELECT move_id, shards, source, target, step, ${MOVE_ABORTING_SQL} FROM ${CONTROL}.moves
      WHERE status = 'running' AND shards && $1::int[] ORDER BY started_at, move_id`;

export const PUBLICATION_EXISTS_SQL = `SELECT 1 FROM pg_publication WHERE pubname = $1`;

export const SUBSCRIPTION_EXISTS_SQL = `SELECT subenabled AS enabled FROM pg_subscription WHERE subname = $1`;

/** How often subscription $1 failed to sync or apply. */
export const SUBSCRIPTION_ERRORS_SQL = `SELECT coalesce(sum(sync_error_count + apply_error_count), 0)::text AS n FROM pg_stat_subscription_stats WHERE subname = $1`;

/** Subscription $1's tables, and how many of them are not streaming yet. */
export const SUBSCRIPTION_TABLES_SQL = `SELECT count(*) AS total, count(*) FILTER (WHERE r.srsubstate <> 'r') AS pending
         FROM pg_subscription_rel r JOIN pg_subscription s ON s.oid = r.srsubid WHERE s.subname = $1`;

/** A row once marker $2 of move $1 is here. */
export const MARKER_ARRIVED_SQL = `SELECT 1 FROM ${CONTROL}.move_markers WHERE move_id = $1 AND kind = $2`;

/** What subscription $1's apply worker waits for, and who holds it. */
export const APPLY_WORKER_WAITS_SQL = `SELECT w.wait_event_type || '/' || w.wait_event AS wait,
            (SELECT string_agg(format('pid %s (%s, %s: %s)', b.pid, coalesce(nullif(b.application_name, ''), 'no application name'), b.state, left(b.query, 80)), '; ')
               FROM pg_stat_activity b WHERE b.pid = ANY(pg_blocking_pids(w.pid))) AS blockers
       FROM pg_stat_subscription s JOIN pg_stat_activity w ON w.pid = s.pid
      WHERE s.subname = $1 AND s.relid IS NULL`;

/** Move $1's markers. */
export const DELETE_MARKERS_SQL = `DELETE FROM ${CONTROL}.move_markers WHERE move_id = $1`;

/** A new move's record, and the claim of its shards (one running move per shard). `shard` is the batch's first: the control schema's column is NOT NULL. */
export const INSERT_MOVE_SQL = `WITH m AS (
       INSERT INTO ${CONTROL}.moves (move_id, shard, shards, source, target, mode, step, status, detail)
       VALUES ($1, ($2::int[])[1], $2::int[], $3, $4, $5, $6, 'running', $7::jsonb)
       ON CONFLICT (move_id) DO NOTHING RETURNING move_id)
     INSERT INTO ${CONTROL}.move_shards (shard, move_id) SELECT unnest($2::int[]), move_id FROM m`;

/** A move's step, status and detail; a finished or aborted move releases its shards. */
export const RECORD_STEP_SQL = `WITH m AS (UPDATE ${CONTROL}.moves SET step = $2, status = $3, updated_at = now(), detail = detail || $4::jsonb WHERE move_id = $1 RETURNING move_id)
     DELETE FROM ${CONTROL}.move_shards s USING m WHERE s.move_id = m.move_id AND $3 <> 'running'`;

/** Merges detail $2 into running move $1's record. */
export const RECORD_DETAIL_SQL = `UPDATE ${CONTROL}.moves SET updated_at = now(), detail = detail || $2::jsonb WHERE move_id = $1 AND status = 'running'`;

/** The running moves on this host carrying any of shards $1 (all of them when $1 is NULL). */
export const RUNNING_MOVES_SQL = `SELECT move_id, shards, source, target, mode, step, status, detail FROM ${CONTROL}.moves
      WHERE status = 'running' AND ($1::int[] IS NULL OR shards && $1::int[])
      ORDER BY started_at, move_id`;

// The verification's tail (tail.ts): tracking on the target, change logs on both hosts.

/** The triggers recording the keys a write touches on the target during a cut-over (tail.ts). */
export const TRACK_TRIGGERS = ['shardctl_track', 'shardctl_track_truncate'] as const;
const [TRACK_TRIGGER, TRACK_TRUNCATE_TRIGGER] = TRACK_TRIGGERS;

/** The tracking table and function, and triggers on `tables` recording this move's changes (one transaction). */
export function startTrackingSql(moveId: string, tables: readonly KeyedTableName[]): string {
  const fn = `${CONTROL}.move_track`;
  return [
    'BEGIN;',
    "SET LOCAL lock_timeout = '5s';",
    // Moves into the same target (from several sources at once) would race on CREATE OR REPLACE.
    TRACKING_LOCK_SQL,
    renderSql(loadSqlTemplate('move_tracking.sql'), { control: { ident: CONTROL_SCHEMA } }).trim(),
    `DELETE FROM ${CONTROL}.move_changes WHERE move_id = ${quoteLiteral(moveId)};`,
    ...tables.flatMap(({ table, columns }) => {
      const name = qualified(table.schema, table.table);
      const args = [moveId, ...columns].map(quoteLiteral).join(', ');
      return [
        `CREATE OR REPLACE TRIGGER ${TRACK_TRIGGER} AFTER INSERT OR UPDATE OR DELETE ON ${name} FOR EACH ROW EXECUTE FUNCTION ${fn}(${args});`,
        `CREATE OR REPLACE TRIGGER ${TRACK_TRUNCATE_TRIGGER} AFTER TRUNCATE ON ${name} FOR EACH STATEMENT EXECUTE FUNCTION ${fn}(${quoteLiteral(moveId)});`,
        `ALTER TABLE ${name} ENABLE ALWAYS TRIGGER ${TRACK_TRIGGER}, ENABLE ALWAYS TRIGGER ${TRACK_TRUNCATE_TRIGGER};`,
      ];
    }),
    'COMMIT;',
  ].join('\n');
}

/** The tracking triggers `triggers` dropped and this move's recorded keys gone (when their table exists), in one transaction. */
export function stopTrackingSql(moveId: string, triggers: readonly TriggerName[], changesExist: boolean): string {
  return [
    'BEGIN;',
    "SET LOCAL lock_timeout = '5s';",
    ...triggers.map((r) => `DROP TRIGGER IF EXISTS ${quoteIdent(r.trigger)} ON ${qualified(r.schema, r.table)};`),
    ...(changesExist ? [`DELETE FROM ${CONTROL}.move_changes WHERE move_id = ${quoteLiteral(moveId)};`] : []),
    'COMMIT;',
  ].join('\n');
}

const [DELTA_TRIGGER, DELTA_TRUNCATE_TRIGGER] = DELTA_TRIGGERS;

/** A table to log and its checksum method. */
export interface LoggedTable {
  readonly table: TableName;
  readonly method: 'record' | 'text';
}

/**
 * The name of a move's change-log trigger function for one wave, in the control schema
 * (sql/move_deltas.sql): one per wave, so that switching a wave's logs off (logsOffSql) stays so
 * when the next wave's set-up creates its own.
 */
export function deltaFunctionName(moveId: string, wave: number): string {
  if (!Number.isInteger(wave) || wave < 0) throw new Error(`deltaFunctionName: not a wave: ${wave}`);
  return `${deltaFunctionPrefix(moveId)}${wave}`;
}

/** What the names of a move's change-log functions begin with (deltaFunctionName). */
export function deltaFunctionPrefix(moveId: string): string {
  return `${replicationName(moveId)}_log`;
}

/** The names of move $2's change-log functions (deltaFunctionPrefix $2) in schema $1. */
export const DELTA_FUNCTIONS_SQL = `SELECT p.proname FROM pg_catalog.pg_proc p
      WHERE p.pronamespace = pg_catalog.to_regnamespace($1) AND left(p.proname, length($2)) = $2`;

/**
 * Change-log trigger functions (schema, name) replaced by one that does nothing, and move `moveId`'s
 * log entries deleted when `logExists`, in one transaction: the logs of every table whose triggers
 * call them are off, with no lock on any of those tables, for every writer from its next
 * transaction or its next new lock of the table (when a session reads a function's catalog row
 * again); one already in a transaction that holds the table may log a little longer.
 */
export function logsOffSql(
  functions: readonly (readonly [string, string])[],
  moveId: string,
  logExists: boolean,
): string {
  return [
    'BEGIN;',
    ...functions.map(
      ([schema, name]) =>
        `CREATE OR REPLACE FUNCTION ${qualified(schema, name)}() RETURNS trigger LANGUAGE plpgsql AS $off$ BEGIN RETURN NULL; END $off$;`,
    ),
    ...(logExists ? [`DELETE FROM ${CONTROL}.move_deltas WHERE move_id = ${quoteLiteral(moveId)};`] : []),
    'COMMIT;',
  ].join('\n');
}

/** The change log's table and the wave's function, and this move's earlier entries gone (within a transaction). */
function deltaLogSql(moveId: string, wave: number): string[] {
  return [
    TRACKING_LOCK_SQL,
    renderSql(loadSqlTemplate('move_deltas.sql'), {
      control: { ident: CONTROL_SCHEMA },
      function: { ident: deltaFunctionName(moveId, wave) },
      ...STABLE_TEXT_PARAMS,
    }).trim(),
    `DELETE FROM ${CONTROL}.move_deltas WHERE move_id = ${quoteLiteral(moveId)};`,
  ];
}

/** One table's change-log triggers, enabled ALWAYS (within a transaction). */
function deltaTriggersSql(moveId: string, wave: number, { table, method }: LoggedTable): string[] {
  const fn = qualified(CONTROL_SCHEMA, deltaFunctionName(moveId, wave));
  const name = qualified(table.schema, table.table);
  const args = [moveId, method].map(quoteLiteral).join(', ');
  return [
    `CREATE OR REPLACE TRIGGER ${DELTA_TRIGGER} AFTER INSERT OR UPDATE OR DELETE ON ${name} FOR EACH ROW EXECUTE FUNCTION ${fn}(${args});`,
    `CREATE OR REPLACE TRIGGER ${DELTA_TRUNCATE_TRIGGER} AFTER TRUNCATE ON ${name} FOR EACH STATEMENT EXECUTE FUNCTION ${fn}(${args});`,
    `ALTER TABLE ${name} ENABLE ALWAYS TRIGGER ${DELTA_TRIGGER}, ENABLE ALWAYS TRIGGER ${DELTA_TRUNCATE_TRIGGER};`,
  ];
}

/**
 * The change log and its triggers on `tables`, with each table's checksum method, in one
 * transaction: on the target, whose only writer is the apply worker. `lockWaitMs` bounds each
 * lock wait (see fenceSql).
 */
export function startDeltasSql(moveId: string, tables: readonly LoggedTable[], lockWaitMs: number, wave = 0): string {
  return [
    'BEGIN;',
    lockTimeoutSql(lockWaitMs),
    ...deltaLogSql(moveId, wave),
    ...tables.flatMap((t) => deltaTriggersSql(moveId, wave, t)),
    'COMMIT;',
  ].join('\n');
}

/**
 * The same on the source, whose application writes: the log in a first transaction, then each
 * table's triggers in a transaction of its own, all in one round trip. CREATE TRIGGER waits for
 * the table's writers; holding one table's lock at a time, it cannot close a cycle with an
 * application transaction that writes several tables (a transaction that locked them all would,
 * and lose at its lock_timeout again and again under such a writer). `lockWaitMs` bounds each
 * wait; after one ran out, the tables done are committed and the caller sends the rest
 * (DELTAS_DONE_SQL). Committed without waiting for the WAL flush: a server that loses them in a
 * crash has lost the move's snapshot too, and the cut-over begins again.
 */
export function startSourceDeltasSql(
  moveId: string,
  tables: readonly LoggedTable[],
  lockWaitMs: number,
  wave = 0,
): string {
  const transaction = (body: readonly string[]): string[] => [
    'BEGIN;',
    lockTimeoutSql(lockWaitMs),
    "SET LOCAL synchronous_commit = 'off';",
    ...body,
    'COMMIT;',
  ];
  return [
    ...transaction(deltaLogSql(moveId, wave)),
    ...tables.flatMap((t) => transaction(deltaTriggersSql(moveId, wave, t))),
  ].join('\n');
}

/** The tables of schemas $1 whose two change-log triggers are on (ALWAYS) for move $2: those startSourceDeltasSql did. */
export const DELTAS_DONE_SQL = `SELECT n.nspname AS schema, c.relname AS table
       FROM pg_trigger t
       JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace
      WHERE n.nspname = ANY($1::text[]) AND t.tgname = ANY($3::text[]) AND t.tgenabled = 'A'
        AND substring(t.tgargs FROM 1 FOR octet_length(convert_to($2, 'UTF8')) + 1) = convert_to($2, 'UTF8') || '\\x00'::bytea
      GROUP BY 1, 2 HAVING count(*) = 2`;

/** More changed keys than this in one table: checksummed whole instead (the lookups would cost more). */
export const TAIL_MAX_KEYS = 100_000;

/** The sums of move $1's change log on one host, by table: every entry, and those after its last TRUNCATE. */
export const READ_LOG_SUMS_SQL = `SELECT schema_name, table_name, max(truncated_at)::text AS truncated_at, count(*)::text AS entries,
            coalesce(sum(sign), 0)::text AS rows, coalesce(sum(sign * hash::numeric), 0)::text AS checksum,
            coalesce(sum(sign) FILTER (WHERE seq > truncated_at), 0)::text AS rows_after,
            coalesce(sum(sign * hash::numeric) FILTER (WHERE seq > truncated_at), 0)::text AS checksum_after
       FROM (SELECT *, max(seq) FILTER (WHERE sign = 0) OVER (PARTITION BY schema_name, table_name) AS truncated_at
               FROM ${CONTROL}.move_deltas WHERE move_id = $1) d
      GROUP BY 1, 2`;

/** The keys recorded for move `moveId` by table (as JSON while at most `maxKeys` of them), and whether it was truncated. */
function readChangesSql(moveId: string, maxKeys: string): string {
  return `SELECT schema_name, table_name, bool_or(key IS NULL) AS truncated, count(DISTINCT key)::text AS keys,
            CASE WHEN count(DISTINCT key) <= ${maxKeys} THEN jsonb_agg(DISTINCT key) FILTER (WHERE key IS NOT NULL)::text END AS keys_json
       FROM ${CONTROL}.move_changes WHERE move_id = ${moveId} GROUP BY 1, 2`;
}

/** The keys recorded for move $1 by table (as JSON while at most $2 of them), and whether it was truncated. */
export const READ_CHANGES_SQL = readChangesSql('$1', '$2');

/**
 * The catch-up while a wave is fenced, and the target's reads that follow it, in one round trip:
 * the server waits for marker `kind` of move `moveId` itself, looking every millisecond, and fails
 * once `limitMs` have passed without it (so that nothing after runs: a read of the tables' sizes
 * would queue behind the replicated TRUNCATE the apply worker may be waiting to apply); then it
 * reads the sizes of the wave's tables there (`leaves`, by OID, as reportEmptySql) and, with
 * `changes`, the keys the move recorded (READ_CHANGES_SQL): once the marker is applied, nothing
 * changes either until the switch; those reads may take what is left of `readsWithinMs` (the fence
 * limit) after the wait, at least 50 ms. In READ COMMITTED whatever the session's default, so that
 * each look sees the apply worker's commits.
 */
export function catchUpSql(input: {
  readonly moveId: string;
  readonly kind: string;
  readonly limitMs: number;
  readonly readsWithinMs: number;
  readonly leaves: readonly number[];
  readonly changes: boolean;
}): string {
  const arrived = `EXISTS (SELECT 1 FROM ${CONTROL}.move_markers WHERE move_id = ${quoteLiteral(input.moveId)} AND kind = ${quoteLiteral(input.kind)})`;
  if (arrived.includes('$catch_up$')) throw new Error('catchUpSql: a marker cannot contain $catch_up$');
  const limit = Math.max(0, Math.round(input.limitMs));
  const reads = Math.max(0, Math.round(input.readsWithinMs));
  return [
    'BEGIN ISOLATION LEVEL READ COMMITTED;',
    `DO $catch_up$ BEGIN WHILE NOT ${arrived} LOOP ` +
      `IF clock_timestamp() >= now() + interval '${limit} milliseconds' THEN RAISE EXCEPTION 'the fence marker was not applied within ${limit} ms'; END IF; ` +
      `PERFORM pg_sleep(0.001); END LOOP; ` +
      // The statements after this one run under what is left of the fence limit (SET LOCAL).
      `PERFORM set_config('statement_timeout', greatest(${MIN_STATEMENT_TIMEOUT_MS}, ${reads} - (extract(epoch FROM clock_timestamp() - now()) * 1000)::int)::text, true); ` +
      `END $catch_up$;`,
    ...(input.leaves.length > 0 ? [reportEmptySql(input.leaves)] : []),
    ...(input.changes ? [`${readChangesSql(quoteLiteral(input.moveId), String(TAIL_MAX_KEYS))};`] : []),
    'COMMIT;',
  ].join('\n');
}

/**
 * SQL condition: the row `t` of `table` has one of the keys in the JSON array `param` (a
 * placeholder like $1). The keys are read back with their columns' types (built-in types, from the
 * catalog), so the lookup can use the key's index; not through the table's row type, whose other
 * columns would be NULL (a domain NOT NULL refuses that).
 */
export function keyFilterSql(keyed: KeyedTableName, param: string): string {
  const columns = keyed.columns.map(quoteIdent);
  const definitions = columns.map((c, i) => `${c} ${keyed.types[i]!}`).join(', ');
  return `(${columns.map((c) => `t.${c}`).join(', ')}) IN (SELECT ${columns.map((c) => `k.${c}`).join(', ')} FROM jsonb_to_recordset(${param}::jsonb) AS k(${definitions}))`;
}

// The verification (verify.ts): checksums of both copies.

/** How a table's rows are hashed for its checksum (verify.ts, hashMethods). */
export type HashMethod = 'record' | 'text';

// The row is `t.*`, never a bare `t`: a table with a column named t would hash that column alone.
export const HASH_SQL: Record<HashMethod, string> = {
  // Each column hashed with its type's hash function (the one hash partitioning relies on, stable
  // across versions): several times faster than hashing the row's text, and verification runs
  // while writes are fenced. PostgreSQL 14 and later; built-in types only (see ShardTable.portable).
  record: 'hash_record_extended(t.*, 0)',
  // The row's text: enums by label, reg* by name, whatever their OIDs on each host.
  text: 'hashtextextended((t.*)::text, 0)',
};

/**
 * The text form of a row depends on session settings (search path, time zone, date style, float
 * digits, the monetary locale of `money`): fixed here on both sessions (and in the change logs'
 * trigger function) so that equal rows give equal text on both hosts, whatever each server's
 * defaults. The sessions that set them name every relation with its schema.
 */
const STABLE_TEXT = {
  timezone: 'UTC',
  datestyle: 'ISO, YMD',
  intervalstyle: 'postgres',
  extra_float_digits: '1',
  bytea_output: 'hex',
  lc_monetary: 'C',
} as const;

export const STABLE_TEXT_SETTINGS = [
  // The text of regclass, regtype, … names the schema unless it is on the path (a list: not a literal).
  'SET search_path TO pg_catalog, pg_temp',
  ...Object.entries(STABLE_TEXT).map(([name, value]) => `SET ${name} TO ${quoteLiteral(value)}`),
].join('; ');

/** The same settings as placeholders of sql/move_deltas.sql, whose trigger function sets them. */
const STABLE_TEXT_PARAMS = Object.fromEntries(
  Object.entries(STABLE_TEXT).map(([name, value]) => [name, { literal: value }]),
);

/**
 * Fails (42883) when one of `types` (built-in type names, as format_type gives them) has no
 * extended hash function (json, point, money, an array of them): a table with a column of such a
 * type is hashed as text. The record hash looks a column's function up only when it hashes a row,
 * so the probe hashes one, all NULL. One statement for all of them.
 */
export function hashProbeSql(types: readonly string[]): string {
  return types
    .map((type) => {
      if (!BUILT_IN_TYPE_NAME.test(type)) throw new Error(`internal error: not a built-in type name: ${type}`);
      return `SELECT hash_record_extended(ROW(NULL::${type}), 0)`;
    })
    .join('\nUNION ALL ');
}

/** The names format_type gives built-in types: `bigint`, `timestamp with time zone`, `"char"`, `integer[]`. */
export const BUILT_IN_TYPE_NAME = /^(?:[a-z][a-z0-9_ ]*|"char")(?:\[\])*$/;

/** One table's count and checksum: every row, or only the rows whose key is in a JSON array of keys. */
export interface ChecksumSql {
  readonly table: TableName;
  readonly method: HashMethod;
  readonly keys?: { readonly keyed: KeyedTableName; readonly json: string };
}

/** Counts and checksums of many tables (or key subsets of them) in one statement, row i for query i; the key arrays are its parameters. */
export function checksumsSql(queries: readonly ChecksumSql[]): { sql: string; params: string[] } {
  const params: string[] = [];
  const sql = queries
    .map(({ table: t, method, keys }, i) => {
      const where = keys ? ` WHERE ${keyFilterSql(keys.keyed, `$${params.push(keys.json)}`)}` : '';
      return `SELECT ${i} AS i, count(*)::text AS rows, coalesce(sum(${HASH_SQL[method]}), 0)::text AS checksum FROM ${qualified(t.schema, t.table)} t${where}`;
    })
    .join('\nUNION ALL ');
  return { sql: `${sql}\nORDER BY 1`, params };
}

/** The snapshot of this transaction, for others to import. */
export const EXPORT_SNAPSHOT_SQL = 'SELECT pg_export_snapshot() AS snapshot';

/** The first statement of a REPEATABLE READ transaction that reads as of an exported snapshot. */
export function setTransactionSnapshotSql(snapshot: string): string {
  return `SET TRANSACTION SNAPSHOT ${quoteLiteral(snapshot)}`;
}

// Sessions and connections of a move.

/** This session's backend pid. */
export const BACKEND_PID_SQL = 'SELECT pg_backend_pid() AS pid';

/** Ends backend $1 (the slot's creation cancelled; a walsender that holds a slot). */
export const TERMINATE_BACKEND_SQL = 'SELECT pg_terminate_backend($1)';

/** Slot $1 dropped (fails while a walsender holds it). */
export const DROP_SLOT_SQL = 'SELECT pg_drop_replication_slot($1)';

/** A statement timeout for the session, in ms (see underFence). */
export function statementTimeoutSql(ms: number): string {
  return `SET statement_timeout = ${Math.max(MIN_STATEMENT_TIMEOUT_MS, Math.ceil(ms))}`;
}

/**
 * The shortest statement timeout the cut-over sets (statementTimeoutSql): a timeout of a few ms
 * can cancel the statement that resets it (RESET runs under the timeout it replaces), leaving the
 * session unable to run anything, the unfence included. Well within the fence limit's slack (see
 * TIMEOUT_SLACK_MS in fence-limit.ts).
 */
export const MIN_STATEMENT_TIMEOUT_MS = 50;

export const RESET_STATEMENT_TIMEOUT_SQL = 'RESET statement_timeout';

export const RESET_SYNCHRONOUS_COMMIT_SQL = 'RESET synchronous_commit';

export const CURRENT_USER_SQL = 'SELECT current_user AS current';

/**
 * The publications, subscriptions and slots named like a move's (shardctl_move_<id>) that no
 * running move accounts for; `movesRecorded`: the host has the control schema's moves table.
 */
export function leftoverReplicationSql(movesRecorded: boolean): string {
  const running = movesRecorded ? RUNNING_MOVE_NAMES_SQL : `SELECT NULL::text WHERE false`;
  return `SELECT kind, name FROM (
        SELECT 'publication' AS kind, pubname::text AS name FROM pg_publication
        UNION ALL SELECT 'subscription', subname::text FROM pg_subscription WHERE subdbid = (SELECT oid FROM pg_database WHERE datname = current_database())
        UNION ALL SELECT 'slot', slot_name::text FROM pg_replication_slots WHERE database = current_database()
      ) o
      WHERE name LIKE 'shardctl\\_move\\_%' AND name NOT IN (${running})
      ORDER BY kind, name`;
}

/**
 * Shards $1 with schemas $2 on the target: whether each schema exists, and its control state
 * (none where the target has no control schema yet: `initialised` false).
 */
export function targetShardStatesSql(initialised: boolean): string {
  return `SELECT s.shard, to_regnamespace(s.schema) IS NOT NULL AS exists,
            ${initialised ? `(SELECT state FROM ${CONTROL}.shards c WHERE c.shard = s.shard)` : 'NULL::text'} AS state
       FROM unnest($1::int[], $2::text[]) AS s(shard, schema)`;
}

// The copy (copy.ts).

/**
 * A copy's transaction on the target, with the replica role: foreign keys between a shard's tables
 * must not depend on the copy order (superusers only; the savepoint lets the copy go on without it
 * where the SET is refused).
 */
export const BEGIN_COPY_SQL = 'BEGIN; SAVEPOINT replica_role; SET LOCAL session_replication_role = replica';

/** One row: column i tells whether table i (quoted) holds any row. */
export function nonEmptyTablesSql(tables: readonly string[]): string {
  return `SELECT ${tables.map((name, i) => `EXISTS (SELECT FROM ${name}) AS "${i}"`).join(', ')}`;
}

export function truncateSql(tables: readonly string[]): string {
  return `TRUNCATE ${tables.join(', ')}`;
}

/** The COPY out of the source (`table` quoted); binary only where both ends read it alike. */
export function copyOutSql(table: string, binary: boolean): string {
  return `COPY ${table} TO STDOUT${binary ? ' (FORMAT binary)' : ''}`;
}

export function copyInSql(table: string, binary: boolean): string {
  return `COPY ${table} FROM STDIN${binary ? ' (FORMAT binary)' : ''}`;
}

/** An index that can be built again exactly (catalog.ts, REBUILDABLE_INDEXES_SQL). */
export interface RebuildableIndex {
  /** Quoted and qualified. */
  readonly index_name: string;
  readonly table_name: string;
  readonly conname: string | null;
  readonly indexdef: string;
  readonly condef: string | null;
}

/** The drop of an index, or of the constraint that owns it. */
export function dropIndexForCopySql(index: RebuildableIndex): string {
  return index.conname !== null
    ? `ALTER TABLE ${index.table_name} DROP CONSTRAINT ${quoteIdent(index.conname)};`
    : `DROP INDEX ${index.index_name};`;
}

/** The index (or its constraint) built again, as it was. */
export function rebuildIndexSql(index: RebuildableIndex): string {
  return index.conname !== null
    ? `ALTER TABLE ONLY ${index.table_name} ADD CONSTRAINT ${quoteIdent(index.conname)} ${index.condef}`
    : index.indexdef;
}
