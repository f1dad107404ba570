-- next_id(seq) itself, the function table defaults call, for one shard schema: installed after
-- sql/next_id.sql (which creates next_id_fast and next_id_locked), filled by src/id/sql.ts.
--
-- The fast path itself, as one SQL expression that the planner inlines into the calling statement
-- (an INSERT's default, a SELECT): no function call per id but nextval() and a few built-ins, and
-- no PL/pgSQL call unless the slow path is taken. It accepts exactly the positions next_id_fast()
-- accepts, and makes the same id from them (see next_id_fast in sql/next_id.sql for the condition):
--   pos inside the layout, and clock_timestamp() < {{acceptBeforeLiteral}} + (pos >> {{sequenceBits}}) ms
--   id = pos + (pos >> {{sequenceBits}}) * {{idMinusPositionPerMs}} + {{shardField}}
-- An expression has no variables, so the position drawn by nextval() in the first WHEN is read
-- again with currval(): currval() returns the value this session's last nextval() of that sequence
-- returned. CASE evaluates its conditions in order and a result only after its condition (the
-- order of operands inside one condition is not relied on), so every currval() comes after the
-- nextval(); the only other function here that draws, next_id_locked(), runs only as a result.
-- So every currval() below is the position this call drew (docs/ids.md). Inlining allows seq to
-- appear several times because it is a constant in a default; nextval() appears once.
-- currval() needs USAGE (or SELECT) on the sequence, as nextval() needs USAGE (or UPDATE).
-- A SQL-standard body (RETURN, PostgreSQL 14 and later): it is bound to next_id_locked() when it is
-- created, not looked up by name when a statement is planned, so it keeps working when a move
-- renames the schema (the fenced old copy must answer SC100, not "function does not exist").
CREATE OR REPLACE FUNCTION {{schema}}.next_id(seq regclass)
RETURNS bigint
LANGUAGE sql VOLATILE PARALLEL UNSAFE
RETURN CASE
  WHEN pg_catalog.nextval(seq) < {{minPosition}} THEN {{schema}}.next_id_locked(seq)
  WHEN pg_catalog.currval(seq) <= {{maxPosition}}
   AND pg_catalog.clock_timestamp() < {{acceptBeforeLiteral}}::timestamptz + (pg_catalog.currval(seq) >> {{sequenceBits}}) * interval '1 millisecond'
  THEN pg_catalog.currval(seq) + (pg_catalog.currval(seq) >> {{sequenceBits}}) * {{idMinusPositionPerMs}} + {{shardField}}
  ELSE {{schema}}.next_id_locked(seq)
END;

COMMENT ON FUNCTION {{schema}}.next_id(regclass) IS {{commentLiteral}};
