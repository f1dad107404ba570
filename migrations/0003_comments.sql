CREATE SEQUENCE comments_id_seq;
CREATE TABLE comments (
  id         bigint PRIMARY KEY DEFAULT next_id('comments_id_seq'),
  photo_id   bigint NOT NULL,
  user_id    bigint NOT NULL,
  body       text NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now()
);
ALTER SEQUENCE comments_id_seq OWNED BY comments.id;
