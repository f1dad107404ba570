-- next_id(seq) itself, the function table defaults call, for one shard schema: installed after
-- sql/next_id.sql (which creates next_id_fast and next_id_locked), filled by src/id/sql.ts.
--
-- What table defaults call. A one-expression SQL function, so the planner inlines it into the
-- INSERT: nextval() runs in the statement itself and the only function call per id is
-- next_id_fast(). seq appears twice, which inlining allows because it is a constant in a default.
-- A SQL-standard body (RETURN, PostgreSQL 14 and later): it is bound to next_id_fast() when it is
-- created, not looked up by name when a statement is planned, so it keeps working when a move
-- renames the schema (the fenced old copy must answer SC100, not "function does not exist").
CREATE OR REPLACE FUNCTION {{schema}}.next_id(seq regclass)
RETURNS bigint
LANGUAGE sql VOLATILE PARALLEL UNSAFE
RETURN {{schema}}.next_id_fast(seq, pg_catalog.nextval(seq));

COMMENT ON FUNCTION {{schema}}.next_id(regclass) IS {{commentLiteral}};
