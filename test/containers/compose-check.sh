#!/usr/bin/env bash
# CI's check of docker-compose.yml with shardctl.docker.yaml: the four hosts up (the local test
# image unless SHARDCTL_PG_IMAGE says otherwise), init, an online move of a shard from pg1 to pg2
# (replication inside the compose network, by service name), status, then everything down.
# The config is copied to a temp folder: a move rewrites its map.
set -euo pipefail
cd "$(dirname "$0")/../.."
export SHARDCTL_PG_IMAGE="${SHARDCTL_PG_IMAGE:-shardctl-test-postgres:15}"
export SHARDCTL_PG_PASSWORD="${SHARDCTL_PG_PASSWORD:-shardctl}"
if docker compose version >/dev/null 2>&1; then compose=(docker compose); else compose=(docker-compose); fi
compose+=(-p shardctl-compose-check -f "$PWD/docker-compose.yml")

work="$(mktemp -d)"
down() { "${compose[@]}" down -v --remove-orphans >/dev/null 2>&1 || true; rm -rf "$work"; }
trap down EXIT
cp shardctl.docker.yaml "$work/shardctl.yaml"
cp -r migrations "$work/migrations"

echo "compose check: four hosts from $SHARDCTL_PG_IMAGE"
"${compose[@]}" up -d
for service in pg1 pg2 pg3 pg4; do
  id="$("${compose[@]}" ps -q "$service")"
  for _ in $(seq 1 60); do
    [ "$(docker inspect -f '{{.State.Health.Status}}' "$id")" = healthy ] && break
    sleep 1
  done
  [ "$(docker inspect -f '{{.State.Health.Status}}' "$id")" = healthy ] || { "${compose[@]}" logs "$service" >&2; exit 1; }
done

npx shardctl init -c "$work/shardctl.yaml"
"${compose[@]}" exec -T pg1 psql -q -v ON_ERROR_STOP=1 -U postgres -d app \
  -c "insert into insta5.photos (user_id, image_url) select g, 'compose-' || g from generate_series(1, 100) g"
npx shardctl move-shard 5 --to pg2 --yes -c "$work/shardctl.yaml" | tee "$work/move.out"
grep -q '^shard 5 moved from pg1 to pg2: 100 rows verified' "$work/move.out"
[ "$("${compose[@]}" exec -T pg2 psql -qAt -U postgres -d app -c "select count(*) from insta5.photos")" = 100 ]
grep -q 'shards: "0-4,6-511"' "$work/shardctl.yaml" || { echo 'compose check: the map does not show shard 5 moved' >&2; exit 1; }
npx shardctl status -c "$work/shardctl.yaml"
echo 'compose check: ok'
