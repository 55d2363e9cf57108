"""Faults of issue 50's list that befall a worker and not its jobs' supervisors: the worker SIGKILLed alone mid-job
(its jobs run on; one that ends meanwhile keeps its report; a restarted worker adopts both and each is reported
once), and the worker SIGSTOPped past its lease (its job is killed before the lease expires: the gap is printed, then
it runs once elsewhere).

What is observed is the jobs' own marker lines, their processes and the server's events, never a worker's files, so
these hold whatever supervises a job (a per-job shim, a slot's supervisor). The rows of the same list that kill a
supervisor are in test_supervisor_dies.py; the worker's and the supervisor's death together too."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.helpers.jobprocs import started, supervisor_of
from tests.helpers.redis import wait_for
from tests.helpers.serve import Daemon, fast_executor
from tests.helpers.slowdown import scaled
from tests.helpers.workers import (
    FENCE_AFTER,
    KILL_GRACE,
    TOLERATION,
    events,
    kill_tree_of,
    marker_job,
    marker_runs,
    overlapping,
    pgid_alive,
    state,
    tcp_server,
    token,
)

# the adoption test's lease: a worker restarted on a loaded machine takes seconds, and the row holds only for a restart
# within the fence (toleration − 2 × renew after the last acknowledged send)
ADOPT_TOLERATION = 30.0
ADOPT_EXECUTOR = fast_executor(ADOPT_TOLERATION)


@pytest.fixture
def adopt_server(redis_server, namespace) -> Iterator[Daemon]:
    d = tcp_server(redis_server.url, namespace, config=ADOPT_EXECUTOR)
    yield d
    d.cleanup()
    kill_tree_of(str(d.home))


def _once(d: Daemon, job: str, kind: str) -> int:
    return [e["job"] for e in events(d, kind)].count(job)


def test_a_worker_killed_alone_leaves_its_jobs_running_and_a_restart_adopts_them_each_reported_once(
    adopt_server, workers, tmp_path
):
    d, marker = adopt_server, tmp_path / "marker"
    tok = token(d, "wa")
    workdir = tmp_path / "work" / "wa"
    w = workers(d, tok, args=("--dir", str(workdir))).start()
    # the gpu pool's two slots: one job that ends while its worker is dead, one that outlives the restart
    short = marker_job(d, marker, kind="agent", seconds=1.5)
    long = marker_job(d, marker, seconds=scaled(12))
    runs = {j: started(marker, j, timeout=30) for j in (short, long)}
    supervisors = {j: supervisor_of(r["pid"]) for j, r in runs.items()}
    assert w.proc is not None
    w.proc.kill()  # SIGKILL of the worker's own process alone: whatever supervises its jobs is left
    w.proc.wait(scaled(10))
    killed = time.time()
    # its jobs run on: the short one to its end, the long one still ticking well after the kill
    wait_for(lambda: marker_runs(marker)[short][0]["ended"], 20, interval=0.05, what="the short job to end by itself")
    wait_for(
        lambda: marker_runs(marker)[long][0]["last"] > killed + 1, 10, interval=0.05, what="the long job to tick on"
    )
    assert pgid_alive(runs[long]["pgid"]) and supervisor_of(runs[long]["pid"]) == supervisors[long]
    assert state(d, short, "running", "leased")["state"] in ("running", "leased")  # nobody has reported it yet
    w.start()  # the same token and --dir: it finds the jobs' supervisors and adopts them
    for j in (short, long):
        v = state(d, j, timeout=ADOPT_TOLERATION)
        assert v["state"] == "succeeded" and v["worker"] == "wa" and v["attempts"] == 1, v
        (run,) = marker_runs(marker)[j]  # the same run, never restarted
        assert run["ended"] and run["token"] == runs[j]["token"], run
        # the report of the run that ended while no worker was there reached the server, and once
        assert _once(d, j, "lease.granted") == 1 and _once(d, j, "job.succeeded") == 1, j
    mine = [e["type"] for e in events(d) if e.get("job") in (short, long)]
    assert "lease.expired" not in mine and "lease.stale_report" not in mine, mine
    assert w.alive


def test_a_stopped_worker_has_its_job_killed_before_its_lease_expires_and_the_job_runs_once_elsewhere(
    server, workers, tmp_path
):
    d, marker = server, tmp_path / "marker"
    a = workers(d, token(d, "wa")).start()
    job = marker_job(d, marker, first_forever=True)
    first = started(marker, job)
    state(d, job, "running")
    a.pause()  # SIGSTOP of the worker's process group; its jobs' supervisors are in sessions of their own
    paused = time.monotonic()
    try:
        wait_for(
            lambda: not pgid_alive(first["pgid"]),
            FENCE_AFTER + KILL_GRACE + 2,
            interval=0.02,
            what="the stopped worker's job to be killed",
        )
        dead = time.time()  # at or after its death (a poll's lag): the gap below is if anything understated
        assert time.monotonic() - paused < TOLERATION
        (expired,) = wait_for(
            lambda: [e for e in events(d, "lease.expired") if e["job"] == job],
            TOLERATION + 5,
            interval=0.05,
            what="the lease to expire",
        )
        # the lease's end is the event's stream id (Redis's clock, this machine's, as the job's and the test's)
        ended = int(expired["id"].split("-")[0]) / 1000
        last = marker_runs(marker)[job][0]["last"]
        print(
            f"\nthe job died {ended - dead:.2f} s (its last line {ended - last:.2f} s) before its lease expired "
            f"(toleration {TOLERATION:g} s, fence {FENCE_AFTER:g} s after the last acknowledged send, "
            f"kill grace {KILL_GRACE:g} s)"
        )
        assert ended - dead > 0 and ended - last > 0, (dead, last, ended)
        assert expired["token"].split(".")[0] == first["token"].split(".")[0]
        state(d, job, "queued", "leased", "running", timeout=10)
        b = workers(d, token(d, "wb")).start()
        v = state(d, job, timeout=40)
        assert v["state"] == "succeeded" and v["worker"] == "wb" and v["attempts"] == 1, v
        runs = marker_runs(marker)[job]
        assert [r["where"] for r in runs] == ["wa", "wb"] and not overlapping(runs), runs
        assert runs[0]["last"] < ended <= runs[1]["start"], runs
    finally:
        a.resume()
    # the thawed worker's report of the killed run is late: kept as stale, and the job's one success stays one
    wait_for(
        lambda: [e for e in events(d, "lease.stale_report") if e["job"] == job],
        20,
        interval=0.1,
        what="wa's late report",
    )
    assert _once(d, job, "job.succeeded") == 1
    b.kill()
