"""Memory grants with real processes: a real `piloop serve` and `piloop worker`, jobs in real memory cgroups.

A job that allocates past its grant is killed by the kernel, reported out of memory and retried at 1.5 x its
grant until it fits; a job held at its limit (thrashing, never killed) is stopped after the pool's
`memory_held_seconds`; a worker whose room is 2 GiB does not take a third 1 GiB job while two run (its room is
set with PILOOP_MEMORY_AVAILABLE_MB, not by changing the host). A failed job waits out its backoff and is tried
again; a cancelled one never is."""

from __future__ import annotations

import json
import socket
import sys
import time

import pytest

from piloop_worker.cgroups import Cgroups
from tests.helpers.redis import wait_for
from tests.helpers.workers import events, state, submit, tcp_server, token, view

CGROUPS = Cgroups("piloop-memtest")
if CGROUPS.available:
    CGROUPS.base.rmdir()
needs_cgroups = pytest.mark.skipif(
    not CGROUPS.available,
    reason=f"no writable memory cgroup here ({CGROUPS.reason}): grants are only checked at claim, not enforced",
)

POOL = """
[plugins.executor.pools.mem]
agents = 0
evaluations = 3
max_load = 1000
min_memory_gb = 0
memory_reserve_mb = 512
memory_held_seconds = 1.5
"""
# touches every page, so each MiB is charged (a zeroed allocation may not be until written)
ALLOC = "import sys; b = b'\\x01' * ({mb} << 20); print('allocated', len(b) >> 20, 'MiB', flush=True)"
# writes a file twice its limit, then reads it over and over: at its limit, refaulting, never OOM-killed
THRASH = """
import os
with open('big.bin', 'wb') as f:
    for _ in range({mb}):
        f.write(b'\\1' * (1 << 20))
while True:
    with open('big.bin', 'rb') as f:
        while f.read(1 << 20):
            pass
"""

# a grandchild the job never reaps (so the job's rusage, from wait4, cannot count it) touches 150 MiB for 0.2 s; the
# job ends once it has (the pipe's write end closed in every process)
SPIKE = """
import os, time
r, w = os.pipe()
if os.fork() == 0:
    if os.fork() == 0:
        b = b'\\x01' * (150 << 20)
        time.sleep(0.2)
    os._exit(0)
os.close(w)
os.wait()
os.read(r, 1)
"""


@pytest.fixture
def mem(redis_server, namespace, workers):
    """A server with the pool `mem` and one worker for it whose available memory is `avail` MiB."""
    made = []

    def start(avail: int):
        d = tcp_server(redis_server.url, namespace, extra=POOL)
        made.append(d)
        w = workers(
            d, token(d, "m1", "--pool", "mem"), pool="mem", env={"PILOOP_MEMORY_AVAILABLE_MB": str(avail)}
        ).start()
        return d, w

    yield start
    for d in made:
        d.cleanup()


def _worker_or_none(d, name: str) -> dict | None:
    """The worker's row once it is reachable and has claimed with its room."""
    rows = json.loads(d.cli("worker", "list", "--json", check=True).stdout)
    row = next((r for r in rows if r["name"] == name), None)
    return row if row and row["reachable"] and row["room_mb"] else None


def _worker(d, name: str) -> dict:
    rows = json.loads(d.cli("worker", "list", "--json", check=True).stdout)
    return next(r for r in rows if r["name"] == name)


@needs_cgroups
def test_out_of_memory_is_retried_with_a_larger_grant_until_it_fits(mem):
    d, _ = mem(4096)
    # ~10 MiB of interpreter + 70 MiB: killed at 64 MiB, fits in 96
    job = submit(d, sys.executable, "-c", ALLOC.format(mb=70), pool="mem", opts=("--memory", "64M"))
    v = state(d, job, timeout=60)
    assert v["state"] == "succeeded", v
    assert v["attempts"] == 2 and v["memory_mb"] == 96, v
    (retry,) = events(d, "job.retrying")
    assert retry["job"] == job and retry["memory_mb"] == "96" and retry["delay_ms"] == "0"
    assert retry["reason"] == "out of memory at 64 MiB; the next attempt is granted 96 MiB"
    granted = [e for e in events(d, "lease.granted") if e["job"] == job]
    assert len(granted) == 2


@needs_cgroups
def test_a_job_held_at_its_limit_is_stopped_after_the_pools_time(mem):
    d, _ = mem(4096)
    started = time.monotonic()
    job = submit(
        d, sys.executable, "-c", THRASH.format(mb=96), pool="mem", opts=("--memory", "48M", "--memory-growth", "1")
    )
    v = state(d, job, timeout=60)
    took = time.monotonic() - started
    assert v["state"] == "failed", v
    # stopped by the shim (SIGTERM), not killed by the kernel; growth 1: its grant is its cap
    assert v["reason"] == "out of memory (held at its limit for 1.5s) at 48 MiB, its cap", v
    assert v["result"]["oom"] is True and v["result"]["signal"] == 15, v["result"]
    assert took < 30, took


@needs_cgroups
def test_a_jobs_peak_memory_is_its_cgroups_even_for_a_moment(mem, job_cgroups):
    """The kernel's peak: the shim's samples, every 0.5 s, would see the 150 MiB only by landing in its 0.2 s."""
    if (watch := job_cgroups.take(64).peak_watch()) is None:
        pytest.skip("this kernel cannot reset a cgroup v2 peak (memory.peak, writable from Linux 6.12)")
    watch.close()
    d, _ = mem(4096)
    v = state(d, submit(d, sys.executable, "-c", SPIKE, pool="mem", opts=("--memory", "512M")), timeout=60)
    assert v["state"] == "succeeded", v
    assert 150 << 20 <= v["result"]["usage"]["peak_rss_bytes"] < 512 << 20, v["result"]


