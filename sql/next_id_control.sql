-- next_id's slow path, once per host: in the control schema, installed by src/fleet/control.ts
-- (control schema version 3) with the host's id layout; the placeholders {{...}} are filled by
-- src/id/sql.ts (through src/pg/template.ts) with validated numbers, timestamps and quoted
-- identifiers only. Every shard schema's next_id(seq) (sql/next_id_shard.sql) calls it, passing its
-- shard number, when the fast path refuses a position.
--
-- Why once per host and not once per shard: a backend caches a PL/pgSQL function and the plans of
-- its statements per function. A slow path in every shard schema made a connection that served 512
-- shards hold 512 compiled copies and about 6,000 cached plans (over 100 MB), and every cache
-- invalidation made each backend walk them all (stalls of seconds under autovacuum). One function
-- here is compiled once per connection, whatever the shards it serves (docs/ids.md, "What a
-- connection holds").
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
-- "now_ms" below always means floor((clock_timestamp() - epoch) / 1 ms): whole milliseconds since
-- the layout's epoch, rounded down. Both paths use exactly this conversion (the fast path in an
-- equivalent form that compares timestamps), so they never disagree on what "now" is.

-- Slow path: taken when the position has fallen behind the clock (the table was idle, or ids are
-- drawn more slowly than 2^sequenceBits per millisecond), or when the layout's range is exhausted.
--
-- It moves the sequence forward to the clock. setval() is not a compare-and-set, so two rules
-- make that move safe:
--   1. Only one session per sequence is in here at a time: a table lock (EXCLUSIVE mode) on the
--      sequence's slot among {{control}}.id_lock_0 .. id_lock_15 (its oid modulo 16), taken inside
--      a sub-transaction that is always rolled back, so the lock is held for microseconds and is
--      released even when the statement is cancelled. Sequence changes are not transactional, so
--      the rollback keeps them. A table lock, not an advisory lock: EXCLUSIVE needs UPDATE, DELETE
--      or TRUNCATE on the table, which only its owner has, so no other role can hold it and stall
--      the inserts that take this path. And not a row lock (control schema versions 3 to 5 locked a
--      row of {{control}}.id_locks): a row lock gives the sub-transaction a transaction id of its
--      own, so each call took one more id and wrote the lock and the sub-transaction's abort to the
--      WAL; writes that each find their sequence idle (one row into one of thousands of shards)
--      took two transaction ids each instead of one. A table lock takes none.
--      While a host changes over from the row lock (src/fleet/control.ts, finishSlowPath), this
--      function takes both (the IF after the CASE below): a session may still run the earlier body,
--      compiled before the change, until its transaction ends.
--   2. It calls setval() only when the position is more than 2 * max_backends positions behind
--      the fast path's acceptance threshold. Any other session that draws while we hold the lock
--      gets a position below that threshold; a session whose clock was read after ours rejects it
--      and queues on this lock before drawing again, and the one call per session that may have
--      read the clock before ours (the fast path does not order its clock read and its draw) adds
--      one more: at most two draws per other backend, too few to reach the target, so setval()
--      can only move the sequence forwards (proof in docs/ids.md).
-- A position behind the threshold by less than that (it just crossed it) cannot be moved with
-- setval(); it is moved with nextval() instead, drawing the few positions up to the threshold in
-- one statement. Either way the call that takes the lock moves the sequence to where the fast path
-- accepts it again, so the next calls do not queue here one after another.
-- When the position is less than {{busyPositions}} positions behind, the sequence is being drawn
-- continuously, and setval() moves it {{leadMs}} ms ahead of the clock instead of to the clock: the
-- fast path then accepts it for {{leadMs}} ms longer, so a busy sequence takes this path several
-- times less often, and its ids carry a time at most {{leadMs}} ms ahead of the clock. A sequence
-- left idle for longer is moved to the clock itself.
--
-- Written for a cold call: at drawing rates below ~2^sequenceBits per millisecond this runs every
-- millisecond or two, between long stretches of the fast path, so what it costs is mostly how
-- much code it touches. Hence: no catalog
-- query (built-in functions check the schema and the cache), the settings and the range checks
-- only where the sequence is about to move, and as few statements as the argument allows.
-- SECURITY DEFINER so that roles with only USAGE on the sequence (enough for nextval) can still
-- move it and take the lock; it refuses a sequence outside the schema of the shard it is given
-- (prefix and shard number, both checked) before touching it, so no sequence of another schema can
-- be moved through it. Its EXECUTE is granted to PUBLIC (next_id(), inlined into the caller's
-- statement, calls it with the caller's rights; the function is bound by its oid there, so the
-- caller needs no USAGE on the control schema), so it refuses a session that has not drawn from the
-- sequence itself: currval()
-- is defined only after this session's nextval(), which needs USAGE or UPDATE on the sequence of the
-- role that was current then. next_id() always draws first, with the caller's rights, so a role
-- that may insert is never refused; a role without a right on the sequence cannot move it.
-- (current_user here is the owner, and session_user ignores SET ROLE and the caller's own
-- SECURITY DEFINER functions, so neither names the role whose rights matter.)
CREATE OR REPLACE FUNCTION {{control}}.next_id_locked(seq regclass, shard integer)
RETURNS bigint
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $next_id_locked$
DECLARE
  now_ms bigint;
  behind bigint;
  pos bigint;
