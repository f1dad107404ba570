-- Control schema version 5: what lets a resumed copy settle its chunks from the source's change
-- log instead of reading them (src/moves/chunks.ts reconcileByLog, docs/moves.md step 4).
-- {{control}} is the control schema name, filled in by src/pg/template.ts. Idempotent; the ALTERs
-- add no default to rows that exist (no rewrite), and run once per host, when its control schema is
-- brought up to this version.
--
-- move_deltas: the moves' change logs (sql/move_deltas.sql says what a row is), created here since
-- this version (before, by a move's first log); its key and xid: the chunk key's text form of the
-- row an entry logs (on the source, for the tables a copy takes in key chunks) and the transaction
-- that wrote it (its change's), so that the entries a chunk's snapshot did not see are known.
-- move_chunks.snapshot: the source's snapshot a chunk was copied from (src/moves/chunks.ts
-- copySnapshotText), written when its copy begins.
ALTER TABLE {{control}}.move_chunks ADD COLUMN IF NOT EXISTS snapshot text;
CREATE TABLE IF NOT EXISTS {{control}}.move_deltas (
  seq bigserial,
  move_id text NOT NULL,
  schema_name text NOT NULL,
  table_name text NOT NULL,
  sign smallint NOT NULL,
  hash bigint,
  key text,
  xid xid8
);
ALTER TABLE {{control}}.move_deltas ADD COLUMN IF NOT EXISTS key text, ADD COLUMN IF NOT EXISTS xid xid8;
ALTER TABLE {{control}}.move_deltas ALTER COLUMN xid SET DEFAULT pg_catalog.pg_current_xact_id();
