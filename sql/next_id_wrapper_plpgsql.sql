-- next_id(seq) itself, the function table defaults call, for one shard schema: installed after
-- sql/next_id.sql (which creates next_id_fast and next_id_locked), filled by src/id/sql.ts.
--
-- The same function in PL/pgSQL, for shards whose next_id() already is PL/pgSQL (installed by a
-- release before v3). CREATE OR REPLACE FUNCTION must not change a function's language while
-- sessions use it: a statement planned just before the change runs the new body with the old
-- language's compiler and fails ("syntax error at end of input", seen under a live writer on
-- PostgreSQL 15 and 18). Such shards keep PL/pgSQL: one more function call per id than the
-- inlined SQL version, and the same ids. The call to next_id_fast() is resolved when it runs,
-- after the fence's statement trigger, so a moved shard's old copy still answers SC100.
CREATE OR REPLACE FUNCTION {{schema}}.next_id(seq regclass)
RETURNS bigint
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $next_id$
BEGIN
  RETURN {{schema}}.next_id_fast(seq, pg_catalog.nextval(seq));
END
$next_id$;

COMMENT ON FUNCTION {{schema}}.next_id(regclass) IS {{commentLiteral}};
