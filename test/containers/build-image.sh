#!/usr/bin/env bash
# Builds the local PostgreSQL test image (no registry needed): a minimal Debian bookworm root with
# postgresql-15 from the Debian mirror apt already uses, an entrypoint that behaves like the
# official image's, imported with `docker import`.
#
#   test/containers/build-image.sh [image]      default: shardctl-test-postgres:15
#
# Needs root, debootstrap and a Docker engine. SHARDCTL_DEBIAN_MIRROR overrides the mirror.
# About 3 minutes; test/containers/ensure-image.sh calls it only when the image is missing.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
image="${1:-${SHARDCTL_TEST_IMAGE:-shardctl-test-postgres:15}}"

# The mirror apt is configured with (deb822 .sources or one-line sources.list), not a security one.
mirror="${SHARDCTL_DEBIAN_MIRROR:-}"
if [ -z "$mirror" ]; then
  mirror="$(
    { grep -hs '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}' || true
      grep -hs '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list | awk '{ for (i = 2; i <= NF; i++) if ($i !~ /^\[/ && $i !~ /\]$/) { print $i; break } }' || true
    } | grep -v security | head -n 1 || true
  )"
fi
if [ -z "$mirror" ]; then
  echo "build-image: no Debian mirror in /etc/apt/sources.list*; set SHARDCTL_DEBIAN_MIRROR" >&2
  exit 1
fi
command -v debootstrap >/dev/null || { echo 'build-image: debootstrap is not installed (apt-get install debootstrap)' >&2; exit 1; }

root="$(mktemp -d /var/tmp/shardctl-pg-root.XXXXXX)"
trap 'rm -rf "$root"' EXIT
echo "build-image: debootstrap bookworm with postgresql-15 (a few minutes)"
debootstrap --variant=minbase --include=postgresql-15 bookworm "$root" "$mirror" >"$root.log" 2>&1 \
  || { tail -n 30 "$root.log" >&2; rm -f "$root.log"; exit 1; }
rm -f "$root.log"

install -m 0755 "$here/entrypoint.sh" "$root/usr/local/bin/docker-entrypoint.sh"
# pg_isready and the server binaries first on PATH (Debian keeps them under /usr/lib/postgresql).
bindir="/usr/lib/postgresql/15/bin"
[ -x "$root$bindir/pg_isready" ] || { echo "build-image: $bindir/pg_isready missing in the root" >&2; exit 1; }
# Smaller image: apt lists, caches, docs and the package's own cluster are not needed.
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/* "$root"/usr/share/doc/* "$root"/usr/share/man/* \
  "$root"/var/lib/postgresql/15 "$root"/etc/postgresql/15

tar -C "$root" -c . | docker import \
  --change "ENV PATH=$bindir:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
  --change 'ENV PGDATA=/var/lib/postgresql/data' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'EXPOSE 5432' \
  --change 'ENTRYPOINT ["/usr/local/bin/docker-entrypoint.sh"]' \
  --change 'CMD ["postgres"]' \
  - "$image" >/dev/null
echo "build-image: built $image"