BEGIN
  -- With search_path = pg_catalog, pg_temp, a regclass prints schema-qualified (quoted as
  -- quote_ident() quotes) unless it is in pg_catalog or pg_temp: this matches exactly the relations
  -- of the shard's schema, without a catalog query.
  IF shard IS NULL OR shard < 0 OR shard > {{maxShard}}
     OR NOT pg_catalog.starts_with(seq::text, pg_catalog.quote_ident({{schemaPrefixLiteral}} || shard::text) || '.') THEN
    RAISE EXCEPTION 'next_id: sequence % is not in the schema of shard %', seq, shard
      USING ERRCODE = 'SC003';
  END IF;
  BEGIN
    -- Before the lock, so that a session without a right on the sequence never queues for it.
    PERFORM pg_catalog.currval(seq);
    -- The lock first, then the clock. now_ms exactly: extract(epoch ...) is numeric, so no rounding.
    -- One static statement per slot (a statement's plan is cached; EXECUTE would parse each call).
    CASE (seq::oid::bigint % 16)::integer
      WHEN 0 THEN LOCK TABLE ONLY {{control}}.id_lock_0 IN EXCLUSIVE MODE;
      WHEN 1 THEN LOCK TABLE ONLY {{control}}.id_lock_1 IN EXCLUSIVE MODE;
      WHEN 2 THEN LOCK TABLE ONLY {{control}}.id_lock_2 IN EXCLUSIVE MODE;
      WHEN 3 THEN LOCK TABLE ONLY {{control}}.id_lock_3 IN EXCLUSIVE MODE;
      WHEN 4 THEN LOCK TABLE ONLY {{control}}.id_lock_4 IN EXCLUSIVE MODE;
      WHEN 5 THEN LOCK TABLE ONLY {{control}}.id_lock_5 IN EXCLUSIVE MODE;
      WHEN 6 THEN LOCK TABLE ONLY {{control}}.id_lock_6 IN EXCLUSIVE MODE;
      WHEN 7 THEN LOCK TABLE ONLY {{control}}.id_lock_7 IN EXCLUSIVE MODE;
      WHEN 8 THEN LOCK TABLE ONLY {{control}}.id_lock_8 IN EXCLUSIVE MODE;
      WHEN 9 THEN LOCK TABLE ONLY {{control}}.id_lock_9 IN EXCLUSIVE MODE;
      WHEN 10 THEN LOCK TABLE ONLY {{control}}.id_lock_10 IN EXCLUSIVE MODE;
      WHEN 11 THEN LOCK TABLE ONLY {{control}}.id_lock_11 IN EXCLUSIVE MODE;
      WHEN 12 THEN LOCK TABLE ONLY {{control}}.id_lock_12 IN EXCLUSIVE MODE;
      WHEN 13 THEN LOCK TABLE ONLY {{control}}.id_lock_13 IN EXCLUSIVE MODE;
      WHEN 14 THEN LOCK TABLE ONLY {{control}}.id_lock_14 IN EXCLUSIVE MODE;
      ELSE LOCK TABLE ONLY {{control}}.id_lock_15 IN EXCLUSIVE MODE;
    END CASE;
    -- While the host changes over: the earlier slow path's row lock too (rule 1 above).
    IF {{alsoRowLock}} = 1 THEN
      PERFORM FROM {{control}}.id_locks WHERE slot = (seq::oid::bigint % {{idLockSlots}})::integer FOR NO KEY UPDATE;
      IF NOT FOUND THEN
        RAISE EXCEPTION 'next_id: the lock row of sequence % is missing from %', seq, {{idLocksLiteral}}
          USING ERRCODE = 'SC005', HINT = 'Run shardctl init, which restores the control schema''s locks.';
      END IF;
    END IF;
    now_ms := pg_catalog.floor(EXTRACT(epoch FROM pg_catalog.clock_timestamp()) * 1000)::bigint - {{epochMs}};
    -- How far the position is behind the fast path's acceptance threshold at now_ms (drawn after
    -- the clock was read: the proof needs that order).
    behind := GREATEST((now_ms - {{lagMs}}) << {{sequenceBits}}, {{minPosition}}) - pg_catalog.nextval(seq);
    IF behind > 0 THEN
      -- About to move the sequence: only now do the clock's range and the cache matter. A clock
      -- past the layout's range puts every position that still fits behind the threshold (but
      -- those of the last millisecond, which are valid ids); before the epoch, a position ahead
      -- of it is used as the fast path uses it. With CACHE > 1 a backend hands out values it
      -- reserved earlier without touching the shared position, so the position just drawn could
      -- be stale and setval() could move it backwards; using it as it is (the branch below) is
      -- safe. nextval() above has already refused anything that is not a sequence.
      IF now_ms NOT BETWEEN 0 AND {{maxTimeMs}} OR (pg_catalog.pg_sequence_parameters(seq)).cache_size <> 1 THEN
        IF now_ms < 0 THEN
          RAISE EXCEPTION 'next_id: the clock (%) is before the epoch of the id layout (%)',
            pg_catalog.clock_timestamp(), {{layoutLiteral}}
            USING ERRCODE = 'SC002';
        ELSIF now_ms > {{maxTimeMs}} THEN
          RAISE EXCEPTION 'next_id: the id layout (%) ran out of time bits on %; ids would overflow into the sign bit',
            {{layoutLiteral}}, {{layoutEndLiteral}}
            USING ERRCODE = 'SC001', HINT = 'Choose a new id layout (a later epoch) for new shards; ids are never wrapped.';
        END IF;
        RAISE EXCEPTION 'next_id: sequence % has CACHE > 1; next_id needs CACHE 1', seq
          USING ERRCODE = 'SC004', HINT = 'ALTER SEQUENCE ... CACHE 1';
      END IF;
      -- Twice max_backends bounds the draws other sessions can make while we hold the lock. Read
      -- only here, where a move is decided: the settings are fixed while the server runs, and
      -- reading them (not baking them in) means changing max_connections needs no reinstall.
      IF behind > 2 * (pg_catalog.current_setting('max_connections')::bigint
                       + pg_catalog.current_setting('autovacuum_max_workers')::bigint
                       + pg_catalog.current_setting('max_worker_processes')::bigint
                       + pg_catalog.current_setting('max_wal_senders')::bigint + 1) THEN
        -- To the clock, or {{leadMs}} ms ahead of it when the sequence is busy; at most
        -- ({{maxTimeMs}} << {{sequenceBits}}), inside the layout: now_ms was checked above.
        pos := pg_catalog.setval(seq, GREATEST(LEAST(now_ms + CASE WHEN behind < {{busyPositions}} THEN {{leadMs}} ELSE 0 END, {{maxTimeMs}}) << {{sequenceBits}}, {{minPosition}}));
      ELSE
        -- Just behind: setval() is not safe this close, so draw up to the threshold instead
        -- (at most 2 * max_backends positions, in one statement). Draws by others in between only
        -- make this end higher.
        SELECT pg_catalog.max(pg_catalog.nextval(seq)) INTO pos FROM pg_catalog.generate_series(1, behind);
      END IF;
    ELSE
      -- Not behind: another session moved the sequence while this one waited for the lock.
      pos := GREATEST((now_ms - {{lagMs}}) << {{sequenceBits}}, {{minPosition}}) - behind;
    END IF;
    IF pos > {{maxPosition}} THEN
      RAISE EXCEPTION 'next_id: the id layout (%) ran out of time bits on % (sequence % is ahead of the clock); ids would overflow into the sign bit',
        {{layoutLiteral}}, {{layoutEndLiteral}}, seq
        USING ERRCODE = 'SC001';
    END IF;
    RAISE SQLSTATE 'SCR01';  -- roll back this block: releases the row lock, keeps the sequence
  EXCEPTION
    WHEN SQLSTATE 'SCR01' THEN  -- exactly this code: 'SC000' would be the whole SC class
      NULL;
    WHEN undefined_table THEN  -- only a lock table missing raises it in this block
      RAISE EXCEPTION 'next_id: a lock table of sequence % is missing from schema %', seq, {{controlLiteral}}
        USING ERRCODE = 'SC005', HINT = 'Run shardctl init, which restores the control schema''s locks.';
    WHEN object_not_in_prerequisite_state THEN
      -- The condition is the whole class 55: a lock wait cut by lock_timeout (55P03) is in it too,
      -- and is raised as it is. Only currval() raises 55000 itself in this block.
      IF SQLSTATE <> '55000' THEN
        RAISE;
      END IF;
      RAISE EXCEPTION 'next_id: this session has not drawn from sequence %, so it may not move it', seq
        USING ERRCODE = 'SC006',
              HINT = 'Call next_id(), which draws with your own rights (USAGE or UPDATE on the sequence).';
  END;
  -- The id, as in next_id_fast below.
  RETURN pos + (pos >> {{sequenceBits}}) * {{idMinusPositionPerMs}} + (shard::bigint << {{sequenceBits}});
