CREATE SEQUENCE likes_id_seq;
CREATE TABLE likes (
  id         bigint PRIMARY KEY DEFAULT next_id('likes_id_seq'),
  photo_id   bigint NOT NULL,
  user_id    bigint NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now()
);
ALTER SEQUENCE likes_id_seq OWNED BY likes.id;
