"""A job dies with its supervisor: its supervisor killed alone, with its worker, or after a worker re-attached it.

Each kills for real (SIGKILL) and reads the job's own marker lines: the killed run's processes end within a second
(the job's leader has a parent-death signal; the worker kills what the supervisor left), the worker reports the run
lost within a few of its ticks (it runs again under a new lease, the old one never left to expire), and the run that
follows never overlaps it. The supervisor is the job's first process's parent (`tests.helpers.jobprocs`): a per-job
shim, or the slot's supervisor."""

from __future__ import annotations

import os
import shutil
import time

import pytest

from piloop_common.tasks import Client
from tests.helpers import warm_tasks_mod as m
from tests.helpers.jobprocs import descendants, gone_within, kill, started, supervisor_of
from tests.helpers.redis import wait_for
from tests.helpers.slowdown import scaled
from tests.helpers.workers import (
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

GONE_WITHIN = 1.0  # seconds (× the slowdown) from the supervisor's death to the end of every process of its job
REPORTED_WITHIN = 5.0  # seconds (× the slowdown) from its death to the worker's word that the run is lost


def _succeeds_once_more(d, marker, job: str, first: dict) -> list[dict]:
    v = state(d, job, timeout=TOLERATION + 40)
    assert v["state"] == "succeeded" and v["token"].split(".")[0] != first["token"].split(".")[0], v
    runs = marker_runs(marker)[job]
    assert len(runs) == 2 and not overlapping(runs), runs
    assert [e["job"] for e in events(d, "job.succeeded")].count(job) == 1
    return runs


def _reported_lost_promptly(d, job: str, first: dict, killed: float, worker: str) -> None:
    """The worker said the run is lost soon after its supervisor died: the job is no longer `running` under the old
    lease (`leased` or `running`) within a few ticks, queued again by the worker (not by the lease's expiry, toleration later)."""
    old = first["token"].split(".")[0]

    def moved_on() -> dict | None:
        v = view(d, job)
        return v if v["state"] not in ("leased", "running") or v["token"].split(".")[0] != old else None

    seen = wait_for(moved_on, REPORTED_WITHIN, interval=0.05, what="the worker to report the run lost")
    took = time.monotonic() - killed
    print(f"\nthe job left its old lease {took:.2f} s after its supervisor was killed")
    mine = [e for e in events(d) if e.get("job") == job]
    assert not [e for e in mine if e["type"] == "lease.expired"], mine
    said = [e["type"] for e in mine if e.get("by") == f"worker:{worker}"]
    assert said[:2] == ["lease.granted", "job.queued"], (
        str({k: seen.get(k) for k in ("state", "token", "reason")}),
        str([(e["type"], e.get("by")) for e in mine]),
    )


def test_a_supervisor_killed_alone_takes_its_job_with_it_at_once(server, workers, tmp_path):
    d, marker = server, tmp_path / "marker"
    workers(d, token(d, "wa")).start()
    job = marker_job(d, marker, first_forever=True)
    first = started(marker, job)
    kill(supervisor_of(first["pid"]))
    killed, at = time.time(), time.monotonic()
    gone_within(first["pgid"], GONE_WITHIN, "the job to die with its supervisor")
    _reported_lost_promptly(d, job, first, at, "wa")
    runs = _succeeds_once_more(d, marker, job, first)
    assert runs[0]["last"] < killed + scaled(GONE_WITHIN), runs  # the killed run wrote nothing after its end


def _path_without_setpriv(tmp_path) -> str:
    """A PATH of the programs a worker and its jobs run here, less util-linux's setpriv: a supervisor that would
    spawn through it then arms the job's parent-death signal its other way."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("sh", "true", "sleep", "ps", "git"):
        if (found := shutil.which(name)) is not None:
            (bin_dir / name).symlink_to(found)
    return str(bin_dir)


@pytest.mark.parametrize("spawn", ["setpriv", "preexec"])
def test_a_worker_and_its_supervisors_killed_together_leave_no_job_running(server, workers, tmp_path, spawn):
    d, marker = server, tmp_path / "marker"
    env = {"PATH": _path_without_setpriv(tmp_path)} if spawn == "preexec" else {}
    if spawn == "setpriv" and shutil.which("setpriv") is None:
        pytest.skip("no setpriv on PATH")
    a = workers(d, token(d, "wa"), env=env).start()
    job = marker_job(d, marker, first_forever=True)
    first = started(marker, job)
    assert a.proc is not None
    # as `pkill -9 -f piloop` or an OOM kill of the whole unit: the worker and every process of piloop's under it
    # (the job's supervisor and the others: a shim host, idle slots' supervisors) at once, the job's own left alone
    piloops = {supervisor_of(first["pid"]), *(p for p in descendants(a.proc.pid) if os.getpgid(p) != first["pgid"])}
    for p in piloops:
        kill(p)
    a.kill()
    killed = time.time()
    gone_within(first["pgid"], GONE_WITHIN, "the job to die with its supervisor and worker")
    state(d, job, "queued", timeout=TOLERATION + 10)  # nobody reports it: its lease expires, and it is queued again
    workers(d, token(d, "wb")).start()
    runs = _succeeds_once_more(d, marker, job, first)
    assert runs[0]["last"] < killed + scaled(GONE_WITHIN) and [r["where"] for r in runs] == ["wa", "wb"], runs


def test_a_readopted_supervisor_killed_alone_takes_its_job_with_it_and_is_reported_at_once(server, workers, tmp_path):
    d, marker = server, tmp_path / "marker"
    w = workers(d, token(d, "wa")).start()
    job = marker_job(d, marker, first_forever=True)
    first = started(marker, job)
    supervisor = supervisor_of(first["pid"])
    w.terminate()  # SIGTERM to the worker alone, as systemd's KillMode=process: it detaches, the supervisor lives on
    assert pgid_alive(first["pgid"]) and supervisor_of(first["pid"]) == supervisor
    w.start()
    wait_for(lambda: "event=job.reattached" in w.output(), 20, interval=0.1, what="the worker to re-attach the job")
    kill(supervisor)
    killed, at = time.time(), time.monotonic()
    gone_within(first["pgid"], GONE_WITHIN, "the re-adopted job to die with its supervisor")
    # the restarted worker watches it as it does a job it started: it finds the supervisor gone and reports the run
    # lost at its next tick, not after the lease's toleration
    _reported_lost_promptly(d, job, first, at, "wa")
    runs = _succeeds_once_more(d, marker, job, first)
    assert runs[0]["last"] < killed + scaled(GONE_WITHIN), runs


def _warm_marker(d, marker) -> str:
    """The marker job as a Python task (its first run runs until it is killed), in the worker's warm process."""
    with Client.from_env(d.home) as c:
        return m.marker.apply_async((str(marker), True), pool="gpu", client=c).id


def test_a_tasks_supervisor_killed_alone_takes_its_warm_process_with_it_at_once(server, workers, tmp_path):
    d, marker = server, tmp_path / "marker"
    workers(d, token(d, "wa")).start()
    job = _warm_marker(d, marker)
    first = started(marker, job, timeout=30)  # its pid is the warm process's, whose parent supervises it
    kill(supervisor_of(first["pid"]))
    killed, at = time.time(), time.monotonic()
    gone_within(first["pgid"], GONE_WITHIN, "the warm process to die with its supervisor")
    _reported_lost_promptly(d, job, first, at, "wa")
    runs = _succeeds_once_more(d, marker, job, first)
    assert runs[0]["last"] < killed + scaled(GONE_WITHIN) and runs[1]["pid"] != runs[0]["pid"], runs


def test_a_worker_and_its_supervisors_killed_together_leave_no_task_running(server, workers, tmp_path):
    d, marker = server, tmp_path / "marker"
    a = workers(d, token(d, "wa")).start()
    job = _warm_marker(d, marker)
    first = started(marker, job, timeout=30)
    assert a.proc is not None
    piloops = {supervisor_of(first["pid"]), *(p for p in descendants(a.proc.pid) if os.getpgid(p) != first["pgid"])}
    for p in piloops:
        kill(p)
    a.kill()
    killed = time.time()
    gone_within(first["pgid"], GONE_WITHIN, "the warm process to die with its supervisor and worker")
    state(d, job, "queued", timeout=TOLERATION + 10)
    workers(d, token(d, "wb")).start()
    runs = _succeeds_once_more(d, marker, job, first)
    assert runs[0]["last"] < killed + scaled(GONE_WITHIN) and [r["where"] for r in runs] == ["wa", "wb"], runs
