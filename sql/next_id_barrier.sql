-- Part of a shard's next_id, rendered before sql/next_id_shard.sql by src/id/sql.ts when the shard schema may already hold
-- sequences (a reinstall, an adoption); a schema created in the same transaction has none, and the
-- DO block would only cost its compilation (about 4 ms a shard).
--
-- The barrier of a reinstall (init upgrading an older version in place): ALTER SEQUENCE (a no-op
-- here: the cache it already has) locks each sequence of the schema in SHARE ROW EXCLUSIVE mode
-- until this transaction commits, which waits for every transaction that has drawn from it
-- (nextval() holds ROW EXCLUSIVE on the sequence to the transaction's end) and holds new draws until
-- the new functions are visible. Without it, a statement that began under the old release could
-- still run the old slow path, which may take another lock, beside the new
-- one, and two sessions could move one sequence at once.
DO $barrier$
DECLARE
  seq regclass;
BEGIN
  FOR seq IN SELECT c.oid FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
              WHERE n.nspname = {{schemaLiteral}} AND c.relkind = 'S' ORDER BY c.oid LOOP
    EXECUTE pg_catalog.format('ALTER SEQUENCE %s CACHE %s', seq, (pg_catalog.pg_sequence_parameters(seq)).cache_size);
  END LOOP;
END
$barrier$;
