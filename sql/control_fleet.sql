-- Control schema version 2: where the shards are, as the fleet says (src/fleet/placement.ts).
-- Idempotent; run after sql/control.sql by src/fleet/control.ts.
-- {{control}} is the control schema name (always "shardctl"), filled in by src/pg/template.ts.

-- The fleet this host belongs to (made by the first init; hosts of two fleets are never mixed),
-- the name the fleet knows this host by, and the newest placement version this host has recorded.
CREATE TABLE IF NOT EXISTS {{control}}.fleet (
  singleton         boolean PRIMARY KEY DEFAULT true CHECK (singleton),
  fleet_id          uuid NOT NULL,
  host_name         text NOT NULL,
  placement_version bigint NOT NULL DEFAULT 0 CHECK (placement_version >= 0)
);

-- The fleet's hosts as this host last learnt them: name and address (a connection URL without
-- user or password: every reader brings its own credentials). Written by init on every host.
CREATE TABLE IF NOT EXISTS {{control}}.hosts (
  name    text PRIMARY KEY,
  address text NOT NULL
);

-- This host's copy of the whole placement: which host holds each shard, and the placement version
-- of the switch that put it there. Which shards a host holds is decided by its own shards rows
-- (state 'active'); this copy tells a reader where the shards of a host it cannot reach, or of a
-- shard that moved away from here, are. A move's switch writes it on the target in the
-- transaction that activates the shards, then on the source; init writes it on every host.
CREATE TABLE IF NOT EXISTS {{control}}.placement (
  shard   integer PRIMARY KEY CHECK (shard >= 0),
  host    text NOT NULL,
  version bigint NOT NULL CHECK (version >= 0)
);
