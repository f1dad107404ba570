-- Photos, one table per shard schema. next_id() is the shard's own id function (installed by
-- shardctl); the sequence holds its position and must not be used for anything else.
CREATE SEQUENCE photos_id_seq;
CREATE TABLE photos (
  id         bigint PRIMARY KEY DEFAULT next_id('photos_id_seq'),
  user_id    bigint NOT NULL,
  image_url  text NOT NULL,
  caption    text,
  created_at timestamptz NOT NULL DEFAULT now()
);
ALTER SEQUENCE photos_id_seq OWNED BY photos.id;
