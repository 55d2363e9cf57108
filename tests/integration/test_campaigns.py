"""Campaigns end to end: a real git repo, a real `piloop serve` (its own worker runs the evaluations) and two
remote `piloop worker`s running the agents; runs, branches, workspace, ranked scores and the bytes moved."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from piloop_common.cas import open_store
from piloop_common.cas.workspace import load
from piloop_common.config.load import load_settings
from tests.helpers.redis import wait_for
from tests.helpers.workers import token

# each run appends a line (its job id) and commits; the score is the number of lines, so runs that start from
# the best run so far score higher and higher
AGENT = (
    'echo "$PILOOP_JOB" >> runs.txt && git add runs.txt && git commit -qm "run $PILOOP_JOB" '
    '&& echo "$PILOOP_JOB" > "$PILOOP_WORKSPACE/note-$PILOOP_JOB.txt" && rm -f "$PILOOP_WORKSPACE/drop.txt"'
)
EVAL = 'echo "evaluating $(git rev-parse HEAD)"; echo "score=$(wc -l < runs.txt)"'
GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}


def make_repo(path: Path, big: int = 300_000) -> str:
    """A repo with one commit, holding an incompressible file so the whole-repo bundle is large."""
    path.mkdir(parents=True)
    env = {**os.environ, **GIT_ENV}
    subprocess.run(["git", "init", "-q", "-b", "main", str(path)], check=True, env=env)
    (path / "big.bin").write_bytes(os.urandom(big))
    (path / "runs.txt").write_text("")
    subprocess.run(["git", "add", "-A"], cwd=path, check=True, env=env)
    subprocess.run(["git", "commit", "-qm", "base"], cwd=path, check=True, env=env)
    return subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=path, check=True, env=env, capture_output=True, text=True
    ).stdout.strip()


def show(d, name: str) -> dict:
    p = d.cli("campaign", "show", name, "--json")
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def job(d, jid: str) -> dict:
    p = d.cli("job", "show", jid, "--json")
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_a_campaign_runs_agents_on_two_workers_and_ranks_their_scores(server, workers, tmp_path):
    d = server
    base = make_repo(tmp_path / "repo")
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "shared.txt").write_text("for every agent\n")
    (ws / "drop.txt").write_text("the first run deletes me\n")
    for name in ("gpu1", "gpu2"):  # a token names its worker
        workers(d, token(d, name, "--pool", "gpu")).start()

    p = d.cli(
        "campaign",
        "create",
        "demo",
        "--repo",
        str(tmp_path / "repo"),
        "--agent-cmd",
        AGENT,
        "--eval-cmd",
        EVAL,
        "--agents",
        "2",
        "--agent-pool",
        "gpu",
        "--eval-pool",
        "serve",
        "--workspace",
        str(ws),
    )
    assert p.returncode == 0, p.stderr
    assert "campaign demo: 2 agent(s) on pool gpu" in p.stdout
    assert p.stdout.rstrip().endswith(" 2 workspace file(s)")  # at its creation: its runs add to it from now on
    c = show(d, "demo")
    assert c["base"] == base and c["bundle_bytes"] > 300_000 and c["workspace_files"] >= 2

    # wait for six scored runs (three waves of two agents), one of them built on an earlier run: an agent starts
    # from the best run scored when it launches, so on a loaded machine the first waves may all start from the base
    def built_on() -> bool:
        scores = [r["score"] for r in show(d, "demo")["runs"] if r["score"] is not None]
        return len(scores) >= 6 and max(scores) >= 2

    wait_for(built_on, timeout=180, what="six scored runs, one of them built on an earlier run")
    assert d.cli("campaign", "pause", "demo").returncode == 0
    assert show(d, "demo")["queued"] == 0  # pausing withdrew the agents waiting for a slot
    wait_for(lambda: show(d, "demo")["live"] == 0, timeout=60, what="agents ended")
    c = show(d, "demo")
    scored = [r for r in c["runs"] if r["score"] is not None]
    # ranked: best first, and the scores are what each run's history holds (lines appended since the base)
    assert [r["score"] for r in scored] == sorted((r["score"] for r in scored), reverse=True)
    assert c["best"] == scored[0]["score"] >= 2  # later runs built on earlier ones

    repo = d.home / "campaigns" / "demo" / "repo.git"
    branches = subprocess.run(
        ["git", "for-each-ref", "--format=%(refname:short) %(objectname)", "refs/heads/runs"],
        cwd=repo,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\n")
    heads = dict(line.split() for line in branches if line)
    for r in scored:
        assert heads[r["branch"]] == r["head"]  # the run's commits are its branch in the campaign's repo
        ev = job(d, r["evaluation"])
        assert ev["state"] == "succeeded" and ev["result"]["score"] == r["score"]
        count = subprocess.run(
            ["git", "show", f"{r['head']}:runs.txt"], cwd=repo, capture_output=True, text=True, check=True
        ).stdout.count("\n")
        assert count == r["score"]
        assert (
            r["job"]
            in subprocess.run(
                ["git", "log", "-1", "--format=%s", r["head"]], cwd=repo, capture_output=True, text=True, check=True
            ).stdout
        )

    # the workspace: each integrated run's note is in it, the shared file kept, the deleted one gone
    store = open_store(load_settings(d.home).plugins.cas, d.home)
    manifest = load(c["workspace"], store)
    assert "shared.txt" in manifest and "drop.txt" not in manifest
    for r in scored:
        assert f"note-{r['job']}.txt" in manifest
        assert store.get_bytes(manifest[f"note-{r['job']}.txt"]).decode().strip() == r["job"]

    # bytes moved: each worker's first agent fetched the whole bundle; its later ones only what was newer
    runs_by_worker: dict[str, list[dict]] = {}
    for r in sorted(c["runs"], key=lambda r: r["created_ms"]):
        j = job(d, r["job"])
        if j["state"] != "cancelled":  # withdrawn by the pause before any worker took it
            runs_by_worker.setdefault(j["worker"], []).append(j["result"])
    assert len(runs_by_worker) == 2, runs_by_worker.keys()
    later = []
    for results in runs_by_worker.values():
        assert results[0]["fetched_bytes"] == c["bundle_bytes"]
        later += [res["fetched_bytes"] for res in results[1:]]
    assert later and all(b < c["bundle_bytes"] / 10 for b in later), later
    assert any(b > 0 for b in later), later  # at least one incremental bundle was fetched

    # `campaign list` and `status` agree
    p = d.cli("campaign", "list")
    assert p.returncode == 0 and "demo" in p.stdout and "paused" in p.stdout
    # removing it forgets it, keeps its jobs
    assert d.cli("campaign", "rm", "demo").returncode == 0
    assert d.cli("campaign", "show", "demo").returncode != 0
    assert job(d, scored[0]["job"])["state"] == "succeeded"
    assert not repo.exists()


def test_bad_campaign_input_is_refused_and_creates_nothing(daemon, tmp_path):
    d = daemon
    make_repo(tmp_path / "repo", big=10)
    not_git = tmp_path / "plain"
    not_git.mkdir()
    (not_git / "a.txt").write_text("x")
    cases = [
        (["--repo", str(not_git)], "not a git repo"),
        (["--repo", str(tmp_path / "repo"), "--agent-pool", "nope"], "--agent-pool nope: no such pool"),
        (["--repo", str(tmp_path / "repo"), "--eval-pool", "nope"], "--eval-pool nope: no such pool"),
        (["--repo", str(tmp_path / "repo"), "--secret", "MISSING"], "no secret named MISSING"),
        (["--repo", str(tmp_path / "nowhere")], "--repo"),
        (["--repo", str(tmp_path / "repo"), "--workspace", str(tmp_path / "nope")], "--workspace"),
        (["--repo", str(tmp_path / "repo"), "--agent-memory", "4X"], "--agent-memory '4X'"),
        (["--repo", str(tmp_path / "repo"), "--env", "NOEQUALS"], "--env 'NOEQUALS': write K=V"),
    ]
    for args, said in cases:
        p = d.cli("campaign", "create", "bad", *args, "--agent-cmd", "true", "--eval-cmd", "true")
        assert p.returncode != 0 and said in p.stderr, (args, p.stderr)
        assert "Traceback" not in p.stderr
    p = d.cli(
        "campaign", "create", "Bad Name", "--repo", str(tmp_path / "repo"), "--agent-cmd", "true", "--eval-cmd", "true"
    )
    assert p.returncode != 0 and "name" in p.stderr
    assert json.loads(d.cli("campaign", "list", "--json").stdout) == []
    # a job to an unknown pool is refused the same way, and nothing is queued
    p = d.cli("job", "submit", "--pool", "nope", "--", "true")
    assert p.returncode != 0 and "--pool nope: no such pool" in p.stderr and "Traceback" not in p.stderr
    assert json.loads(d.cli("job", "list", "--json").stdout) == []
    left = sorted(p.name for p in (d.home / "campaigns").glob("*")) if (d.home / "campaigns").exists() else []
    assert left == []  # no repo dir, no half-made clone


def test_an_eval_that_prints_no_score_fails_its_evaluation_and_scores_nothing(daemon, tmp_path):
    d = daemon
    make_repo(tmp_path / "repo", big=10)
    p = d.cli(
        "campaign",
        "create",
        "noscore",
        "--repo",
        str(tmp_path / "repo"),
        "--agents",
        "1",
        "--agent-cmd",
        'echo x >> runs.txt && git commit -qam "run"',
        "--eval-cmd",
        "echo all good",
    )
    assert p.returncode == 0, p.stderr
    wait_for(
        lambda: any(r["evaluation_state"] == "failed" for r in show(d, "noscore")["runs"]),
        timeout=60,
        what="a failed evaluation",
    )
    assert d.cli("campaign", "pause", "noscore").returncode == 0
    c = show(d, "noscore")
    r = next(r for r in c["runs"] if r["evaluation_state"] == "failed")
    assert r["score"] is None and "no score" in r["reason"]
    assert c["best"] is None
    ev = job(d, r["evaluation"])
    assert ev["state"] == "failed" and "score=<number>" in ev["reason"] and "score" not in ev["result"]
    # a second create of the same name is refused, the first untouched
    p = d.cli(
        "campaign", "create", "noscore", "--repo", str(tmp_path / "repo"), "--agent-cmd", "true", "--eval-cmd", "true"
    )
    assert p.returncode != 0 and "exists" in p.stderr
    assert show(d, "noscore")["agent_cmd"].startswith("echo x")
    p = d.cli("campaign", "rm", "noscore")
    assert p.returncode == 0 or "not ended" in p.stderr


def test_campaigns_sharing_one_agent_slot_take_turns(daemon, tmp_path):
    """The serve pool has one agent slot: two campaigns of one agent each both get runs, one at a time."""
    d = daemon
    make_repo(tmp_path / "repo", big=10)
    marker = tmp_path / "live"
    # each agent notes itself while it runs; a run with no commit is not evaluated
    agent = f'echo "$PILOOP_CAMPAIGN $PILOOP_JOB start" >> {marker}; sleep 0.3; echo "$PILOOP_CAMPAIGN $PILOOP_JOB end" >> {marker}'
    for name in ("a", "b"):
        p = d.cli(
            "campaign",
            "create",
            name,
            "--repo",
            str(tmp_path / "repo"),
            "--agents",
            "1",
            "--agent-cmd",
            agent,
            "--eval-cmd",
            "echo score=1",
        )
        assert p.returncode == 0, p.stderr
    wait_for(lambda: all(len(show(d, n)["runs"]) >= 3 for n in ("a", "b")), timeout=60, what="three runs each")
    for n in ("a", "b"):
        assert d.cli("campaign", "pause", n).returncode == 0
    wait_for(
        lambda: all(show(d, n)["live"] + show(d, n)["queued"] == 0 for n in ("a", "b")), timeout=30, what="agents ended"
    )
    lines = marker.read_text().split()
    events = [(lines[i], lines[i + 1], lines[i + 2]) for i in range(0, len(lines), 3)]
    running = 0
    for _, _, what in events:  # never two agents at once in the one slot
        running += 1 if what == "start" else -1
        assert running in (0, 1), events
    # they take turns once both exist (a's runs may end and start again while `campaign create b` runs) until the
    # first pause: a paused campaign's turn goes to the other
    starts = [c for c, _, what in events if what == "start"]
    first_b = starts.index("b")
    order = starts[max(0, first_b - 1) : first_b + 5]
    assert all(order[i] != order[i + 1] for i in range(len(order) - 1)), order
