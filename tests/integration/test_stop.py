"""`piloop stop` stops within a few seconds whatever clients are attached (an `events --follow`, one that went away,
a `job wait`, a client that connected and sends nothing or half a request), and what a SIGKILLed `serve` left
behind (its pid file, its socket) never blocks the next `piloop serve`."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.helpers.redis import wait_for
from tests.helpers.serve import cli_env, piloop, short_home
from tests.helpers.slowdown import scaled

# the daemon's grace for requests in flight (piloop_server.serve.SHUTDOWN_GRACE_SECONDS), and a margin for the rest
STOP_WITHIN = 2.0 + 3.0


def _timed(home, *args: str) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    r = piloop(home, *args, timeout=90)
    return r, time.monotonic() - t0


def test_stop_says_what_it_waits_for_and_an_idle_daemon_stops_within_two_seconds():
    home = short_home("stop")
    try:
        assert piloop(home, "init", timeout=90).returncode == 0
        # the idle serve worker long-polls a claim, and the embedded Redis runs: the two that held stop 7-11 s
        r, took = _timed(home, "stop")
        assert r.returncode == 0, r.stderr
        assert "stopping the daemon (pid" in r.stderr and "embedded Redis" in r.stderr, r.stderr
        assert "the daemon stopped" in r.stdout
        # the same command with nothing to stop: what starting the CLI costs on this machine, not stop's wait
        none, base = _timed(home, "stop")
        assert none.returncode == 0 and none.stdout.strip() == "piloop: no daemon is running"
        assert took - base < scaled(2.0), f"stop took {took:.1f}s, {base:.1f}s of it the CLI's own start"
    finally:
        piloop(home, "stop", timeout=90)
        subprocess.run(["pkill", "-f", str(home)], check=False)


def _client(home, *args: str) -> subprocess.Popen:
    """A CLI command left running, as a user's other terminal would."""
    return subprocess.Popen(
        [sys.executable, "-m", "piloop_common.cli", *args],
        env=cli_env(home),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def _stops_soon(daemon) -> None:
    r, took = _timed(daemon.home, "stop")
    assert r.returncode == 0 and "the daemon stopped" in r.stdout, (r.stdout, r.stderr)
    # less what starting the CLI costs on this machine now (seconds on a loaded one): the same command, nothing to stop
    with tempfile.TemporaryDirectory(prefix="none-", dir="/tmp") as empty:
        none, base = _timed(Path(empty), "stop")
    assert none.stdout.strip() == "piloop: no daemon is running", none.stdout
    assert took - base < scaled(STOP_WITHIN), f"stop took {took:.1f}s, {base:.1f}s of it the CLI's own start"
    assert daemon.proc is not None and daemon.proc.wait(scaled(5)) == 0


def _in_flight(daemon, at_least: int) -> None:
    """Wait until the daemon's socket has `at_least` connections from clients."""
    path = str(daemon.home / "piloop.sock")

    def count() -> int:
        out = subprocess.run(["ss", "-xH", "state", "connected"], capture_output=True, text=True).stdout
        return sum(1 for line in out.splitlines() if path in line)

    wait_for(lambda: count() >= at_least, 20, what=f"{at_least} client(s) on {path}")


def test_stop_with_an_events_follower_attached(daemon, redis_client):
    follower = _client(daemon.home, "events", "--follow")
    try:
        # its long poll under way: the daemon blocks in Redis for it (up to 20 s)
        wait_for(
            lambda: any(c.get("cmd") == "xread" for c in redis_client.client_list()),
            20,
            what="the follower's long poll",
        )
        _stops_soon(daemon)
        assert follower.wait(scaled(30)) != 0  # told the daemon went, not left waiting
    finally:
        follower.kill()


def test_stop_after_an_events_follower_went_away(daemon):
    follower = _client(daemon.home, "events", "--follow")
    _in_flight(daemon, 1)
    follower.kill()
    follower.wait()
    _stops_soon(daemon)


def test_stop_with_a_job_wait_attached(daemon):
    job = daemon.cli("job", "submit", "--pool", "serve", "--", "sleep", "300", check=True).stdout.strip()
    waiter = _client(daemon.home, "job", "wait", job)
    try:
        _in_flight(daemon, 1)
        _stops_soon(daemon)
        assert waiter.wait(scaled(30)) != 0
    finally:
        waiter.kill()


@pytest.mark.parametrize(
    "sends",
    [
        b"",
        b"GET /v1/health HTTP/1.1\r\nHost: x\r\n",
        b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{",
    ],
    ids=["nothing", "half-the-headers", "half-the-body"],
)
def test_stop_with_a_wedged_client_attached(daemon, sends):
    wedged = socket.socket(socket.AF_UNIX)
    try:
        wedged.connect(str(daemon.home / "piloop.sock"))
        wedged.sendall(sends)
        _stops_soon(daemon)
    finally:
        wedged.close()


def test_a_sigkilled_serve_leaves_nothing_that_blocks_the_next():
    home = short_home("stale")
    try:
        assert piloop(home, "init", timeout=90).returncode == 0
        pid = int((home / "piloop.pid").read_text())
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not os.path.exists(f"/proc/{pid}") or _zombie(pid), 10, what="the daemon gone")
        assert (home / "piloop.pid").exists() and (home / "piloop.sock").exists()  # both left behind
        r = piloop(home, "status", timeout=30)
        assert r.returncode == 1 and "no daemon answers" in r.stdout, (r.stdout, r.stderr)
        # a pid file naming a live process that is no daemon of this home (a reused pid): no more than stale
        (home / "piloop.pid").write_text(str(os.getpid()))
        started = piloop(home, "serve", "--detach", timeout=90)
        assert started.returncode == 0 and "the daemon is running" in started.stdout, (started.stdout, started.stderr)
        assert int((home / "piloop.pid").read_text()) not in (pid, os.getpid())
        assert piloop(home, "status", timeout=30).returncode == 0
        # and a second serve beside the live one is refused, naming it
        again = piloop(home, "serve", "--detach", timeout=90)
        assert again.returncode == 1 and "already running" in again.stderr, (again.stdout, again.stderr)
    finally:
        piloop(home, "stop", timeout=90)
        subprocess.run(["pkill", "-f", str(home)], check=False)


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] == "Z"
    except FileNotFoundError:
        return True
