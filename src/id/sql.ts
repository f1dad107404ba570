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
 * Bumped whenever sql/next_id.sql or sql/next_id_wrapper.sql changes, so `init` replaces older
 * functions in place (what each version changed: CHANGELOG.md). Kept in the function's comment as
 * `shardctl next_id vN`.
 */
export const ID_FUNCTION_VERSION = 1;

/**
 * The table whose rows next_id's slow path locks (one per slot, the sequence's oid modulo
 * ID_LOCK_SLOTS): in the control schema, created by sql/control_locks.sql, writable by its owner
 * only. The schema is CONTROL_SCHEMA of src/fleet/control.ts (a layer above; a unit test checks).
 */
export const ID_LOCKS_SCHEMA = 'shardctl';
export const ID_LOCK_SLOTS = 8192;

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

/**
 * The CREATE FUNCTION statements that install next_id(), next_id_fast() and next_id_locked() in a
 * shard schema; after the barrier of next_id_barrier.sql, unless the schema is created in the same
 * transaction (`fresh`: it holds no sequence for the barrier to wait on).
 */
export function renderNextIdSql(
  schema: string,
  shard: number,
  layout: IdLayout,
  { fresh = false }: { readonly fresh?: boolean } = {},
): string {
  const seqBits = BigInt(layout.sequenceBits);
  const positionBits = BigInt(timeBits(layout)) + seqBits;
  // Shared by the slow path, next_id_fast() and the inlined fast path of next_id().
  const fastPath = {
    schema: { ident: schema },
    sequenceBits: { int: layout.sequenceBits },
    // The fast path accepts a position p while clock < this + (p >> sequenceBits) ms; see next_id.sql.
    acceptBeforeLiteral: { literal: formatTimestamp(layout.epochMs + BigInt(ID_LAG_MS) + 1n) },
    minPosition: { int: 1n << seqBits },
    maxPosition: { int: (1n << positionBits) - 1n },
    shardField: { int: BigInt(shard) << seqBits },
    // id = pos + (pos >> sequenceBits) * this + shard field: the same as the shifts and masks, one operator fewer.
    idMinusPositionPerMs: { int: (1n << BigInt(layout.sequenceBits + layout.shardBits)) - (1n << seqBits) },
    // (p << shardBits) >> timeShift is p's millisecond inside the layout, negative just outside it.
    shardBits: { int: layout.shardBits },
    timeShift: { int: layout.sequenceBits + layout.shardBits },
  } as const;
  const commentLiteral = {
    literal: `shardctl next_id v${ID_FUNCTION_VERSION}: 64-bit ids for shard ${shard} (${describeLayout(layout)}). See docs/ids.md.`,
  };
  const wrapper = renderSql(loadSqlTemplate('next_id_wrapper.sql'), { ...fastPath, commentLiteral });
  const barrier = fresh
    ? ''
    : `${renderSql(loadSqlTemplate('next_id_barrier.sql'), { schemaLiteral: { literal: schema } })}\n`;
  return `${barrier}${renderSql(loadSqlTemplate('next_id.sql'), {
    ...fastPath,
    schemaLiteral: { literal: schema },
    timeBits: { int: timeBits(layout) },
    lagMs: { int: ID_LAG_MS },
    leadMs: { int: ID_LEAD_MS },
    busyPositions: { int: BigInt(ID_BUSY_MS) << seqBits },
    epochMs: { int: layout.epochMs },
    maxTimeMs: { int: maxTimeOffsetMs(layout) },
    sequenceMask: { int: (1n << seqBits) - 1n },
    idLocksSchema: { ident: ID_LOCKS_SCHEMA },
    idLocksLiteral: { literal: `${ID_LOCKS_SCHEMA}.id_locks` },
    idLockSlots: { int: ID_LOCK_SLOTS },
    layoutLiteral: { literal: describeLayout(layout) },
    layoutEndLiteral: { literal: formatUnixMs(layoutEndUnixMs(layout)) },
  })}\n${wrapper}`;
}
