"""The daemon's own logs under a real `piloop serve`: the pass copy-truncates them past `log_max_bytes`."""

from __future__ import annotations

import time

import pytest

from piloop_server.logfiles import CHECK_ENV
from tests.helpers.redis import wait_for
from tests.helpers.serve import FAST_EXECUTOR, Daemon, short_home
from tests.helpers.slowdown import scaled

CAP = 2048


@pytest.fixture
def daemon(redis_server, namespace):
    d = Daemon(
        short_home(),
        config=FAST_EXECUTOR + f"\n[plugins.retention]\nlog_max_bytes = {CAP}\nlog_keep = 2\n",
        redis_url=redis_server.url,
        namespace=namespace,
        env={CHECK_ENV: "0.2"},
    )
    yield d
    d.cleanup()


def _run(d: Daemon, *argv: str) -> None:
    with d.api() as api:
        job = api.call("POST", "/v1/jobs", {"kind": "evaluation", "pool": "serve", "spec": {"argv": list(argv)}})["job"]
    wait_for(lambda: _state(d, job) == "succeeded", 30, interval=0.05, what=f"job {job} succeeds")


def _state(d: Daemon, job: str) -> str:
    with d.api() as api:
        return api.call("GET", f"/v1/jobs/{job}")["state"]


def test_the_serve_workers_log_past_the_cap_is_rotated_by_the_pass_and_its_writer_goes_on(daemon):
    d = daemon
    logs = d.home / "logs"
    logs.mkdir(parents=True)
    mine = logs / "mine.log"
    mine.write_bytes(b"x" * 4 * CAP)  # not a file the daemon writes: never touched
    d.start()
    log, first = logs / "worker-serve.log", logs / "worker-serve.log.1"
    deadline = time.monotonic() + scaled(90)
    while not first.exists():  # each job adds a few lines to the worker's log
        assert time.monotonic() < deadline, f"worker-serve.log never rotated: {log.stat().st_size} bytes"
        _run(d, "true")
    rotated = first.read_bytes()
    assert len(rotated) > CAP and b"event=worker.registered" in rotated
    # the worker writes on through its descriptor opened for appending: at the new start, with no hole before it
    _run(d, "true")
    wait_for(lambda: log.stat().st_size > 0, 30, what="the worker writes to its truncated log")
    assert not log.read_bytes().startswith(b"\0")
    # the keep count: a second rotation shifts `.1` to `.2`, and no `.3` ever appears
    deadline = time.monotonic() + scaled(90)
    while not (logs / "worker-serve.log.2").exists():
        assert time.monotonic() < deadline, "worker-serve.log was never rotated a second time"
        _run(d, "true")
    assert (logs / "worker-serve.log.2").read_bytes() == rotated
    while (logs / "worker-serve.log.2").read_bytes() == rotated:
        assert time.monotonic() < deadline + 90, "worker-serve.log was never rotated a third time"
        _run(d, "true")
    assert not (logs / "worker-serve.log.3").exists()
    assert mine.read_bytes() == b"x" * 4 * CAP
    assert "event=log.rotated" in d.daemon_log()
