#!/bin/sh
# The stack's base image, piloop-base:bookworm, made offline from Debian's archive: `debootstrap --variant=minbase
# bookworm` (about three minutes) into a tarball kept in $PILOOP_STACK_CACHE (default /var/cache/piloop-stack), then
# `docker import`. A second run on the same machine only imports the tarball (or finds the image there already).
# The mirror is the first Debian one this machine's apt uses (PILOOP_STACK_MIRROR overrides it).
set -eu
IMAGE=${PILOOP_STACK_BASE:-piloop-base:bookworm}
CACHE=${PILOOP_STACK_CACHE:-/var/cache/piloop-stack}
TAR="$CACHE/bookworm-minbase.tar"

if docker image inspect "$IMAGE" >/dev/null 2>&1; then
  echo "stack: $IMAGE is there"
  exit 0
fi
if [ ! -s "$TAR" ]; then
  mirror=${PILOOP_STACK_MIRROR:-$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources \
    2>/dev/null | grep -o -E 'https?://[^ ]*/debian/?( |$)' | grep -v security | head -n 1 | tr -d ' ')}
  mirror=${mirror:-http://deb.debian.org/debian}
  mkdir -p "$CACHE"
  root=$(mktemp -d "$CACHE/rootfs.XXXXXX")
  trap 'rm -rf "$root"' EXIT
  echo "stack: debootstrap --variant=minbase bookworm from $mirror (once; about three minutes)"
  start=$(date +%s)
  debootstrap --variant=minbase bookworm "$root" "$mirror" >"$CACHE/debootstrap.log" 2>&1 \
    || { tail -n 20 "$CACHE/debootstrap.log" >&2; exit 1; }
  # what a container never needs: the package lists and the archive's downloads
  rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/archives/*.deb
  tar -C "$root" -c . >"$TAR.part" && mv "$TAR.part" "$TAR"
  echo "stack: base tarball in $(( $(date +%s) - start ))s: $TAR"
fi
docker import "$TAR" "$IMAGE" >/dev/null
echo "stack: imported $IMAGE"
