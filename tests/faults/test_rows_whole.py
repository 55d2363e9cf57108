"""Faults table rows made whole, for real: the machine sleeps (a frozen cgroup holding the daemon, its Redis and the
job), `piloop serve` restarts under an agent, a started worker goes silent, two servers share one account, and a
worker dies during a run while most of its pool is silent (the disruption hold)."""

from __future__ import annotations

import itertools
import json
import os
import socket
import time
from collections.abc import Iterator

import pytest

from piloop_common.client import ApiClient
from piloop_common.errors import PiloopError
from tests.helpers.freezer import Freezer, group, tree
from tests.helpers.redis import redis_process, wait_for
from tests.helpers.serve import Daemon, short_home
from tests.helpers.workers import GRACE, events, job_dirs, marker_job, marker_runs, state

FENCE = 5.0  # toleration 6 − 2 × renew 0.5: a job is fenced this long after its worker's last acknowledged send


@pytest.fixture
def freezer() -> Iterator[Freezer]:
    f, why = Freezer.open(f"piloop-test-{os.getpid()}-{time.monotonic_ns()}")
    if f is None:
        pytest.skip(f"no writable cgroup v1 freezer: {why}")
    try:
        yield f
    finally:
        f.close()


def _ticks(marker, job: str) -> list[float]:
    """The times of a job's marker lines, in order."""
    return [float(line.split()[-1]) for line in marker.read_text().splitlines() if f" {job} " in line]


def _answers(d: Daemon) -> bool:
    try:
        with ApiClient.local(d.home, timeout=0.3) as api:
            return bool(api.call("GET", "/v1/health")["ok"])
    except PiloopError:
        return False


def _pongs(port: int) -> bool:
    """Whether Redis answers a PING within 0.3 s (one try: a client library would retry)."""
    with socket.create_connection(("127.0.0.1", port), timeout=0.3) as s:
        s.sendall(b"PING\r\n")
        try:
            return s.recv(16).startswith(b"+PONG")
        except TimeoutError:
            return False


def test_the_machine_sleeps_a_frozen_daemon_redis_and_job_past_grace_expire_nothing_and_finish_once(
    freezer, tmp_path, namespace
):
    with redis_process(tmp_path / "redis") as rp:
        d = Daemon(short_home(), redis_url=rp.url, namespace=namespace)
        try:
            d.start()
            marker = tmp_path / "marker"
            job = marker_job(d, marker, pool="serve", seconds=5)
            run = wait_for(
                lambda: (r := marker_runs(marker).get(job)) and r[0], 20, interval=0.05, what="the job to start"
            )
            state(d, job, "running")
            (shim,) = [json.loads(jd.shim_json.read_text()) for jd in job_dirs(d.home / "work" / "serve")]
            assert shim["pgid"] == run["pgid"]
            assert d.proc is not None and rp.proc is not None

            def machine() -> set[int]:
                # the daemon with its `serve` worker, shim host and background workers; its Redis; the job's shim
                # (a session of its own) and the job's process group
                return tree(d.proc.pid) | {rp.proc.pid, shim["shim"]} | group(run["pgid"])

            assert _answers(d) and _pongs(rp.port)  # so their silence below is the freeze's
            freezer.add(machine())
            freezer.freeze()
            asleep = time.monotonic()
            assert machine() <= freezer.procs()  # nothing was left running, nothing forked outside meanwhile
            assert not _answers(d)
            assert not _pongs(rp.port)
            # asleep longer than grace (2 s), shorter than the fence (5 s after the last acknowledged send, at most
            # one renew before the freeze): the freezer, like SIGSTOP, lets CLOCK_MONOTONIC run on
            wait_for(lambda: time.monotonic() > asleep + GRACE + 1, GRACE + 2, what="the sleep to outlast grace")
            freezer.thaw()
            slept = time.monotonic() - asleep
            assert GRACE < slept < FENCE - 1, slept

            v = state(d, job, timeout=30)
            assert v["state"] == "succeeded" and v["attempts"] == 1, v
            (rearmed,) = events(d, "daemon.rearmed")
            assert int(rearmed["gap_ms"]) > GRACE * 1000 and int(rearmed["leases"]) >= 1, rearmed
            assert not events(d, "lease.expired")
            mine = [e["type"] for e in events(d) if e.get("job") == job]
            assert mine.count("lease.granted") == 1 and mine.count("job.succeeded") == 1, mine
            assert mine.count("job.queued") == 1, mine  # the submit's; never queued again
            runs = marker_runs(marker)[job]
            assert len(runs) == 1 and runs[0]["ended"] and runs[0]["token"] == run["token"], runs
            # the job itself slept: its 50 ms ticks stop for the freeze and go on, in the same run
            ticks = _ticks(marker, job)
            assert max(b - a for a, b in itertools.pairwise(ticks)) > GRACE, ticks
        finally:
            freezer.close()  # before the cleanup stops them: a frozen process takes no signal
            d.cleanup()
