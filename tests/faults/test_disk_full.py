"""Faults (the design's worker rows): the worker's `--dir` is full. A 2 MB tmpfs is mounted there (the tests run as
root); where mounting is not permitted the test is skipped with the reason."""

from __future__ import annotations

import subprocess

import pytest

from piloop_common.cas.local import LocalStore
from tests.helpers.redis import wait_for
from tests.helpers.workers import state, submit, token


@pytest.fixture
def small_dir(tmp_path):
    where = tmp_path / "dir"
    where.mkdir()
    got = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(where)], capture_output=True, text=True)
    if got.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {got.stderr.strip()}")
    yield where
    subprocess.run(["umount", "-l", str(where)], check=False)


def test_a_job_that_fills_the_workers_dir_fails_clearly_and_nothing_is_lost(server, workers, small_dir):
    d = server
    w = workers(d, token(d, "w1"), args=("--dir", str(small_dir))).start()
    job = submit(d, "sh", "-c", "dd if=/dev/zero of=big bs=1M count=4 2>&1; echo exit=$?")
    try:
        v = state(d, job, timeout=30)
    except AssertionError:
        print(w.output()[-4000:])
        subprocess.run(["find", str(small_dir), "-ls"])
        raise
    # a clear failure: the job ends (its record and report made it out of the full dir) and says why
    log = b"".join(LocalStore(d.home / "cas").get_bytes(a) for a in v["result"]["log"])
    assert v["state"] == "failed", v
    assert b"No space left on device" in log or "dir is full" in v["reason"], (v["reason"], log)
    # its dir is removed once reported: the next job finds room again
    nxt = submit(d, "sh", "-c", "echo ok")
    assert state(d, nxt, timeout=30)["state"] == "succeeded"
    assert w.alive


def test_a_full_dir_before_the_job_starts_gives_the_job_back_and_the_worker_lives_on(server, workers, small_dir):
    d = server
    w = workers(d, token(d, "w1"), args=("--dir", str(small_dir))).start()
    wait_for(lambda: "event=worker.registered" in w.output(), 20, what="the worker to register")
    filler = small_dir / "filler"
    subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=64k"], capture_output=True)  # until ENOSPC
    job = submit(d, "sh", "-c", "echo ran")
    wait_for(
        lambda: "event=job.released" in w.output() and "reason=dir" in w.output(),
        20,
        what="the worker to give the job back",
    )
    assert w.alive
    filler.unlink()  # room again: the same job runs, once
    v = state(d, job, timeout=30)
    assert v["state"] == "succeeded" and v["attempts"] == 1, v
