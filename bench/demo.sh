#!/bin/sh
# piloop's main job end to end on the embedded defaults: the embedded Redis, the local CAS,
# and the daemon's own worker `serve`. Run by `make demo`.
set -eu
: "${PILOOP_HOME:?set PILOOP_HOME}"
trap 'piloop stop >/dev/null 2>&1 || true' EXIT
piloop stop >/dev/null 2>&1 || true
echo "== piloop init (home $PILOOP_HOME)"
piloop init
echo "== three evaluations on the serve worker"
ids=""
for n in 1 2 3; do
  id=$(piloop job submit -- sh -c "echo evaluating candidate $n on \$(hostname); echo score=0.$((n * 3))")
  echo "submitted $id"
  ids="$ids $id"
done
piloop job wait $ids
echo "== the first job, and its log from the CAS"
first=$(echo $ids | cut -d' ' -f1)
piloop job show "$first"
for addr in $(piloop job show "$first" --json | python3 -c 'import json,sys; print(" ".join(json.load(sys.stdin)["log"]))'); do
  piloop cas get "$addr"
done
echo "== workers and status"
piloop worker list
piloop status
