import { int, lines, list, lit, sql, type Sql } from '../../pg/sql-template.js';
import { CONTROL } from '../../fleet/control.js';
import { reportEmptySql } from './fence.js';
import { MIN_STATEMENT_TIMEOUT_MS } from './session.js';
import { TAIL_MAX_KEYS, readChangesSql } from './tail.js';

/**
 * The catch-up while a wave is fenced: the target waits for the fence marker, then reads what the
 * verification needs.
 */

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
}): Sql {
  const arrived = sql`EXISTS (SELECT 1 FROM ${CONTROL}.move_markers WHERE move_id = ${lit(input.moveId)} AND kind = ${lit(input.kind)})`;
  if (arrived.includes('$catch_up$')) throw new Error('catchUpSql: a marker cannot contain $catch_up$');
  const limit = int(Math.max(0, Math.round(input.limitMs)), 'a limit in ms');
  const reads = int(Math.max(0, Math.round(input.readsWithinMs)), 'a limit in ms');
  return lines([
    sql`BEGIN ISOLATION LEVEL READ COMMITTED;`,
    list(
      [
        sql`DO $catch_up$ BEGIN WHILE NOT ${arrived} LOOP `,
        sql`IF clock_timestamp() >= now() + interval '${limit} milliseconds' THEN RAISE EXCEPTION 'the fence marker was not applied within ${limit} ms'; END IF; `,
        sql`PERFORM pg_sleep(0.001); END LOOP; `,
        // The statements after this one run under what is left of the fence limit (SET LOCAL).
        sql`PERFORM set_config('statement_timeout', greatest(${int(MIN_STATEMENT_TIMEOUT_MS)}, ${reads} - (extract(epoch FROM clock_timestamp() - now()) * 1000)::int)::text, true); `,
        sql`END $catch_up$;`,
      ],
      '',
    ),
    ...(input.leaves.length > 0 ? [reportEmptySql(input.leaves)] : []),
    ...(input.changes ? [sql`${readChangesSql(lit(input.moveId), int(TAIL_MAX_KEYS))};`] : []),
    sql`COMMIT;`,
  ]);
}
