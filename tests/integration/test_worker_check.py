"""`piloop worker check`, the compose worker's health check, on a real worker: healthy once its server has
acknowledged a heartbeat; unhealthy once it has been silent longer than grace_seconds (paused), and once its process
is gone; each time one line and the exit code. It reads the worker's own record and calls no server."""

from __future__ import annotations

from tests.helpers.redis import wait_for
from tests.helpers.serve import piloop
from tests.helpers.workers import GRACE, token


def check(home, *args: str):
    return piloop(home, "worker", "check", *args)


def test_worker_check_follows_the_workers_own_heartbeat(server, workers):
    w = workers(server, token(server, "hc1")).start()
    r = wait_for(lambda: (r := check(w.home)).returncode == 0 and r, 20, what="a healthy check")
    assert r.stdout.startswith("piloop: worker hc1: heartbeat acknowledged ") and r.stdout.endswith("s ago\n"), r
    r = check(w.home, "--dir", str(w.home / "work" / "hc1"))
    assert r.returncode == 0, r.stderr
    w.pause()
    try:
        r = wait_for(lambda: (r := check(w.home)).returncode == 1 and r, GRACE + 10, what="an unhealthy check")
        assert "worker hc1: its last acknowledged heartbeat was " in r.stderr, r.stderr
        assert f"longer than the server's grace_seconds ({GRACE:g}s)" in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1
    finally:
        w.resume()
    wait_for(lambda: check(w.home).returncode == 0, 20, what="healthy again once it beats")
    w.kill()
    r = check(w.home)
    assert r.returncode == 1 and "worker hc1: its process (pid " in r.stderr and "is not running" in r.stderr, r


def test_worker_check_before_any_worker_ran(tmp_path):
    r = check(tmp_path)
    assert r.returncode == 1
    assert r.stderr == f"piloop: no worker has heartbeated here yet (no {tmp_path / 'work'}/*/health.json)\n"
