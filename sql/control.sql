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
