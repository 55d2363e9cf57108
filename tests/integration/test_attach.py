"""`piloop attach`: a running job's log from the start, then live, through the API's log route; the job's
outcome as the exit status; a finished job's whole log."""

from __future__ import annotations

import subprocess
import sys
import time

from tests.helpers.redis import wait_for
from tests.helpers.serve import cli_env

LINES = 20  # one every 0.3 s, half before the gate and half after it, so chunks ship (3 s after they are written)
# while the job runs: it cannot end before the test has read attach's first line and opens the gate
TICKER = f"""import os, sys, time
gate = sys.argv[1]
for i in range({LINES}):
    if i == {LINES} // 2:
        while not os.path.exists(gate):
            time.sleep(0.05)
    print('line', i, flush=True)
    time.sleep(0.3)
"""


def _state(daemon, job: str) -> str:
    with daemon.api() as api:
        return api.call("GET", f"/v1/jobs/{job}")["state"]


def test_attach_follows_a_running_job_then_prints_a_finished_one_whole_and_exits_with_its_outcome(daemon, tmp_path):
    gate = tmp_path / "go"
    job = daemon.cli("job", "submit", "--", sys.executable, "-c", TICKER, str(gate), check=True).stdout.strip()
    wait_for(lambda: _state(daemon, job) == "running", 20, what=f"{job} running")
    proc = subprocess.Popen(
        [sys.executable, "-m", "piloop_common.cli", "attach", job],
        env=cli_env(daemon.home),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        live = _state(daemon, job)  # the first line reached us while the job still ran: attach follows it live
        gate.touch()  # the second half is written only now, after attach is following
        rest = proc.stdout.read()  # to its end: attach exits when the job has ended
        proc.wait(30)
        err = proc.stderr.read() if proc.stderr else ""
    finally:
        proc.kill()
    expected = [f"line {i}" for i in range(LINES)]
    assert (first + rest).splitlines() == expected, err
    assert live == "running", f"the first line came only once the job was {live}"
    assert proc.returncode == 0, err

    again = daemon.cli("attach", job, timeout=30)  # a finished job: its whole log, and its outcome
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines() == expected

    failing = daemon.cli(
        "job", "submit", "--", sys.executable, "-c", "print('about to fail'); raise SystemExit(3)", check=True
    ).stdout.strip()
    started = time.monotonic()
    out = daemon.cli("attach", failing, timeout=60)
    assert out.stdout == "about to fail\n"
    assert out.returncode == 3, out.stderr
    assert f"{failing} failed: exit code 3" in out.stderr
    assert time.monotonic() - started < 30

    # the route attach reads: each chunk as stored, its address in a header; past the end, 404
    from piloop_common.errors import NotFound

    with daemon.api() as api:
        view = api.call("GET", f"/v1/jobs/{failing}")
        assert len(view["log"]) == 1
        resp = api.call_bytes("GET", f"/v1/jobs/{failing}/log/0")
        assert resp.content == b"about to fail\n"
        assert resp.headers["x-piloop-address"] == view["log"][0]
        for path in (f"/v1/jobs/{failing}/log/1", "/v1/jobs/jnosuchjob/log/0"):
            try:
                api.call_bytes("GET", path)
            except NotFound:
                continue
            raise AssertionError(f"{path} was served")
