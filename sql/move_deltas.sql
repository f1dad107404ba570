-- Change logs of a move: on both hosts for the tables whose changes cannot be looked up by key (no
-- replica-identity key, or a key whose JSON form might not read back exactly), on the source for
-- the others too, so that the source's figure is its own: src/moves/tail.ts, docs/moves.md
-- "Verification". Filled by src/moves/tail.ts with the control schema's name and the wave's
-- function name; its triggers are created just before a wave's snapshot P and switched off by
-- replacing the function (the target's after the wave's verification, the source's by an unfence,
-- --abort or the clean-up), then dropped where their table is free.
--
-- move_deltas (the control schema's, sql/control_deltas.sql: every move and every resumed one
-- brings both hosts' control schemas up to date first): per row a write touched, the checksum's hash
-- of the row as it was (sign -1) and as it is (sign +1); a TRUNCATE is a row with sign 0. seq orders
-- a table's entries: a TRUNCATE holds ACCESS EXCLUSIVE until it commits, so every entry of its table
-- after it in seq order was written after it, and every entry before it was written before. key:
-- the text form of the row's column named by TG_ARGV[2], when given (the chunk key of a table
-- copied in chunks); xid: the writing transaction. A row of sign 2 is a start marker
-- (src/moves/chunks.ts), written with the triggers of a table copied in chunks; the sums leave it out.

-- The trigger function, one per wave of a move (src/moves/sql.ts deltaFunctionName), so that a
-- wave's logs are switched off by replacing it with one that does nothing (logsOffSql): no
-- lock on any logged table, where disabling each trigger would wait for that table's readers and
-- any TRUNCATE queued behind them. SET search_path: see STABLE_TEXT. TG_ARGV[0] is the move id,
-- TG_ARGV[1] the checksum's method ('record' or 'text', see src/moves/verify.ts HASH_SQL), so a
-- row's hash here is the one the checksum gives it.
-- The text form of a row depends on session settings, fixed here as the checksum fixes them (an
-- application's session may have others): the values are src/moves/sql.ts's STABLE_TEXT. ALWAYS
-- triggers: on the target they fire for the apply worker. SECURITY DEFINER: the application's
-- roles, and the apply worker writing as a table's owner, need no right on the control schema.
CREATE OR REPLACE FUNCTION {{control}}.{{function}}()
RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET timezone = {{timezone}}
SET datestyle = {{datestyle}}
SET intervalstyle = {{intervalstyle}}
SET extra_float_digits = {{extra_float_digits}}
SET bytea_output = {{bytea_output}}
SET lc_monetary = {{lc_monetary}}
AS $move_delta$
BEGIN
  IF TG_OP = 'TRUNCATE' THEN
    INSERT INTO {{control}}.move_deltas (move_id, schema_name, table_name, sign) VALUES (TG_ARGV[0], TG_TABLE_SCHEMA, TG_TABLE_NAME, 0);
    RETURN NULL;
  END IF;
  IF TG_OP IN ('UPDATE', 'DELETE') THEN
    INSERT INTO {{control}}.move_deltas (move_id, schema_name, table_name, sign, hash, key)
      VALUES (TG_ARGV[0], TG_TABLE_SCHEMA, TG_TABLE_NAME, -1,
              CASE TG_ARGV[1] WHEN 'record' THEN hash_record_extended(OLD, 0) ELSE hashtextextended(OLD::text, 0) END,
              CASE WHEN TG_NARGS > 2 THEN to_jsonb(OLD) ->> TG_ARGV[2] END);
  END IF;
  IF TG_OP IN ('INSERT', 'UPDATE') THEN
    INSERT INTO {{control}}.move_deltas (move_id, schema_name, table_name, sign, hash, key)
      VALUES (TG_ARGV[0], TG_TABLE_SCHEMA, TG_TABLE_NAME, 1,
              CASE TG_ARGV[1] WHEN 'record' THEN hash_record_extended(NEW, 0) ELSE hashtextextended(NEW::text, 0) END,
              CASE WHEN TG_NARGS > 2 THEN to_jsonb(NEW) ->> TG_ARGV[2] END);
  END IF;
  RETURN NULL;
END
$move_delta$;
