-- next_id(seq) for one shard schema. Installed by shardctl into every shard schema; the
-- placeholders {{...}} are filled by src/pg/template.ts (from src/id/sql.ts) with validated numbers and quoted
-- identifiers only.
--
-- Id layout: [0][time: {{timeBits}} bits][shard: {{shardBits}} bits][sequence: {{sequenceBits}} bits]
--
-- Why this is not Instagram's published function: that one reads nextval() and the clock
-- separately and keeps only nextval() % 1024, so a session paused between the two reads, or more
-- than 1024 calls in one millisecond, repeats an id. Here the sequence itself holds
-- (milliseconds since the epoch << sequenceBits) + counter, called the position. Every id is
-- made from exactly one nextval(), and the mapping position -> id is one-to-one, so two calls can
-- only collide if the sequence hands out the same value twice, which it never does unless it is
-- moved backwards. The position is only ever moved forwards, by next_id_locked below.
--
-- Fast path (no lock): take the next position and use it when it is not more than {{lagMs}} ms
-- behind the clock. A position ahead of the clock is used as is: under a burst of more than
-- 2^sequenceBits ids per millisecond the ids run ahead of the clock instead of repeating, and a
-- clock that steps backwards never makes the sequence go back.
CREATE OR REPLACE FUNCTION {{schema}}.next_id(seq regclass)
RETURNS bigint
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $next_id$
DECLARE
  pos bigint := pg_catalog.nextval(seq);
BEGIN
  RETURN CASE
    WHEN pos >= GREATEST(((pg_catalog.date_part('epoch', pg_catalog.clock_timestamp()) * 1000)::bigint - {{epochPlusLagMs}}) << {{sequenceBits}}, {{minPosition}})
     AND pos <= {{maxPosition}}
    THEN ((pos >> {{sequenceBits}}) << {{timeShift}}) | {{shardField}} | (pos & {{sequenceMask}})
    ELSE {{schema}}.next_id_locked(seq)
  END;
END
$next_id$;

-- Slow path: taken when the position has fallen behind the clock (the table was idle, or ids are
-- drawn more slowly than one per 2^-sequenceBits ms), or when the layout's range is exhausted.
--
-- It moves the sequence forward to the clock with setval(). setval() is not a compare-and-set,
-- so two rules make that move safe:
--   1. Only one session per sequence is in here at a time: a transaction-level advisory lock
--      taken inside a sub-transaction that is always rolled back, so the lock is held for
--      microseconds and is released even when the statement is cancelled. Sequence changes are
--      not transactional, so the rollback keeps them.
--   2. It moves the sequence only when the position is more than max_backends positions behind
--      the fast path's acceptance threshold. Any other session that draws while we hold the
--      lock gets a position below that threshold, so it rejects it and queues on this lock
--      before drawing again: at most one draw per other backend, too few to reach the target,
--      so setval() can only move the sequence forwards (proof in docs/ids.md).
-- SECURITY DEFINER so that roles with only USAGE on the sequence (enough for nextval) can still
-- move it; it refuses sequences outside its own schema.
CREATE OR REPLACE FUNCTION {{schema}}.next_id_locked(seq regclass)
RETURNS bigint
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $next_id_locked$
DECLARE
  now_ms bigint;
  pos bigint;
  max_backends bigint;
BEGIN
  IF (SELECT c.relnamespace FROM pg_catalog.pg_class c WHERE c.oid = seq) IS DISTINCT FROM {{schemaLiteral}}::regnamespace THEN
    RAISE EXCEPTION 'next_id: sequence % is not in schema %', seq, {{schemaLiteral}}
      USING ERRCODE = 'SC003';
  END IF;
  -- With CACHE > 1 a backend hands out values it reserved earlier without touching the shared
  -- position, so the position read below could be stale and setval() could move it backwards.
  IF (SELECT s.seqcache FROM pg_catalog.pg_sequence s WHERE s.seqrelid = seq) <> 1 THEN
    RAISE EXCEPTION 'next_id: sequence % has CACHE > 1; next_id needs CACHE 1', seq
      USING ERRCODE = 'SC004', HINT = 'ALTER SEQUENCE ... CACHE 1';
  END IF;
  BEGIN
    PERFORM pg_catalog.pg_advisory_xact_lock({{lockClass}}, seq::oid::integer);
    now_ms := pg_catalog.floor(pg_catalog.date_part('epoch', pg_catalog.clock_timestamp()) * 1000)::bigint - {{epochMs}};
    IF now_ms < 0 THEN
      RAISE EXCEPTION 'next_id: the clock (%) is before the epoch of the id layout (%)',
        pg_catalog.clock_timestamp(), {{layoutLiteral}}
        USING ERRCODE = 'SC002';
    END IF;
    IF now_ms > {{maxTimeMs}} THEN
      RAISE EXCEPTION 'next_id: the id layout (%) ran out of time bits on %; ids would overflow into the sign bit',
        {{layoutLiteral}}, {{layoutEndLiteral}}
        USING ERRCODE = 'SC001', HINT = 'Choose a new id layout (a later epoch) for new shards; ids are never wrapped.';
    END IF;
    pos := pg_catalog.nextval(seq);
    max_backends := pg_catalog.current_setting('max_connections')::bigint
      + pg_catalog.current_setting('autovacuum_max_workers')::bigint
      + pg_catalog.current_setting('max_worker_processes')::bigint
      + pg_catalog.current_setting('max_wal_senders')::bigint + 1;
    IF pos < ((now_ms - {{lagMs}}) << {{sequenceBits}}) - max_backends THEN
      pos := pg_catalog.setval(seq, now_ms << {{sequenceBits}});
    END IF;
    IF pos > {{maxPosition}} THEN
      RAISE EXCEPTION 'next_id: the id layout (%) ran out of time bits on % (sequence % is ahead of the clock); ids would overflow into the sign bit',
        {{layoutLiteral}}, {{layoutEndLiteral}}, seq
        USING ERRCODE = 'SC001';
    END IF;
    RAISE SQLSTATE 'SCR01';  -- roll back this block: releases the advisory lock, keeps the sequence
  EXCEPTION WHEN SQLSTATE 'SCR01' THEN  -- exactly this code: 'SC000' would be the whole SC class
    NULL;
  END;
  RETURN ((pos >> {{sequenceBits}}) << {{timeShift}}) | {{shardField}} | (pos & {{sequenceMask}});
END
$next_id_locked$;

COMMENT ON FUNCTION {{schema}}.next_id(regclass) IS {{commentLiteral}};
