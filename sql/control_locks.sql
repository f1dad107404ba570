-- The locks shardctl relies on, in the control schema: installed with it (sql/control.sql, through
-- src/fleet/control.ts) and, on a host whose control schema predates them or does not exist yet,
-- by the first run that takes the runner lock, before it takes it. Idempotent.
-- {{control}} is the control schema name (always "shardctl"), filled in by src/pg/template.ts.
--
-- Why tables and not advisory locks: any role that can connect can take any advisory key, and
-- shardctl's keys are predictable, so a stranger could stall writes and block every run. Locking a
-- table in a mode above ROW EXCLUSIVE, or a row FOR UPDATE, needs UPDATE (or DELETE, TRUNCATE) on it,
-- and the control schema grants nothing to PUBLIC (not even USAGE, which name lookup needs). A
-- stranger can still take ACCESS SHARE on these tables by oid (pg_relation_size() does), which
-- conflicts with none of the modes below.
CREATE SCHEMA IF NOT EXISTS {{control}};

-- The runner lock: one shardctl run per host. Held in SHARE UPDATE EXCLUSIVE mode (conflicts with
-- itself, not with ACCESS SHARE or the row locks of tracking_lock below) by a connection of its own
-- with a transaction open for the run's life (src/fleet/locks.ts). No rows.
CREATE TABLE IF NOT EXISTS {{control}}.runner_lock ();

-- Serialises moves that set up change tracking on the same target at once (src/moves/tail.ts):
-- locked in EXCLUSIVE mode inside the tracking transaction. No rows.
CREATE TABLE IF NOT EXISTS {{control}}.tracking_lock ();

-- The worker backends of runs: each worker connection records itself here (committed at once)
-- before it does any work. A new runner, once it holds the runner lock, waits until no recorded
-- backend is still alive and busy (pg_stat_activity, same pid and start time, not idle), so the
-- workers of a killed run have finished their statement before it reads the catalog; it then
-- deletes the rows of backends gone or idle. A run that finishes deletes its own rows.
CREATE TABLE IF NOT EXISTS {{control}}.workers (
  pid           integer NOT NULL,
  backend_start timestamptz NOT NULL,
  PRIMARY KEY (pid, backend_start)
);
-- The run a worker belongs to: a run that finishes removes its own records (src/fleet/locks.ts).
ALTER TABLE {{control}}.workers ADD COLUMN IF NOT EXISTS run_id text;

-- next_id's slow path before control schema version 6 (sql/next_id_control.sql) serialised the
-- sessions moving one sequence with a row lock (FOR NO KEY UPDATE) on the slot of the sequence's oid;
-- the slow path of a host changing over takes it too, beside the table lock below, until no
-- transaction that may still run the earlier slow path is left (src/fleet/control.ts,
-- finishSlowPath). Sequences share a slot when their oids are equal modulo the slot count: their
-- slow paths then wait for each other (microseconds), which the proof allows (it needs at most one
-- session per sequence, not per slot). The rows must all exist: that slow path refuses to go on
-- without its row (SC005).
CREATE TABLE IF NOT EXISTS {{control}}.id_locks (
  slot integer PRIMARY KEY CHECK (slot >= 0 AND slot < {{idLockSlots}})
);
INSERT INTO {{control}}.id_locks (slot) SELECT s FROM pg_catalog.generate_series(0, {{idLockSlots}} - 1) s ON CONFLICT DO NOTHING;

-- next_id's slow path serialises the sessions moving one sequence with a table lock (EXCLUSIVE mode,
-- taken inside a sub-transaction that is always rolled back) on one of these tables, the sequence's
-- oid modulo their count ({{idTableSlots}}). A table lock needs no transaction id, where a row lock takes
-- one per call (the sub-transaction's): so the slow path does not double the transaction ids, nor add
-- the row lock's WAL, of writes that each find their sequence idle (docs/ids.md). EXCLUSIVE conflicts
-- with every mode but ACCESS SHARE, and only a role with UPDATE, DELETE or TRUNCATE on the table (its
-- owner here) may take such a mode: a stranger cannot hold it. No rows, no columns.
-- id_locks above is the lock of the slow path before control schema version 6: taken too while the
-- slow path changes over (src/fleet/control.ts, finishSlowPath).
-- The slow path runs as its function's owner (SECURITY DEFINER): where the function exists already
-- (a host upgraded from version 5) and another role creates the tables now (a superuser, say), that
-- owner is given UPDATE on them, which lets it take the lock.
DO $id_lock_tables$
DECLARE
  t text;
  slow_path_owner oid := (SELECT p.proowner FROM pg_catalog.pg_proc p
                           WHERE p.oid = pg_catalog.to_regprocedure({{controlLiteral}} || '.next_id_locked(regclass, integer)'));
BEGIN
  FOR i IN 0 .. {{idTableSlots}} - 1 LOOP
    t := pg_catalog.format('%I.%I', {{controlLiteral}}, 'id_lock_' || i);
    EXECUTE 'CREATE TABLE IF NOT EXISTS ' || t || ' ()';
    EXECUTE 'REVOKE ALL ON ' || t || ' FROM PUBLIC';
    IF slow_path_owner IS NOT NULL AND NOT pg_catalog.has_table_privilege(slow_path_owner, t, 'UPDATE') THEN
      EXECUTE 'GRANT UPDATE ON ' || t || ' TO ' || pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(slow_path_owner));
    END IF;
  END LOOP;
END
$id_lock_tables$;

REVOKE ALL ON {{control}}.runner_lock, {{control}}.tracking_lock, {{control}}.workers, {{control}}.id_locks FROM PUBLIC;
