"""Faults: two workers on one directory, and `piloop serve` SIGKILLed under its own worker. The dir's lock refuses a
second worker (exit 4, one line naming the first's pid), a worker SIGKILLed leaves no lock behind in its shims, and
the `serve` worker goes with its daemon, so a restarted daemon runs exactly one."""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from piloop_common.prctl import PARENT_ENV
from piloop_worker.dirlock import LOCK_NAME
from piloop_worker.main import EXIT_IN_USE
from tests.helpers.jobprocs import supervisor_of
from tests.helpers.redis import wait_for
from tests.helpers.serve import Daemon, cli_env, fast_executor, short_home
from tests.helpers.slowdown import scaled
from tests.helpers.workers import (
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

# jobs are fenced 19 s after their worker's last acknowledged send, not 5 s: a worker or daemon restarted on a
# loaded machine takes seconds, and these tests are about the restart, not the fence
LATE_TOLERATION = 20.0
LATE_FENCE = fast_executor(LATE_TOLERATION)


@pytest.fixture
def late_server(redis_server, namespace) -> Iterator[Daemon]:
    """`piloop serve --listen` with a `gpu` pool for remote workers, fencing late."""
    d = tcp_server(redis_server.url, namespace, config=LATE_FENCE)
    yield d
    d.cleanup()
    kill_tree_of(str(d.home))


@pytest.fixture
def late_daemon(redis_server, namespace) -> Iterator[Daemon]:
    """`piloop serve` on its socket with its own worker `serve`, fencing late."""
    d = Daemon(short_home(), config=LATE_FENCE, redis_url=redis_server.url, namespace=namespace).start()
    yield d
    d.cleanup()
    kill_tree_of(str(d.home))


def _running(marker: Path, job: str, timeout: float = 30) -> dict:
    return wait_for(
        lambda: (r := marker_runs(marker).get(job)) and r[-1], timeout, interval=0.05, what=f"job {job} to start"
    )


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE  # reparented where nobody reaps: gone all the same
    except psutil.NoSuchProcess:
        return True


def _held(lock: Path) -> bool:
    """Whether some process holds `lock` (probed with a lock of our own, released at once)."""
    fd = os.open(lock, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def _second_worker(d: Daemon, tok: str, home: Path, *args: str) -> subprocess.CompletedProcess:
    """`piloop worker` as a user would start it in `home`, run to its end, its stdout and stderr captured."""
    url: str = d.url  # type: ignore[attr-defined]
    return subprocess.run(
        [sys.executable, "-m", "piloop_common.cli", "worker", "--server", url, "--pool", "gpu", *args],
        env=cli_env(home, {"PILOOP_HTTPS_TOKEN": tok}),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=30,  # one that is not refused runs on, and fails the test here
    )


@pytest.mark.parametrize("where", ["--dir", "its default dir"])
def test_a_second_worker_on_a_dir_is_refused_naming_the_first_which_keeps_working(
    late_server, workers, tmp_path, where
):
    d, marker = late_server, tmp_path / "marker"
    tok = token(d, "wa")
    given = tmp_path / "work" / "wa"  # the marker job names its worker from the `/work/<name>/` in its dir
    first = workers(d, tok, args=("--dir", str(given)) if where == "--dir" else ()).start()
    workdir = given if where == "--dir" else first.home / "work" / "wa"
    # long enough to outlast the second worker's start on a loaded machine: the first must still be running it after
    job = marker_job(d, marker, seconds=scaled(15))
    run = _running(marker, job)
    # the second worker: the same token (so the same name), the same dir, a new process
    second_home = first.home if where != "--dir" else short_home("w")
    if second_home != first.home:  # a worker that would work there: the server's CAS, as the first has
        shutil.copy(first.home / "config.toml", second_home / "config.toml")
    try:
        got = _second_worker(d, tok, second_home, *(("--dir", str(given)) if where == "--dir" else ()))
    finally:
        if second_home != first.home:
            shutil.rmtree(second_home, ignore_errors=True)
    said = f"piloop worker: {workdir.resolve()} is in use by worker pid {first.proc.pid} (one worker per directory)"
    assert got.returncode == EXIT_IN_USE, (got.returncode, got.stderr)
    assert "Traceback" not in got.stderr and got.stdout == "", got
    if where == "--dir":
        assert got.stderr == said + "\n", got.stderr  # refused before it did anything else: its one line
    else:
        # named by its token, it learns its dir from registering (its log lines), then stops there
        assert got.stderr.splitlines()[-1] == said and got.stderr.count("in use by") == 1, got.stderr
        assert "event=worker.registered worker=wa" in got.stderr
    assert (workdir / LOCK_NAME).read_text().strip() == str(first.proc.pid)  # the first still holds it
    # the first worker keeps working: its job ends once, on it, and its next job runs there too
    assert first.alive and pgid_alive(run["pgid"])
    v = state(d, job, timeout=60)
    assert v["state"] == "succeeded" and v["worker"] == "wa", v
    nxt = marker_job(d, marker, seconds=0.2)
    assert state(d, nxt, timeout=30)["state"] == "succeeded"
    runs = marker_runs(marker)
    assert len(runs[job]) == 1 and runs[job][0]["ended"] and len(runs[nxt]) == 1, runs
    mine = [e["type"] for e in events(d) if e.get("job") == job]
    assert "lease.expired" not in mine and "job.requeued" not in mine and mine.count("job.succeeded") == 1, mine
    assert first.alive and "in use by" not in first.output()


def test_a_worker_sigkilled_under_live_shims_leaves_its_dir_free_and_the_next_one_reattaches(
    late_server, workers, tmp_path
):
    d, marker = late_server, tmp_path / "marker"
    tok = token(d, "wa")
    workdir = tmp_path / "work" / "wa"
    old = workers(d, tok, args=("--dir", str(workdir))).start()
    job = marker_job(d, marker, seconds=8)
    run = _running(marker, job)
    state(d, job, "running")
    supervisor = supervisor_of(run["pid"])
    lock = workdir / LOCK_NAME
    assert _held(lock)
    os.kill(old.proc.pid, signal.SIGKILL)  # the worker only: its shim host and shims live on
    old.proc.wait(10)
    killed = time.monotonic()
    assert not _gone(supervisor) and pgid_alive(run["pgid"])  # the job runs on under its supervisor
    # nothing forked from the worker kept its lock: the dir is free the moment the worker is gone
    assert not _held(lock)
    new = workers(d, tok, args=("--dir", str(workdir))).start()
    wait_for(
        lambda: re.search(rf"event=job\.reattached job={job} token={run['token']} status=ok", new.output()),
        30,
        interval=0.1,
        what="the new worker to re-attach the job",
    )
    assert time.monotonic() - killed < LATE_TOLERATION - 1  # within the fence: re-attached, not fenced
    assert lock.read_text().strip() == str(new.proc.pid) and _held(lock)
    v = state(d, job, timeout=30)
    assert v["state"] == "succeeded" and v["worker"] == "wa" and v["attempts"] == 1, v
    runs = marker_runs(marker)[job]
    assert len(runs) == 1 and runs[0]["ended"] and runs[0]["token"] == run["token"], runs
    mine = [e["type"] for e in events(d) if e.get("job") == job]
    assert mine.count("lease.granted") == 1 and "lease.expired" not in mine, mine
    assert new.alive and "in use by" not in new.output()


def _serve_workers(d: Daemon) -> list[psutil.Process]:
    """The live `serve` worker processes of this daemon's home (`piloop --home <home> worker --socket ...`)."""
    out = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            cmd = p.info["cmdline"] or []
            if "worker" in cmd and "--socket" in cmd and str(d.home) in cmd and not _gone(p.pid):
                out.append(p)
        except psutil.Error:
            continue
    return out


def _kill_serve(d: Daemon) -> None:
    """SIGKILL `piloop serve`'s own process (not its group: its worker is left to notice by itself)."""
    assert d.proc is not None
    os.kill(d.proc.pid, signal.SIGKILL)
    d.proc.wait(10)
    d.proc = None


def _log_after(path: Path, offset: int) -> str:
    return path.read_bytes()[offset:].decode(errors="replace")


def _started_once(d: Daemon, daemon_offset: int) -> None:
    """The restarted daemon started its worker once and never again."""
    since = _log_after(d.home / "logs" / "test-daemon.log", daemon_offset)
    assert since.count("event=worker.started name=serve") == 1 and "event=worker.exited" not in since, since


def test_serve_sigkilled_its_worker_goes_too_and_the_restarted_daemon_runs_exactly_one(late_daemon, tmp_path):
    d, marker = late_daemon, tmp_path / "marker"
    (old,) = wait_for(lambda: _serve_workers(d), 20, interval=0.1, what="the serve worker")
    wlog = d.home / "logs" / "worker-serve.log"
    job = marker_job(d, marker, pool="serve", seconds=8)
    run = _running(marker, job)
    _kill_serve(d)
    killed = time.monotonic()
    wait_for(lambda: _gone(old.pid), 15, interval=0.05, what="the serve worker to exit with its daemon")
    assert "event=worker.detaching worker=serve jobs=1" in wlog.read_text()  # SIGTERMed: it detached
    assert pgid_alive(run["pgid"])  # its job runs on under its shim
    daemon_offset, worker_offset = (d.home / "logs" / "test-daemon.log").stat().st_size, wlog.stat().st_size
    d.start()
    wait_for(
        lambda: re.search(rf"event=job\.reattached job={job} token={run['token']} status=ok", _log_after(wlog, 0)),
        30,
        interval=0.1,
        what="the new serve worker to re-attach the job",
    )
    assert time.monotonic() - killed < LATE_TOLERATION - 1
    assert len(_serve_workers(d)) == 1
    v = state(d, job, timeout=30)
    assert v["state"] == "succeeded" and v["attempts"] == 1, v
    runs = marker_runs(marker)[job]
    assert len(runs) == 1 and runs[0]["ended"] and not overlapping(runs), runs
    mine = [e["type"] for e in events(d) if e.get("job") == job]
    assert mine.count("lease.granted") == 1 and "lease.expired" not in mine, mine
    (now,) = _serve_workers(d)
    assert now.pid != old.pid and "in use by" not in _log_after(wlog, worker_offset)
    _started_once(d, daemon_offset)


def test_serve_restarted_while_its_old_worker_still_detaches_starts_one_worker_that_waits(late_daemon, tmp_path):
    d, marker = late_daemon, tmp_path / "marker"
    (old,) = wait_for(lambda: _serve_workers(d), 20, interval=0.1, what="the serve worker")
    wlog = d.home / "logs" / "worker-serve.log"
    job = marker_job(d, marker, pool="serve", seconds=12)
    run = _running(marker, job)
    old.send_signal(signal.SIGSTOP)  # its parent-death SIGTERM waits until it runs again: a slow detach
    try:
        _kill_serve(d)
        killed = time.monotonic()
        daemon_offset, worker_offset = (d.home / "logs" / "test-daemon.log").stat().st_size, wlog.stat().st_size
        d.start()
        waiting = f"is in use by worker pid {old.pid}: waiting"
        wait_for(lambda: waiting in _log_after(wlog, worker_offset), 20, interval=0.1, what="the new worker to wait")
        assert not _gone(old.pid) and len(_serve_workers(d)) == 2  # the old one, stopped, and the new one waiting
    finally:
        old.send_signal(signal.SIGCONT)
    wait_for(lambda: _gone(old.pid), 15, interval=0.05, what="the old serve worker to detach and exit")
    wait_for(
        lambda: re.search(
            rf"event=job\.reattached job={job} token={run['token']} status=ok", _log_after(wlog, worker_offset)
        ),
        30,
        interval=0.1,
        what="the new serve worker to re-attach the job",
    )
    assert time.monotonic() - killed < LATE_TOLERATION - 1
    v = state(d, job, timeout=30)
    assert v["state"] == "succeeded" and v["attempts"] == 1, v
    runs = marker_runs(marker)[job]
    assert len(runs) == 1 and runs[0]["ended"] and not overlapping(runs), runs
    (now,) = _serve_workers(d)
    assert now.pid != old.pid
    _started_once(d, daemon_offset)
    assert "(one worker per directory)" not in _log_after(wlog, worker_offset)  # it waited, and was never refused


def test_a_serve_worker_whose_daemon_died_before_it_armed_its_signal_exits_at_once(tmp_path):
    """The race between the daemon's fork and the worker's prctl: a worker whose parent is not the daemon that
    started it (here, that pid is not its parent at all) exits 0 before it touches anything."""
    home = short_home("o")
    serve_worker = ("worker", "--socket", str(home / "piloop.sock"), "--pool", "serve", "--name", "serve")
    try:
        got = subprocess.run(
            [sys.executable, "-m", "piloop_common.cli", "--home", str(home), *serve_worker],
            env=cli_env(home, {PARENT_ENV: str(os.getppid())}),  # pytest's parent: not the worker's
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=30,  # one that does not notice waits for a daemon on the socket, and fails the test here
        )
        assert got.returncode == 0 and got.stderr == "", got
        assert not (home / "work").exists()  # it left before taking its dir
    finally:
        shutil.rmtree(home, ignore_errors=True)
