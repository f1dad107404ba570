-- Change tracking on a move's target, so that the cut-over verifies only what changed while the
-- source was still writable (src/moves/tail.ts, docs/moves.md "Verification"). Filled by
-- src/moves/tail.ts with the control schema's name; created on the target just before a wave's
-- pre-verification, and its triggers dropped again before the wave switches.
--
-- move_changes: the replica-identity key of every row a write touched on a tracked table (the old
-- and the new key of an update), as a JSON object of the key columns; key NULL for a TRUNCATE.
CREATE TABLE IF NOT EXISTS {{control}}.move_changes (
  move_id text NOT NULL,
  schema_name text NOT NULL,
  table_name text NOT NULL,
  key jsonb
);

-- The trigger function: TG_ARGV[0] is the move id, the rest the key columns. Installed as ALWAYS
-- triggers, so it records the logical replication apply worker's writes (which run as 'replica')
-- and any other session's alike: a write by hand on the target is caught as well. SECURITY DEFINER:
-- a trigger runs as the role that writes, and from PostgreSQL 16 the apply worker writes as each
-- table's owner, who need not have any right on the control schema.
CREATE OR REPLACE FUNCTION {{control}}.move_track()
RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $move_track$
DECLARE
  columns text[] := TG_ARGV[1:];
BEGIN
  IF TG_OP = 'TRUNCATE' THEN
    INSERT INTO {{control}}.move_changes VALUES (TG_ARGV[0], TG_TABLE_SCHEMA, TG_TABLE_NAME, NULL);
    RETURN NULL;
  END IF;
  IF TG_OP IN ('UPDATE', 'DELETE') THEN
    INSERT INTO {{control}}.move_changes
      SELECT TG_ARGV[0], TG_TABLE_SCHEMA, TG_TABLE_NAME, jsonb_object_agg(c, to_jsonb(OLD) -> c) FROM unnest(columns) c;
  END IF;
  IF TG_OP IN ('INSERT', 'UPDATE') THEN
    INSERT INTO {{control}}.move_changes
      SELECT TG_ARGV[0], TG_TABLE_SCHEMA, TG_TABLE_NAME, jsonb_object_agg(c, to_jsonb(NEW) -> c) FROM unnest(columns) c;
  END IF;
  RETURN NULL;
END
$move_track$;
