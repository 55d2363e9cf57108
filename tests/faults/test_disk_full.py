"""Faults (the design's worker rows): a full filesystem under the worker. A small tmpfs is mounted on its `--dir` or
its spool (the tests run as root); where mounting is not permitted the test is skipped with the reason.

Everything of a job is on `--dir` (its control files too), so one job filling it is the fault each test makes: the
job that filled it fails with `disk_full`, its neighbours run on, the worker keeps serving, nothing stays `running`."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from piloop_common.cas.local import LocalStore
from tests.helpers.redis import wait_for
from tests.helpers.workers import state, submit, token, view


def _mount_small(where: Path, size: str = "2m") -> None:
    where.mkdir(parents=True, exist_ok=True)
    got = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True, text=True
    )
    if got.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {got.stderr.strip()}")


@pytest.fixture
def small():
    mounted: list[Path] = []

    def mount(where: Path, size: str = "2m") -> Path:
        _mount_small(where, size)
        mounted.append(where)
        return where

    yield mount
    for where in mounted:
        subprocess.run(["umount", "-l", str(where)], check=False)


def _log(d, v: dict) -> bytes:
    return b"".join(LocalStore(d.home / "cas").get_bytes(a) for a in v["result"]["log"])


def test_a_job_that_fills_the_dir_fails_with_disk_full_and_its_neighbour_runs_on(server, workers, small, tmp_path):
    d = server
    where = small(tmp_path / "dir")
    w = workers(d, token(d, "w1"), args=("--dir", str(where))).start()
    # the neighbour outlives the full disk by far more than a fence (toleration 6 s - 2 renewals): only deadlines
    # renewed while the disk is full keep it alive
    neighbour = submit(d, "sh", "-c", "sleep 9; echo neighbour-done")
    state(d, neighbour, "running", timeout=30)
    filler = submit(d, "sh", "-c", "dd if=/dev/zero of=big bs=64k 2>&1; echo dd-exit=$?; sleep 7; exit 1")
    try:
        wait_for(lambda: view(d, filler)["state"] == "running", 30, what="the filler to start")
        wait_for(lambda: _free(where) < 64 * 1024, 20, what="the dir to fill")
        v = state(d, filler, timeout=30)
        n = state(d, neighbour, timeout=30)
    except AssertionError:
        print(w.output()[-4000:])
        subprocess.run(["find", str(where), "-ls"])
        raise
    # the job that filled it: failed, once, and says why
    assert v["state"] == "failed" and v["attempts"] == 1, v
    assert v["reason"].startswith("disk_full:"), v["reason"]
    # (its own log is what it could write before the disk was full: here nothing, dd's first block filled it)
    # its neighbour was never fenced: its deadline was renewed in place on the full disk
    assert n["state"] == "succeeded" and n["attempts"] == 1, n
    assert b"neighbour-done" in _log(d, n)
    assert "event=job.deadline_unwritten" not in w.output()
    # the worker serves on: its dir is free again once the filler is reported
    nxt = submit(d, "sh", "-c", "echo ok")
    assert state(d, nxt, timeout=30)["state"] == "succeeded"
    assert w.alive and all(view(d, j)["state"] != "running" for j in (filler, neighbour, nxt))


def _free(where: Path) -> int:
    import os

    st = os.statvfs(where)
    return st.f_bavail * st.f_frsize


def test_a_full_dir_before_the_job_starts_gives_the_job_back_and_the_worker_lives_on(server, workers, small, tmp_path):
    d = server
    where = small(tmp_path / "dir")
    w = workers(d, token(d, "w1"), args=("--dir", str(where))).start()
    wait_for(lambda: "event=worker.registered" in w.output(), 20, what="the worker to register")
    filler = where / "filler"
    subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=64k"], capture_output=True)  # until ENOSPC
    job = submit(d, "sh", "-c", "echo ran")
    wait_for(
        lambda: "event=job.released" in w.output() and "reason=disk_full" in w.output(),
        20,
        what="the worker to give the job back",
    )
    assert w.alive and view(d, job)["state"] != "running"
    filler.unlink()  # room again: the same job runs, once
    v = state(d, job, timeout=30)
    assert v["state"] == "succeeded" and v["attempts"] == 1, v


def test_a_full_spool_still_sends_the_report(server, workers, small):
    d = server
    w = workers(d, token(d, "w1"))
    spool = small(w.home / "spool" / "w1", size="64k")
    subprocess.run(["dd", "if=/dev/zero", f"of={spool / 'filler'}", "bs=4k"], capture_output=True)  # until ENOSPC
    w.start()
    # a job of a second or more: its report goes to the spool before it is sent (a shorter one's goes straight out)
    job = submit(d, "sh", "-c", "sleep 1.2; echo reported")
    try:
        v = state(d, job, timeout=30)
    except AssertionError:
        print(w.output()[-4000:])
        raise
    assert v["state"] == "succeeded" and v["attempts"] == 1, v
    assert "event=job.report_unspooled" in w.output() and "reason=disk_full" in w.output()
    assert w.spool("w1") == [] and w.alive
