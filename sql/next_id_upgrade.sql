-- Part of a shard's next_id, rendered after sql/next_id_shard.sql by src/id/sql.ts when the shard
-- schema may hold an earlier release's functions (init upgrading in place, adopt); never for a
-- schema created in the same transaction.
--
-- Releases before next_id v2 kept the slow path in every shard schema (next_id_locked(seq), and
-- next_id_fast(seq, pos) beside it). next_id() no longer calls them; the slow path is the control
-- schema's. next_id_fast is dropped. next_id_locked is not: a statement whose plan was made before
-- this transaction and whose draw waited on the barrier (sql/next_id_barrier.sql) can still call it
-- by the oid it resolved, and a dropped function would fail that insert. It becomes one statement
-- that hands over to the control schema's slow path, in the same language, with the same rights.
DO $upgrade$
BEGIN
  IF pg_catalog.to_regprocedure({{forwarderLiteral}}) IS NOT NULL THEN
    CREATE OR REPLACE FUNCTION {{schema}}.next_id_locked(seq regclass)
    RETURNS bigint
    LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    AS $forward$
    BEGIN
      RETURN {{control}}.next_id_locked(seq, {{shard}});
    END
    $forward$;
  END IF;
END
$upgrade$;
DROP FUNCTION IF EXISTS {{schema}}.next_id_fast(regclass, bigint);
