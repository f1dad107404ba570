-- The published zero-argument next_id() of an adopted shard (shardctl adopt), replaced in place:
-- same name, same signature (OUT result bigint), same language, so the table defaults and the
-- application calls that name it keep working, and statements planned before the switch run the
-- new body with the compiler they were planned with. It now returns shardctl's id for the sequence
-- the published function drew from: next_id(seq regclass) of sql/next_id.sql, installed in the
-- same transaction, and the sequence moved to a position above every id the published function
-- could have made (src/adopt/sql.ts). Filled by src/adopt/sql.ts with quoted identifiers only.
CREATE OR REPLACE FUNCTION {{schema}}.next_id(OUT result bigint)
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $next_id$
BEGIN
  result := {{schema}}.next_id({{sequenceLiteral}}::regclass);
END
$next_id$;

COMMENT ON FUNCTION {{schema}}.next_id() IS {{commentLiteral}};
