"""Faults table: a worker dies during a run, or during an evaluation (SIGKILL of the worker's process group: the
job's supervisor, in a session of its own, lives on and fences the job); the job's supervisor dies alone."""

from __future__ import annotations

import time

from piloop_common.cas.local import LocalStore
from tests.helpers.jobprocs import kill, started, supervisor_of
from tests.helpers.redis import wait_for
from tests.helpers.workers import (
    FENCE_AFTER,
    KILL_GRACE,
    TOLERATION,
    events,
    marker_job,
    marker_runs,
    overlapping,
    pgid_alive,
    state,
    token,
    view,
)


def test_a_worker_dies_during_a_run_the_run_ends_worker_lost_not_an_attempt(server, workers, tmp_path):
    d, marker = server, tmp_path / "marker"
    w = workers(d, token(d, "wa")).start()
    job = marker_job(d, marker, kind="agent", seconds=1000)
    run = started(marker, job)
    state(d, job, "running")
    w.kill()
    killed = time.monotonic()
    # its supervisor fences it at its deadline, though the worker is gone: dead before the lease can end
    wait_for(
        lambda: not pgid_alive(run["pgid"]),
        FENCE_AFTER + KILL_GRACE + 2,
        interval=0.1,
        what="the agent's processes to be stopped by its supervisor",
    )
    v = state(d, job, "worker_lost", "succeeded", "failed", "lost", "queued", timeout=TOLERATION + 10)
    assert v["state"] == "worker_lost", v
    assert v["attempts"] == 0 and "went silent" in v["reason"], v
    (exp,) = [e for e in events(d, "lease.expired") if e["job"] == job]
    assert exp["then"] == "worker_lost" and exp["token"].split(".")[0] == run["token"].split(".")[0]
    assert time.monotonic() - killed >= FENCE_AFTER - 1  # not stopped before its time
    assert len(marker_runs(marker)[job]) == 1  # an agent lost with its worker is not run again


def test_a_worker_dies_during_an_evaluation_it_is_queued_again_and_partial_output_is_never_the_result(
    server, workers, tmp_path
):
    d, marker = server, tmp_path / "marker"
    a = workers(d, token(d, "wa")).start()
    job = marker_job(d, marker, first_forever=True)  # the first run writes outputs/result.txt = "partial"
    first = started(marker, job)
    a.kill()
    wait_for(
        lambda: not pgid_alive(first["pgid"]),
        FENCE_AFTER + KILL_GRACE + 2,
        interval=0.1,
        what="the evaluation to be fenced",
    )
    state(d, job, "queued", timeout=TOLERATION + 10)
    b = workers(d, token(d, "wb")).start()
    v = state(d, job, timeout=40)
    assert v["state"] == "succeeded" and v["worker"] == "wb" and v["attempts"] == 1, v
    store = LocalStore(d.home / "cas")
    assert store.get_bytes(v["result"]["outputs"]["result.txt"]) == b"final\n"
    runs = marker_runs(marker)[job]
    assert [r["where"] for r in runs] == ["wa", "wb"] and not overlapping(runs), runs
    # wa comes back with the fenced run's report and its partial output: refused, the result stays the final one
    a.start()
    stale = wait_for(
        lambda: [e for e in events(d, "lease.stale_report") if e["job"] == job],
        30,
        interval=0.2,
        what="wa's late report to be kept as stale",
    )
    assert stale[0]["token"].split(".")[0] == first["token"].split(".")[0] and stale[0]["outcome"] == "fenced"
    assert view(d, job)["result"] == v["result"]
    assert [e["job"] for e in events(d, "job.succeeded")].count(job) == 1
    b.kill()


def test_the_supervisor_dies_during_an_evaluation_it_is_queued_again_not_ended_lost(server, workers, tmp_path):
    d, marker = server, tmp_path / "marker"
    w = workers(d, token(d, "wa")).start()
    job = marker_job(d, marker, first_forever=True)
    first = started(marker, job)
    kill(supervisor_of(first["pid"]))  # the job's supervisor dies without a word; the worker lives
    # the worker finds the supervisor gone, kills what it left and reports the run lost: for an evaluation that is a
    # lost run (queued again under a new token, not an attempt), not the end of the job
    v = state(d, job, timeout=40)
    assert (
        v["state"] == "succeeded" and v["attempts"] == 1 and v["token"].split(".")[0] != first["token"].split(".")[0]
    ), v
    runs = marker_runs(marker)[job]
    assert len(runs) == 2 and not overlapping(runs), runs
    # the worker's word, not the lease's expiry: queued again by the worker under the old token
    mine = [e for e in events(d) if e.get("job") == job]
    assert [e["type"] for e in mine if e.get("by") == "worker:wa"][:2] == ["lease.granted", "job.queued"], mine
    assert "lease.expired" not in [e["type"] for e in mine] and "event=job.ended" in w.output(), mine
