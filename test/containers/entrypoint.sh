#!/bin/sh
# What the official postgres image's docker-entrypoint.sh does, for the tests' local image:
# on an empty PGDATA, initdb with POSTGRES_USER / POSTGRES_PASSWORD, create POSTGRES_DB, accept
# password logins (and replication) from other hosts, listen on every address; then run the server
# as the postgres user. Like the official image, pg_isready over TCP fails until the real server
# is up: the set-up server listens on the Unix socket only.
set -eu

if [ "${1#-}" != "$1" ]; then set -- postgres "$@"; fi

: "${PGDATA:=/var/lib/postgresql/data}"
export PGDATA

if [ "$1" = postgres ] && [ "$(id -u)" = 0 ]; then
  mkdir -p "$PGDATA" /var/run/postgresql
  chown -R postgres:postgres "$PGDATA" /var/run/postgresql
  chmod 700 "$PGDATA"
  chmod 2775 /var/run/postgresql
  exec setpriv --reuid=postgres --regid=postgres --init-groups "$0" "$@"
fi

if [ "$1" = postgres ] && [ ! -s "$PGDATA/PG_VERSION" ]; then
  user="${POSTGRES_USER:-postgres}"
  db="${POSTGRES_DB:-$user}"
  if [ -z "${POSTGRES_PASSWORD:-}" ]; then
    echo 'entrypoint: POSTGRES_PASSWORD is not set (this image has no trust mode)' >&2
    exit 1
  fi
  pwfile="$(mktemp)"
  printf '%s\n' "$POSTGRES_PASSWORD" > "$pwfile"
  initdb --username="$user" --pwfile="$pwfile" --auth-local=trust --auth-host=scram-sha-256 \
    --encoding=UTF8 --locale=C.UTF-8 ${POSTGRES_INITDB_ARGS:-} >/dev/null
  rm -f "$pwfile"
  {
    echo
    echo 'host all all all scram-sha-256'
    echo 'host replication all all scram-sha-256'
  } >> "$PGDATA/pg_hba.conf"
  echo "listen_addresses = '*'" >> "$PGDATA/postgresql.conf"
  if [ "$db" != postgres ]; then
    pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start >/dev/null
    psql -v ON_ERROR_STOP=1 --username "$user" --dbname postgres \
      -c "create database \"$db\"" >/dev/null
    pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
  fi
  echo 'entrypoint: PostgreSQL init process complete; ready for start up.'
fi

exec "$@"
