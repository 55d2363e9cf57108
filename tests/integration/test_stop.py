"""`piloop stop` on an idle daemon of the embedded defaults: it says what it waits for and returns within 2 s."""

from __future__ import annotations

import subprocess
import time

from tests.helpers.serve import piloop, short_home


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
        assert took - base < 2.0, f"stop took {took:.1f}s, {base:.1f}s of it the CLI's own start"
    finally:
        piloop(home, "stop", timeout=90)
        subprocess.run(["pkill", "-f", str(home)], check=False)
