"""A host frozen past its job's lease, then thawed: the job's supervisor kills it at once with SIGKILL, no grace.

The worker, every process under it, the job's supervisor and the job are all stopped (SIGSTOP), as a frozen or
suspended host is, for longer than the lease; meanwhile the server hands the job on and another worker runs it. The
job ignores SIGTERM, so a supervisor that signalled it and waited the kill grace would let it run beside its copy for
that grace. The supervising side (everything of piloop's but the worker itself) is thawed first (its tick is already
due) and must have ended the job well inside the kill grace, then the job and the worker are thawed; the job's own
timestamps show no overlap, and the frozen worker's late report says `fenced`."""

from __future__ import annotations

import contextlib
import os
import signal

from tests.helpers.jobprocs import descendants, started, supervisor_of
from tests.helpers.redis import wait_for
from tests.helpers.workers import (
    KILL_GRACE,
    TOLERATION,
    events,
    marker_job,
    marker_runs,
    overlapping,
    pgid_alive,
    state,
    token,
)


def _signal(pid: int, sig: int, group: bool = False) -> None:
    with contextlib.suppress(ProcessLookupError):
        (os.killpg if group else os.kill)(pid, sig)


def test_a_host_frozen_past_the_lease_kills_at_once_on_thaw_and_never_overlaps(server, workers, tmp_path):
    d, marker = server, tmp_path / "marker"
    a = workers(d, token(d, "wa")).start()
    job = marker_job(d, marker, first_forever=True, ignore_term=True)
    first = started(marker, job)
    assert a.proc is not None
    supervisors = {supervisor_of(first["pid"]), *descendants(a.proc.pid)} - {a.proc.pid}
    supervisors = {p for p in supervisors if _pgid(p) != first["pgid"]}
    frozen = [(a.proc.pid, True), *((p, False) for p in sorted(supervisors)), (first["pgid"], True)]
    for pid, group in frozen:
        _signal(pid, signal.SIGSTOP, group)
    try:
        # the lease expires at the server, the job is queued again, and a second worker runs it
        state(d, job, "queued", timeout=TOLERATION + 10)
        workers(d, token(d, "wb")).start()
        wait_for(lambda: len(marker_runs(marker).get(job, [])) == 2, 30, interval=0.05, what="the copy on wb")
        for p in supervisors:
            _signal(p, signal.SIGCONT)
        # sooner than the kill grace (0.5 s): a supervisor that sent SIGTERM and waited it would not have ended the
        # job yet (a stopped job takes no SIGTERM; it would tick on once thawed, beside its copy)
        wait_for(lambda: not pgid_alive(first["pgid"]), KILL_GRACE * 0.8, interval=0.01, what="the job killed on thaw")
    finally:
        for pid, group in frozen:
            _signal(pid, signal.SIGCONT, group)
    wait_for(lambda: not pgid_alive(first["pgid"]), 2, interval=0.02, what="the frozen job to be gone")
    v = state(d, job, timeout=30)
    assert v["state"] == "succeeded" and v["worker"] == "wb", v
    runs = marker_runs(marker)[job]
    assert [r["where"] for r in runs] == ["wa", "wb"] and not overlapping(runs), runs
    # the frozen worker, thawed, reports its run fenced: late, kept as a stale report
    (stale,) = wait_for(
        lambda: [e for e in events(d, "lease.stale_report") if e["job"] == job],
        20,
        interval=0.1,
        what="wa's late report",
    )
    assert stale["outcome"] == "fenced" and stale["token"].split(".")[0] == first["token"].split(".")[0], stale
    assert f"event=job.ended job={job} outcome=fenced" in a.output()


def _pgid(pid: int) -> int:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return 0