def test_a_worker_takes_no_job_whose_grant_does_not_fit_its_room(mem):
    d, w = mem(2048 + 512)  # room = available - the pool's reserve = 2 GiB
    bad = d.cli("job", "submit", "--pool", "mem", "--memory", "4X", "--", "true")
    assert bad.returncode != 0 and "--memory '4X'" in bad.stderr and "Traceback" not in bad.stderr, bad
    assert json.loads(d.cli("job", "list", "--json", check=True).stdout) == []  # nothing was queued
    flag = w.home / "go"
    wait = ("sh", "-c", f"while [ ! -e {flag} ]; do sleep 0.05; done")
    jobs = [submit(d, *wait, pool="mem", opts=("--memory", "1G")) for _ in range(3)]
    for j in jobs[:2]:
        state(d, j, "running")
    # the claim after the two leases answered `memory`: the third was seen and did not fit
    row = wait_for(
        lambda: (r := _worker(d, "m1"))["no_lease"] == "memory" and r,
        15,
        interval=0.1,
        what="m1's claim to answer memory",
    )
    assert row["room_mb"] == 2048 and row["granted_mb"] == 2048, row
    assert view(d, jobs[2])["state"] == "queued"
    wide = d.cli("worker", "list", "--wide", check=True).stdout.splitlines()
    assert wide[0].split()[-2:] == ["room", "granted"]
    m1 = next(r for r in wide if r.split()[0] == "m1").split()
    assert m1[-6:] == ["memory", socket.gethostname(), "2.0", "GiB", "2.0", "GiB"], m1
    st = d.cli("status", check=True).stdout
    assert "memory granted/room" in st and "2.0/2.0 GiB" in next(r for r in st.splitlines() if r.startswith(" mem ")), (
        st
    )
    flag.touch()
    for j in jobs:
        assert state(d, j, timeout=30)["state"] == "succeeded"
    third = [e for e in events(d, "lease.granted", "job.succeeded") if e["job"] in jobs]
    # the third was leased only once one of the first two had ended
    first_end = min(i for i, e in enumerate(third) if e["type"] == "job.succeeded")
    assert next(i for i, e in enumerate(third) if e["type"] == "lease.granted" and e["job"] == jobs[2]) > first_end


def test_a_failed_job_waits_its_backoff_then_runs_again_and_a_cancel_ends_the_wait(mem):
    d, _ = mem(4096)
    job = submit(d, "false", pool="mem", opts=("--max-attempts", "2", "--backoff", "1s"))
    v = state(d, job, "failed", timeout=30)
    assert v["attempts"] == 2 and v["reason"] == "exit code 1", v
    ev = [e for e in events(d, "job.retrying", "job.requeued", "lease.granted") if e["job"] == job]
    assert [e["type"] for e in ev] == ["lease.granted", "job.retrying", "job.requeued", "lease.granted"], ev
    assert ev[1]["delay_ms"] == "1000" and ev[1]["reason"] == "exit code 1; attempt 1 of 2 failed"
    gap_ms = int(ev[3]["id"].split("-")[0]) - int(ev[1]["id"].split("-")[0])
    assert gap_ms >= 1000, gap_ms
    # a job waiting out its backoff that is cancelled ends at once and is never tried again
    other = submit(d, "false", pool="mem", opts=("--max-attempts", "3", "--backoff", "1h"))
    v = wait_for(lambda: (x := view(d, other))["retry_ms"] and x, 20, interval=0.1, what="the retry to wait")
    assert v["state"] == "queued" and v["attempts"] == 1
    assert d.cli("job", "cancel", other, check=True).stdout.strip() == f"{other}: cancelled"
    v = view(d, other)
    assert v["state"] == "cancelled" and v["retry_ms"] == 0, v


def test_job_show_says_why_a_queued_job_waits(mem):
    """A queued job that no live worker of its pool can take says why, in `job show`; it stays queued (a worker may
    come): its grant past every worker's room, an image no worker runs, a pool with no live worker."""
    d, w = mem(2048 + 512)  # room 2 GiB
    wait_for(lambda: _worker_or_none(d, "m1"), 30, interval=0.1, what="the worker to claim with its room")
    big = submit(d, "true", pool="mem", opts=("--memory", "4G"))
    v = view(d, big)
    assert v["state"] == "queued", v
    assert v["waiting"] == (
        "its grant of 4.0 GiB is larger than the room of every live worker of pool mem (the most: 2.0 GiB)"
    ), v
    shown = d.cli("job", "show", big, check=True).stdout.splitlines()
    assert shown[3].split()[0] == "state" and shown[4].split(None, 1) == ["waiting", v["waiting"]], shown
    other = submit(d, "true", pool="mem", opts=("--image", "other:1"))
    assert view(d, other)["waiting"] == "no live worker of pool mem runs image other:1"
    fits = submit(d, "true", pool="mem", opts=("--memory", "1G"))
    assert state(d, fits, "succeeded")["waiting"] == ""  # one that fits runs, beside the ones that wait
    assert [view(d, j)["state"] for j in (big, other)] == ["queued"] * 2
    listed = json.loads(d.cli("job", "list", "--json", check=True).stdout)
    assert all(j["waiting"] == "" for j in listed)  # a listing does not read the workers for each job
    w.terminate()  # the pool's only worker goes
    wait_for(
        lambda: view(d, big)["waiting"] == "no live worker in pool mem",
        30,
        interval=0.1,
        what="the job to say its pool has no live worker",
    )
    assert view(d, big)["state"] == "queued"
