"""A job dies with its supervisor: its shim killed alone, with its worker, or after a worker re-attached it.

Each kills for real (SIGKILL) and reads the job's own marker lines: the killed run's processes end within a second
(the job's leader has a parent-death signal; the worker kills what the shim left), and the run that follows never
overlaps it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time

import pytest

from tests.helpers.redis import wait_for
from tests.helpers.workers import TOLERATION, job_dirs, marker_job, marker_runs, overlapping, pgid_alive, state, token

GONE_WITHIN = 1.0  # seconds from the shim's death to the end of every process of its job


def _running_on(marker, job: str, timeout: float = 20) -> dict:
    return wait_for(
        lambda: (r := marker_runs(marker).get(job)) and r[-1], timeout, interval=0.05, what=f"job {job} to start"
    )


def _shim_of(workdir) -> dict:
    (shim,) = [json.loads(jd.shim_json.read_text()) for jd in job_dirs(workdir)]
    return shim


def _ends_within(pgid: int, seconds: float, what: str) -> float:
    """Wait until no process of `pgid` is left; the seconds it took (the test fails past `seconds`)."""
    t0 = time.monotonic()
    wait_for(lambda: not pgid_alive(pgid), seconds, interval=0.02, what=what)
    return time.monotonic() - t0


def _succeeds_once_more(d, marker, job: str, first: dict) -> list[dict]:
    v = state(d, job, timeout=TOLERATION + 40)
    assert v["state"] == "succeeded" and v["token"].split(".")[0] != first["token"].split(".")[0], v
    runs = marker_runs(marker)[job]
    assert len(runs) == 2 and not overlapping(runs), runs
    return runs


def test_a_shim_killed_alone_takes_its_job_with_it_at_once(server, workers, tmp_path):
    d, marker = server, tmp_path / "marker"
    w = workers(d, token(d, "wa")).start()
    job = marker_job(d, marker, first_forever=True)
    first = _running_on(marker, job)
    shim = _shim_of(w.home / "work" / "wa")
    os.kill(shim["shim"], signal.SIGKILL)
    killed = time.time()
    _ends_within(first["pgid"], GONE_WITHIN, "the job to die with its shim")
    runs = _succeeds_once_more(d, marker, job, first)
    assert runs[0]["last"] < killed + GONE_WITHIN, runs  # the killed run wrote nothing after its end
    assert "shim died" in w.output()


def _path_without_setpriv(tmp_path) -> str:
    """A PATH of the programs a worker and its jobs run here, less util-linux's setpriv: the shim then sets the
    job's parent-death signal in a `preexec_fn` (its fallback), not through setpriv."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("sh", "true", "sleep", "ps", "git"):
        if (found := shutil.which(name)) is not None:
            (bin_dir / name).symlink_to(found)
    return str(bin_dir)


@pytest.mark.parametrize("spawn", ["setpriv", "preexec"])
def test_a_worker_and_its_shims_killed_together_leave_no_job_running(server, workers, tmp_path, spawn):
    d, marker = server, tmp_path / "marker"
    env = {"PATH": _path_without_setpriv(tmp_path)} if spawn == "preexec" else {}
    if spawn == "setpriv" and shutil.which("setpriv") is None:
        pytest.skip("no setpriv on PATH")
    a = workers(d, token(d, "wa"), env=env).start()
    job = marker_job(d, marker, first_forever=True)
    first = _running_on(marker, job)
    shim = _shim_of(a.home / "work" / "wa")
    # as `pkill -9 -f piloop` or an OOM kill of the whole unit: worker, shim host and shim at once
    os.kill(shim["shim"], signal.SIGKILL)
    a.kill()
    killed = time.time()
    _ends_within(first["pgid"], GONE_WITHIN, "the job to die with its shim and worker")
    state(d, job, "queued", timeout=TOLERATION + 10)  # nobody reports it: its lease expires, and it is queued again
    workers(d, token(d, "wb")).start()
    runs = _succeeds_once_more(d, marker, job, first)
    assert runs[0]["last"] < killed + GONE_WITHIN and [r["where"] for r in runs] == ["wa", "wb"], runs


def test_a_reattached_shim_killed_is_noticed_and_its_job_ends_and_runs_again(server, workers, tmp_path):
    d, marker = server, tmp_path / "marker"
    w = workers(d, token(d, "wa")).start()
    job = marker_job(d, marker, first_forever=True)
    first = _running_on(marker, job)
    w.terminate()  # SIGTERM to the worker alone, as systemd's KillMode=process: it detaches, its shim lives on
    assert pgid_alive(first["pgid"])
    w.start()
    wait_for(lambda: "event=job.reattached" in w.output(), 20, interval=0.1, what="the worker to re-attach the job")
    shim = _shim_of(w.home / "work" / "wa")
    os.kill(shim["shim"], signal.SIGKILL)
    killed = time.time()
    _ends_within(first["pgid"], GONE_WITHIN, "the re-attached job to die with its shim")
    # the restarted worker supervises it as it does a job it started: it finds the shim gone and reports the run lost
    wait_for(lambda: "shim died" in w.output(), 5, interval=0.1, what="the worker to find the re-attached shim gone")
    runs = _succeeds_once_more(d, marker, job, first)
    assert runs[0]["last"] < killed + GONE_WITHIN, runs
