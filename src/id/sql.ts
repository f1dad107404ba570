import { quoteIdent } from '../pg/quote.js';
import { loadSqlTemplate, renderSql } from '../pg/template.js';
import { describeLayout, formatUnixMs, layoutEndUnixMs, maxTimeOffsetMs, timeBits, type IdLayout } from './layout.js';

/**
 * How far behind the clock (ms) the fast path still accepts a sequence position before taking the
 * lock and moving the sequence forward. Ids are therefore at most this much (plus
 * max_backends / 2^sequenceBits ms) older than the clock that made them.
 */
export const ID_LAG_MS = 1;

/**
 * How far ahead of the clock (ms) the slow path moves a busy sequence (one that fell less than
 * ID_BUSY_MS behind): ids are then at most this much younger than the clock that made them (more
 * only in a burst above 2^sequenceBits ids per ms), and a busy sequence takes the lock several
 * times less often. An idle sequence is moved to the clock itself.
 */
export const ID_LEAD_MS = 3;

/** A sequence that fell less than this many ms (of positions) behind the fast path's threshold is busy. */
export const ID_BUSY_MS = 4;

/**
 * Bumped whenever sql/next_id_shard.sql changes, so `init` replaces older functions in place (what
 * each version changed: CHANGELOG.md). Kept in the function's comment as `shardctl next_id vN`. The
 * slow path (sql/next_id_control.sql) lives in the control schema and is versioned with it
 * (CONTROL_STEPS in src/fleet/control.ts).
 */
export const ID_FUNCTION_VERSION = 2;

/**
 * The schema of the host-wide slow path next_id_locked(seq, shard) and of the rows it locks (one per
 * slot, the sequence's oid modulo ID_LOCK_SLOTS; sql/control_locks.sql), writable by its owner only.
 * The schema is CONTROL_SCHEMA of src/fleet/control.ts (a layer above; a unit test checks).
 */
export const ID_LOCKS_SCHEMA = 'shardctl';
/** The rows of id_locks: the lock of the slow path before control schema version 6, and during its change-over. */
export const ID_LOCK_SLOTS = 8192;
/** The lock tables id_lock_0 .. id_lock_15 of the slow path (sql/control_locks.sql; the function's CASE has one branch each). */
export const ID_LOCK_TABLES = 16;

/**
 * The slow path's comment, which says which locks it takes: the table lock alone, or the table lock
 * and the earlier row lock while a host changes over (src/fleet/control.ts, finishSlowPath).
 */
export const SLOW_PATH_COMMENT = 'shardctl next_id slow path: table locks';
export const SLOW_PATH_CHANGING_COMMENT =
  'shardctl next_id slow path: table locks and the earlier row locks (changing over)';

/**
 * A timestamptz literal for PostgreSQL, exact to the millisecond. Not formatUnixMs(): that one
 * falls back to "N ms" for dates JavaScript cannot show, which must never reach the SQL.
 */
function formatTimestamp(unixMs: bigint): string {
  const date = new Date(Number(unixMs));
  if (Number.isNaN(date.getTime()) || date.getUTCFullYear() < 1 || date.getUTCFullYear() > 9999) {
    throw new RangeError(`the id layout's epoch (${unixMs} ms) is outside the years 1-9999`);
  }
  return date.toISOString();
}

/** The constants both paths share, from the layout (see sql/next_id_shard.sql). */
function fastPathParams(layout: IdLayout) {
  const seqBits = BigInt(layout.sequenceBits);
  const positionBits = BigInt(timeBits(layout)) + seqBits;
  return {
    sequenceBits: { int: layout.sequenceBits },
    // The fast path accepts a position p while clock < this + (p >> sequenceBits) ms; see next_id_control.sql.
    acceptBeforeLiteral: { literal: formatTimestamp(layout.epochMs + BigInt(ID_LAG_MS) + 1n) },
    minPosition: { int: 1n << seqBits },
    maxPosition: { int: (1n << positionBits) - 1n },
    // id = pos + (pos >> sequenceBits) * this + shard field: the same as the shifts and masks, one operator fewer.
    idMinusPositionPerMs: { int: (1n << BigInt(layout.sequenceBits + layout.shardBits)) - (1n << seqBits) },
    // (p << shardBits) >> timeShift is p's millisecond inside the layout, negative just outside it.
    shardBits: { int: layout.shardBits },
    timeShift: { int: layout.sequenceBits + layout.shardBits },
  } as const;
}

