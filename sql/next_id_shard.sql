-- next_id(seq) itself, the function table defaults call, for one shard schema, filled by
-- src/id/sql.ts. Its slow path is shared by the host's shards: {{control}}.next_id_locked(seq, shard)
-- of sql/next_id_control.sql, installed with the control schema, which must exist first (the body
-- below is bound to it when this function is created). Nothing here is PL/pgSQL, so a connection
-- that serves thousands of shards caches nothing per shard for its ids (docs/ids.md).
--
-- The fast path itself, as one SQL expression that the planner inlines into the calling statement
-- (an INSERT's default, a SELECT): no function call per id but nextval(), two currval() and a few
-- built-ins, and no PL/pgSQL call unless the slow path is taken.
--
-- One condition decides, on the position p drawn by nextval():
--   m = (p << {{shardBits}}) >> {{timeShift}}  is p's millisecond (p >> {{sequenceBits}}) for every p inside the layout,
--                                   0 <= p <= {{maxPosition}}; a p past the layout's end (up to twice it) or
--                                   below zero gives m < 0, which is refused like any old position
--   accept  <=>  greatest(clock, A) < A + m ms,  A = {{acceptBeforeLiteral}} (epoch + lag + 1 ms)
-- For p inside the layout this is exactly {{control}}.next_id_fast()'s condition: m >= 1 (p >= {{minPosition}}) and
-- clock < A + m ms (p not more than the lag behind the clock; see sql/next_id_control.sql). greatest()
-- keeps a position of the epoch's first millisecond (m = 0, a new sequence) out of the fast path
-- when the clock is before A, so such a clock still reaches the slow path's SC002.
-- The id is then p + (p >> {{sequenceBits}}) * {{idMinusPositionPerMs}} + {{shardField}}, p read back with currval(). A p
-- far outside the layout (>= twice its end, or below minus it: a sequence set by hand) may pass
-- the condition; its id overflows bigint and the statement fails (22003), so no id outside the
-- layout is ever returned.
--
-- currval() returns what this session's last nextval() of that sequence returned; it runs only in
-- the THEN branch, after the condition (CASE evaluates a result only once its condition is true),
-- and the only other function here that draws, next_id_locked(), runs only as the ELSE branch. So
-- both currval() are the position this call drew. Inside the condition, the order in which the
-- clock and nextval() are evaluated is not relied on: the slow path's proof allows a clock read
-- before the draw (docs/ids.md). Inlining allows seq to appear several times because it is a
-- constant in a default; nextval() appears once.
-- currval() needs USAGE (or SELECT) on the sequence, as nextval() needs USAGE (or UPDATE).
-- A SQL-standard body (RETURN, PostgreSQL 14 and later): it is bound to next_id_locked() when it is
-- created, not looked up by name when a statement is planned, so it keeps working when a move
-- renames the schema (the fenced old copy must answer SC100, not "function does not exist"), and
-- the caller needs EXECUTE on it (granted to PUBLIC) but no USAGE on the control schema.
CREATE OR REPLACE FUNCTION {{schema}}.next_id(seq regclass)
RETURNS bigint
LANGUAGE sql VOLATILE PARALLEL UNSAFE
RETURN CASE
  WHEN {{acceptBeforeLiteral}}::timestamptz + ((pg_catalog.nextval(seq) << {{shardBits}}) >> {{timeShift}}) * interval '1 millisecond'
       > GREATEST(pg_catalog.clock_timestamp(), {{acceptBeforeLiteral}}::timestamptz)
  THEN pg_catalog.currval(seq) + (pg_catalog.currval(seq) >> {{sequenceBits}}) * {{idMinusPositionPerMs}} + {{shardField}}
  ELSE {{control}}.next_id_locked(seq, {{shard}})
END;

COMMENT ON FUNCTION {{schema}}.next_id(regclass) IS {{commentLiteral}};
