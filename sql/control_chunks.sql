-- The chunks of a move's copy (src/moves/chunks.ts), on the target: a large table is copied in
-- ranges of its primary key's first column, each committed with its row here in the same
-- transaction, so a run cut off goes on with the chunks not copied yet. {{control}} is the control
-- schema name (always "shardctl"), filled in by src/pg/template.ts. Idempotent.
CREATE TABLE IF NOT EXISTS {{control}}.move_chunks (
  move_id    text NOT NULL,
  -- The table, schema-qualified and quoted, as the move names it.
  table_name text NOT NULL,
  chunk      integer NOT NULL,
  -- The first column of the primary key, quoted; the chunk holds the rows with lo <= key < hi
  -- (the key's text form, read back as a literal of the column's type; NULL: no bound).
  key_column text NOT NULL,
  lo         text,
  hi         text,
  copied     boolean NOT NULL DEFAULT false,
  rows       bigint,
  bytes      bigint,
  PRIMARY KEY (move_id, table_name, chunk)
);