/**
 * The host-wide part of next_id (sql/next_id_control.sql): the slow path next_id_locked(seq, shard)
 * and next_id_fast(seq, shard, pos), the fast path's readable form, in `control` (the control
 * schema; a test's scratch schema), for the host's layout and schema prefix. CREATE OR REPLACE:
 * idempotent.
 */
export function renderNextIdControlSql(
  layout: IdLayout,
  schemaPrefix: string,
  control: string = ID_LOCKS_SCHEMA,
  { changingOver = false }: { readonly changingOver?: boolean } = {},
): string {
  const seqBits = BigInt(layout.sequenceBits);
  return renderSql(loadSqlTemplate('next_id_control.sql'), {
    ...fastPathParams(layout),
    control: { ident: control },
    controlLiteral: { literal: control },
    alsoRowLock: { int: changingOver ? 1 : 0 },
    slowPathCommentLiteral: { literal: changingOver ? SLOW_PATH_CHANGING_COMMENT : SLOW_PATH_COMMENT },
    schemaPrefixLiteral: { literal: schemaPrefix },
    maxShard: { int: (1 << layout.shardBits) - 1 },
    timeBits: { int: timeBits(layout) },
    lagMs: { int: ID_LAG_MS },
    leadMs: { int: ID_LEAD_MS },
    busyPositions: { int: BigInt(ID_BUSY_MS) << seqBits },
    epochMs: { int: layout.epochMs },
    maxTimeMs: { int: maxTimeOffsetMs(layout) },
    sequenceMask: { int: (1n << seqBits) - 1n },
    idLocksLiteral: { literal: `${ID_LOCKS_SCHEMA}.id_locks` },
    idLockSlots: { int: ID_LOCK_SLOTS },
    layoutLiteral: { literal: describeLayout(layout) },
    layoutEndLiteral: { literal: formatUnixMs(layoutEndUnixMs(layout)) },
  }).trim();
}

/**
 * The statements that install next_id(seq) in a shard schema (sql/next_id_shard.sql), calling the
 * slow path of `control` (which must exist: renderNextIdControlSql). Unless the schema is created
 * in the same transaction (`fresh`: it holds no sequence and no earlier function), the barrier of
 * next_id_barrier.sql comes first and next_id_upgrade.sql after (an earlier release's per-shard
 * slow path handed over).
 */
export function renderNextIdSql(
  schema: string,
  shard: number,
  layout: IdLayout,
  { fresh = false, control = ID_LOCKS_SCHEMA }: { readonly fresh?: boolean; readonly control?: string } = {},
): string {
  const commentLiteral = {
    literal: `shardctl next_id v${ID_FUNCTION_VERSION}: 64-bit ids for shard ${shard} (${describeLayout(layout)}). See docs/ids.md.`,
  };
  const shardParams = {
    schema: { ident: schema },
    control: { ident: control },
    shard: { int: shard },
  };
  const nextId = renderSql(loadSqlTemplate('next_id_shard.sql'), {
    ...fastPathParams(layout),
    ...shardParams,
    shardField: { int: BigInt(shard) << BigInt(layout.sequenceBits) },
    commentLiteral,
  }).trim();
  if (fresh) return nextId;
  const barrier = renderSql(loadSqlTemplate('next_id_barrier.sql'), { schemaLiteral: { literal: schema } }).trim();
  const upgrade = renderSql(loadSqlTemplate('next_id_upgrade.sql'), {
    ...shardParams,
    forwarderLiteral: { literal: `${quoteIdent(schema)}.next_id_locked(regclass)` },
  }).trim();
  return `${barrier}\n${nextId}\n${upgrade}`;
}
