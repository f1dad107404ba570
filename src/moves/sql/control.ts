import { sql } from '../../pg/sql-template.js';
import { CONTROL, MOVE_ABORTING_SQL, shardIsActive } from '../../fleet/control.js';

/**
 * A move's records in the control schema, and the shard states it reads there.
 */

/** A new move's record, and the claim of its shards (one running move per shard). `shard` is the batch's first: the control schema's column is NOT NULL. */
export const INSERT_MOVE_SQL = sql`WITH m AS (
       INSERT INTO ${CONTROL}.moves (move_id, shard, shards, source, target, mode, step, status, detail)
       VALUES ($1, ($2::int[])[1], $2::int[], $3, $4, $5, $6, 'running', $7::jsonb)
       ON CONFLICT (move_id) DO NOTHING RETURNING move_id)
     INSERT INTO ${CONTROL}.move_shards (shard, move_id) SELECT unnest($2::int[]), move_id FROM m`;

/** A move's step, status and detail; a finished or aborted move releases its shards. */
export const RECORD_STEP_SQL = sql`WITH m AS (UPDATE ${CONTROL}.moves SET step = $2, status = $3, updated_at = now(), detail = detail || $4::jsonb WHERE move_id = $1 RETURNING move_id)
     DELETE FROM ${CONTROL}.move_shards s USING m WHERE s.move_id = m.move_id AND $3 <> 'running'`;

/** Merges detail $2 into running move $1's record. */
export const RECORD_DETAIL_SQL = sql`UPDATE ${CONTROL}.moves SET updated_at = now(), detail = detail || $2::jsonb WHERE move_id = $1 AND status = 'running'`;

/** The running moves on this host carrying any of shards $1 (all of them when $1 is NULL). */
export const RUNNING_MOVES_SQL = sql`SELECT move_id, shards, source, target, mode, step, status, detail FROM ${CONTROL}.moves
      WHERE status = 'running' AND ($1::int[] IS NULL OR shards && $1::int[])
      ORDER BY started_at, move_id`;

/** The running moves carrying any of shards $1. */
export const RUNNING_MOVES_OF_SQL = sql`SELECT move_id, shards, source, target, step, ${MOVE_ABORTING_SQL} FROM ${CONTROL}.moves
      WHERE status = 'running' AND shards && $1::int[] ORDER BY started_at, move_id`;

/** The migration versions applied to shards $1, in order. */
export const APPLIED_VERSIONS_SQL = sql`SELECT shard, version FROM ${CONTROL}.migrations WHERE shard = ANY($1) ORDER BY version`;

/** The current schema name of shards $1 on this host. */
export const SHARD_SCHEMA_NAMES_SQL = sql`SELECT shard, schema_name FROM ${CONTROL}.shards WHERE shard = ANY($1)`;

/** Which of shards $1 are fenced on this host. */
export const FENCED_SHARDS_SQL = sql`SELECT shard FROM ${CONTROL}.shards WHERE shard = ANY($1) AND state = 'fenced'`;

/** Which of shards $1 are active on this host. */
export const ACTIVE_SHARDS_SQL = sql`SELECT shard FROM ${CONTROL}.shards WHERE shard = ANY($1) AND ${shardIsActive()}`;
