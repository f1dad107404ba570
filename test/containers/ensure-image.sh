#!/usr/bin/env bash
# Before the suite runs on testcontainers: removes containers a killed earlier run left (labelled
# org.shardctl.test), and builds the local test image when it is the one chosen and it is missing.
# Another SHARDCTL_TEST_IMAGE (e.g. postgres:17) is left to testcontainers, which pulls it if needed.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
local_image='shardctl-test-postgres:15'
image="${SHARDCTL_TEST_IMAGE:-$local_image}"

if ! docker info >/dev/null 2>&1; then
  echo 'test:containers: no Docker engine answers (start dockerd, or see README "Tests")' >&2
  exit 1
fi
leftovers="$(docker ps -aq --filter label=org.shardctl.test=true)"
if [ -n "$leftovers" ]; then
  echo "test:containers: removing $(echo "$leftovers" | wc -l) container(s) left by an earlier run"
  docker rm -f $leftovers >/dev/null
fi
if [ "$image" = "$local_image" ] && ! docker image inspect "$image" >/dev/null 2>&1; then
  "$here/build-image.sh" "$image"
fi
