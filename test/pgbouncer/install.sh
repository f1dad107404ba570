#!/usr/bin/env bash
# Installs PgBouncer (Debian's package) for the tests that run behind a transaction pooler
# (test/integration/pgbouncer.test.ts), when it is missing: as root with apt-get (a CI machine, a
# developer's container). Elsewhere it says how to install it and exits 1, since those tests need it.
set -euo pipefail
if command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ]; then exit 0; fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "pgbouncer: installing Debian's package (tests behind a transaction pooler)" >&2
  DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq pgbouncer >&2
  # The package may start its own service; the tests start theirs.
  (service pgbouncer stop || true) >/dev/null 2>&1
  exit 0
fi
echo "pgbouncer: not installed; the tests behind a transaction pooler need it (apt-get install pgbouncer, brew install pgbouncer)" >&2
exit 1
