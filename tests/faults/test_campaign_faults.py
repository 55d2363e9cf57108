"""Faults table, for a campaign: a worker dies during a run (the run ends worker_lost, is not evaluated, and the
campaign launches another) and during an evaluation (queued again; the partial output is never scored)."""

from __future__ import annotations

import json

from tests.helpers.redis import wait_for
from tests.helpers.workers import TOLERATION, token
from tests.integration.test_campaigns import make_repo, show


def test_a_worker_dying_during_a_run_and_during_its_evaluation_loses_no_score_and_scores_no_partial(
    server, workers, tmp_path
):
    d = server
    make_repo(tmp_path / "repo", big=10)
    flags = tmp_path / "flags"
    flags.mkdir()
    # the first agent and the first evaluation hang until their worker is killed; the first evaluation has
    # already printed a score line by then (partial output), which must never become the run's score
    agent = (
        f"if [ ! -e {flags}/agent ]; then touch {flags}/agent; sleep 60; fi; "
        'echo x >> runs.txt && git commit -qam "run $PILOOP_JOB"'
    )
    ev = f"if [ ! -e {flags}/eval ]; then touch {flags}/eval; echo score=999; sleep 60; fi; echo score=5"
    w1 = workers(d, token(d, "w1", "--pool", "gpu")).start()
    p = d.cli(
        "campaign",
        "create",
        "faulty",
        "--repo",
        str(tmp_path / "repo"),
        "--agents",
        "1",
        "--agent-pool",
        "gpu",
        "--eval-pool",
        "gpu",
        "--agent-cmd",
        agent,
        "--eval-cmd",
        ev,
    )
    assert p.returncode == 0, p.stderr

    wait_for(lambda: (flags / "agent").exists(), 30, what="the first agent to start")
    first = show(d, "faulty")["runs"][0]["job"]
    w1.kill()
    w2 = workers(d, token(d, "w2", "--pool", "gpu")).start()
    # the lost run ends worker_lost (after toleration), and the campaign launches a second run on w2
    wait_for(lambda: len(show(d, "faulty")["runs"]) >= 2, TOLERATION + 20, what="a second run")
    wait_for(lambda: (flags / "eval").exists(), 30, what="the second run's evaluation to start")
    w2.kill()
    workers(d, token(d, "w3", "--pool", "gpu")).start()
    second_id = sorted(show(d, "faulty")["runs"], key=lambda r: r["created_ms"])[1]["job"]
    wait_for(
        lambda: any(r["job"] == second_id and r["score"] is not None for r in show(d, "faulty")["runs"]),
        TOLERATION + 30,
        what="the second run scored",
    )
    assert d.cli("campaign", "pause", "faulty").returncode == 0
    c = show(d, "faulty")
    runs = {r["job"]: r for r in c["runs"]}
    lost = runs[first]
    assert lost["state"] == "worker_lost" and lost["evaluation"] == "" and lost["score"] is None, lost
    lost_job = json.loads(d.cli("job", "show", first, "--json").stdout)
    assert lost_job["attempts"] == 0  # an agent lost with its worker is not an attempt
    second = sorted(c["runs"], key=lambda r: r["created_ms"])[1]
    assert second["score"] == 5.0, second  # never 999, the line its killed evaluation had printed
    ev_job = json.loads(d.cli("job", "show", second["evaluation"], "--json").stdout)
    assert ev_job["state"] == "succeeded" and ev_job["attempts"] == 1 and ev_job["worker"] == "w3", ev_job
    assert all(r["score"] in (None, 5.0) for r in c["runs"])
