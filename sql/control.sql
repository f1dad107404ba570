-- The control schema shardctl keeps on every host: which shards live here, the id layout they
-- were built with, and which migrations each shard has. Idempotent: safe to run again.
-- {{control}} is the control schema name (always "shardctl"), filled in by src/pg/template.ts.
CREATE SCHEMA IF NOT EXISTS {{control}};

COMMENT ON SCHEMA {{control}} IS 'shardctl control schema: shard placement, id layout and migration records. Managed by shardctl; do not edit by hand.';

-- One row: the layout every shard on this host was built with. shardctl refuses to run when the
-- config disagrees: a different epoch or bit split would make new ids collide with old ones, and a
-- different shard count or prefix would route keys to the wrong shard.
CREATE TABLE IF NOT EXISTS {{control}}.layout (
  singleton     boolean PRIMARY KEY DEFAULT true CHECK (singleton),
  control_version integer NOT NULL,
  schema_prefix text NOT NULL,
  shard_count   integer NOT NULL CHECK (shard_count > 0),
  epoch_ms      bigint NOT NULL,
  shard_bits    integer NOT NULL,
  sequence_bits integer NOT NULL,
  created_at    timestamptz NOT NULL DEFAULT now()
);

-- The shards this host holds. A row is written in the same transaction that creates the schema
-- and its next_id(), so a schema recorded here is always complete.
CREATE TABLE IF NOT EXISTS {{control}}.shards (
  shard       integer PRIMARY KEY CHECK (shard >= 0),
  schema_name name NOT NULL UNIQUE,
  state       text NOT NULL DEFAULT 'active' CHECK (state IN ('active', 'fenced', 'incoming')),
  created_at  timestamptz NOT NULL DEFAULT now()
);

-- One row per migration applied to a shard, written in the migration's own transaction.
CREATE TABLE IF NOT EXISTS {{control}}.migrations (
  shard       integer NOT NULL,
  version     integer NOT NULL CHECK (version > 0),
  name        text NOT NULL,
  checksum    text NOT NULL,
  applied_at  timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (shard, version)
);

-- Shard moves (shardctl move-shard). The same row is kept on the source and the target host and
-- updated after every step, so a move interrupted at any point can be resumed or undone from what
-- the hosts say, not from memory.
CREATE TABLE IF NOT EXISTS {{control}}.moves (
  move_id    text PRIMARY KEY,
  shard      integer NOT NULL,
  source     text NOT NULL,
  target     text NOT NULL,
  mode       text NOT NULL CHECK (mode IN ('online', 'offline')),
  step       text NOT NULL,
  status     text NOT NULL CHECK (status IN ('running', 'done', 'aborted')),
  started_at timestamptz NOT NULL DEFAULT now(),
  updated_at timestamptz NOT NULL DEFAULT now(),
  detail     jsonb NOT NULL DEFAULT '{}'
);
CREATE UNIQUE INDEX IF NOT EXISTS moves_one_running_per_shard ON {{control}}.moves (shard) WHERE status = 'running';
-- A move carries a batch of shards from one source to one target; `shard` is the first of them.
ALTER TABLE {{control}}.moves ADD COLUMN IF NOT EXISTS shards integer[];

-- The shards of the running moves, one row each: a shard is in at most one running move. Written
-- with the move's row, removed when the move is done or aborted.
CREATE TABLE IF NOT EXISTS {{control}}.move_shards (
  shard   integer PRIMARY KEY,
  move_id text NOT NULL
);

-- Objects shardctl creates outside its own schemas and must remove again (the reachability probe's
-- subscription), recorded before they are created: status lists what is left, gc and
-- move-shard --abort drop it.
CREATE TABLE IF NOT EXISTS {{control}}.objects (
  name       text PRIMARY KEY,
  kind       text NOT NULL CHECK (kind IN ('probe-subscription')),
  created_at timestamptz NOT NULL DEFAULT now()
);

-- Written on the source in the fencing transaction and replicated with the shard's tables: when the
-- target sees the marker, it has applied every change committed before the fence (logical
-- replication applies transactions in commit order).
CREATE TABLE IF NOT EXISTS {{control}}.move_markers (
  move_id text NOT NULL,
  kind    text NOT NULL,
  at      timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (move_id, kind)
);

-- The fence: a statement trigger on every table of a moved-away shard. Every write fails with
-- SQLSTATE SC100, naming the shard and its new host, so an application can catch it and reload its map.
CREATE OR REPLACE FUNCTION {{control}}.shard_fenced() RETURNS trigger
LANGUAGE plpgsql AS $fence$
BEGIN
  RAISE EXCEPTION 'shard % has moved to host %; writes to this copy are refused', TG_ARGV[0], TG_ARGV[1]
    USING ERRCODE = 'SC100',
          DETAIL = format('shardctl-moved shard=%s host=%s', TG_ARGV[0], TG_ARGV[1]),
          HINT = 'Reload the shard map and retry on the new host.';
END
$fence$;

-- The guard in the views left under a moved shard's old name (move-shard cleanup): a read by a
-- client on the old map fails with the same SC100 as a write, instead of returning the old copy's
-- rows. STABLE so the planner evaluates it once, as a one-time filter, even on an empty table.
CREATE OR REPLACE FUNCTION {{control}}.shard_moved(shard text, host text) RETURNS boolean
LANGUAGE plpgsql STABLE AS $moved$
BEGIN
  RAISE EXCEPTION 'shard % has moved to host %; this is its old copy', shard, host
    USING ERRCODE = 'SC100',
          DETAIL = format('shardctl-moved shard=%s host=%s', shard, host),
          HINT = 'Reload the shard map and retry on the new host.';
END
$moved$;
