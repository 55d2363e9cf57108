#!/bin/sh
# piloop's main job end to end on the embedded defaults: the embedded Redis, the local CAS, and the daemon's own
# worker `serve`. A campaign: a small git repo, agents that each try to improve it (a commit) and note what they
# did in the shared workspace, and an evaluation that scores each run; then its runs ranked. Run by `make demo`.
set -eu
: "${PILOOP_HOME:?set PILOOP_HOME}"
work=$(mktemp -d)
trap 'piloop stop >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
[ -e "$PILOOP_HOME/piloop.pid" ] && { piloop stop >/dev/null 2>&1 || true; }
echo "piloop's demo: a daemon on the embedded defaults runs a campaign on its own worker, \`serve\` (agents that"
echo "each commit a guess to a small git repo, and an evaluation that scores each run) until 6 runs are scored,"
echo "then one evaluation on its own; about half a minute. A job that waits says why (a waiting: line)."
echo "== piloop init (home $PILOOP_HOME)"
piloop init

echo "== a repo to improve: guess.txt holds a number; the closer to 42, the better"
repo="$work/repo"
git init -q -b main "$repo"
echo 0 > "$repo/guess.txt"
git -C "$repo" add guess.txt
git -C "$repo" -c user.name=demo -c user.email=demo@example.invalid commit -qm "a first guess"
mkdir "$work/workspace"
echo "the target is a number between 0 and 100" > "$work/workspace/README"

# the agent moves the guess by a random step from where its run started (the best run so far), commits it,
# and notes it in the shared workspace; the evaluation prints the score on its last line
agent='g=$(cat guess.txt); s=$(od -An -N1 -tu1 /dev/urandom | tr -d " "); g=$((g + s % 25)); echo $g > guess.txt; '\
'git commit -qam "guess $g"; echo "$PILOOP_JOB guessed $g" > "$PILOOP_WORKSPACE/$PILOOP_JOB.note"'
eval_cmd='g=$(cat guess.txt); d=$((g > 42 ? g - 42 : 42 - g)); echo "guess $g is $d away"; echo "score=$((100 - d))"'

echo "== a campaign: two agents live at a time on the serve worker"
# a run before this one left its campaign (to look at afterwards): start afresh, so the demo runs again and again
piloop campaign rm guess --force >/dev/null 2>&1 || true
piloop campaign create guess --repo "$repo" --workspace "$work/workspace" --agents 2 \
  --agent-cmd "$agent" --eval-cmd "$eval_cmd"
echo "== waiting for 6 scored runs (about 15 s on an idle machine)"
piloop campaign wait guess --runs 6 --timeout 5m
piloop campaign pause guess
echo "== the campaign, its runs ranked by score"
piloop campaign show guess --runs 10

echo "== an evaluation on its own: its log as it comes (piloop attach), then its record"
id=$(piloop job submit -- sh -c 'echo evaluating on $(hostname); echo score=0.9')
piloop attach "$id"
piloop job show "$id"
echo "== workers and status"
piloop worker list
piloop status