END
$next_id_locked$;

-- Explicitly, whatever the owner's default privileges: every role that may insert into a shard
-- table reaches this function through next_id().
GRANT EXECUTE ON FUNCTION {{control}}.next_id_locked(regclass, integer) TO PUBLIC;
-- Which locks it takes: src/fleet/control.ts reads this to finish a change-over.
COMMENT ON FUNCTION {{control}}.next_id_locked(regclass, integer) IS {{slowPathCommentLiteral}};

-- Fast path (no lock) as a PL/pgSQL function: the readable form of the condition and the id that
-- next_id() (sql/next_id_shard.sql) computes as one SQL expression inlined into the calling
-- statement (one comparison there, accepting the same positions; a test holds the two equal), so
-- next_id() itself calls no PL/pgSQL on the fast path.
-- It turns a position drawn by next_id() into an id when it is not more than
-- {{lagMs}} ms behind the clock, that is when pos >= (now_ms - {{lagMs}}) << {{sequenceBits}}.
-- Written as a timestamp comparison because that is the cheapest exact form of it:
--   clock_timestamp() < epoch + ((pos >> {{sequenceBits}}) + {{lagMs}} + 1) ms
--   <=> now_ms < (pos >> {{sequenceBits}}) + {{lagMs}} + 1   (now_ms is the clock rounded down)
--   <=> pos >= (now_ms - {{lagMs}}) << {{sequenceBits}}
-- (timestamptz + interval adds whole microseconds; no floating point is involved.) A position
-- ahead of the clock is used as is: under a burst of more than 2^sequenceBits ids per
-- millisecond the ids run ahead of the clock instead of repeating, and a clock that steps
-- backwards never makes the sequence go back. The range checks come first so that the timestamp
-- arithmetic never sees a position outside the layout.
-- The id is ((pos >> {{sequenceBits}}) << {{timeShift}}) | (shard << {{sequenceBits}}) | (pos & {{sequenceMask}}), computed
-- as pos + (pos >> {{sequenceBits}}) * (2^{{timeShift}} - 2^{{sequenceBits}}) + (shard << {{sequenceBits}}): the same number (the
-- position's millisecond moves up by {{shardBits}} bits, its counter stays, the shard fills the gap),
-- one operator fewer, and no overflow for a position inside the layout.
-- One PL/pgSQL statement: each statement costs about as much as nextval() itself.
-- Nothing calls it on the way to an id: it documents the inlined condition, and tests compare the
-- two. Called with a position just drawn by next_id(); any other position makes no promise.
CREATE OR REPLACE FUNCTION {{control}}.next_id_fast(seq regclass, shard integer, pos bigint)
RETURNS bigint
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $next_id_fast$
BEGIN
  RETURN CASE
    WHEN pos >= {{minPosition}} AND pos <= {{maxPosition}}
     AND pg_catalog.clock_timestamp() < {{acceptBeforeLiteral}}::timestamptz + (pos >> {{sequenceBits}}) * interval '1 millisecond'
    THEN pos + (pos >> {{sequenceBits}}) * {{idMinusPositionPerMs}} + (shard::bigint << {{sequenceBits}})
    ELSE {{control}}.next_id_locked(seq, shard)
  END;
END
$next_id_fast$;
