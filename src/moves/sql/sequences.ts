import { ident, int, list, lit, sql, type Sql } from '../../pg/sql-template.js';
import { qualified } from './names.js';

/**
 * Reading and setting the shards' sequences (carried from the source to the target at the switch).
 */

/** A sequence's state, as read from the sequence itself (pg_sequences hides a setval(..., false)). */
export function readSequencesSql(sequences: readonly (readonly [string, string])[]): Sql {
  const selects = sequences.map(
    ([schema, name], i) =>
      sql`SELECT ${int(i)} AS i, last_value::text AS last_value, is_called FROM ${qualified(schema, name)}`,
  );
  return sql`${list(selects, '\nUNION ALL ')}\nORDER BY 1`;
}

/**
 * The state of the sequences $1 (regclass[]), in order, from PostgreSQL 18 (pg_get_sequence_data):
 * one statement whatever their number, where readSequencesSql parses one SELECT per sequence.
 */
export const READ_SEQUENCE_DATA_SQL = sequenceDataSql(sql`$1::regclass[]`);

/** READ_SEQUENCE_DATA_SQL of the sequences an array expression of regclass gives. */
export function sequenceDataSql(regclasses: Sql): Sql {
  return sql`SELECT s.i::int - 1 AS i, d.last_value::text AS last_value, d.is_called
       FROM unnest(${regclasses}) WITH ORDINALITY AS s(seq, i), pg_get_sequence_data(s.seq) AS d ORDER BY s.i`;
}

export interface SequenceValue {
  readonly schema: string;
  readonly name: string;
  readonly lastValue: bigint;
  readonly isCalled: boolean;
}

/** setval() for each sequence, in one statement. */
export function setSequencesSql(values: readonly SequenceValue[]): Sql {
  const setvals = values.map(
    (v) =>
      sql`setval(${lit(ident(v.schema, v.name))}::regclass, ${int(v.lastValue, 'a sequence value', -(2n ** 63n))}, ${v.isCalled ? sql`true` : sql`false`})`,
  );
  return sql`SELECT ${list(setvals, ',\n       ')}`;
}
