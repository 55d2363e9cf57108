"""A host frozen past its job's lease, then thawed: the shim kills at once with SIGKILL, no grace.

The worker, its shim host, the shim and the job are all stopped (SIGSTOP), as a frozen or suspended host is, for
longer than the lease; meanwhile the server hands the job on and another worker runs it. The job ignores SIGTERM, so
a shim that signalled it and waited the kill grace would let it run beside its copy for that grace. The shim is
thawed first (its tick is already due) and must have ended the job well inside the kill grace, then the job and the
worker are thawed; the job's own timestamps show no overlap."""

from __future__ import annotations

import contextlib
import json
import os
import signal

from tests.helpers.redis import wait_for
from tests.helpers.workers import (
    KILL_GRACE,
    TOLERATION,
    job_dirs,
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
    first = wait_for(lambda: (r := marker_runs(marker).get(job)) and r[-1], 20, interval=0.05, what="the first run")
    (jd,) = job_dirs(a.home / "work" / "wa")
    shim = json.loads(jd.shim_json.read_text())
    frozen = [(a.proc.pid, True), (shim["shim"], False), (first["pgid"], True)]
    for pid, group in frozen:
        _signal(pid, signal.SIGSTOP, group)
    try:
        # the lease expires at the server, the job is queued again, and a second worker runs it
        state(d, job, "queued", timeout=TOLERATION + 10)
        workers(d, token(d, "wb")).start()
        wait_for(lambda: len(marker_runs(marker).get(job, [])) == 2, 30, interval=0.05, what="the copy on wb")
        _signal(shim["shim"], signal.SIGCONT)
        # sooner than the kill grace (0.5 s): a shim that sent SIGTERM and waited it would not have ended the job yet
        # read while its worker is still frozen: thawed, it reports the job and removes the dir
        rec = wait_for(jd.exit_record, KILL_GRACE * 0.8, interval=0.01, what="the thawed shim's exit record")
    finally:
        for pid, group in frozen:
            _signal(pid, signal.SIGCONT, group)
    wait_for(lambda: not pgid_alive(first["pgid"]), 2, interval=0.02, what="the frozen job to be gone")
    assert rec.stopped == "fenced" and rec.signal == signal.SIGKILL, rec  # SIGKILL, not SIGTERM and a grace
    v = state(d, job, timeout=30)
    assert v["state"] == "succeeded" and v["worker"] == "wb", v
    runs = marker_runs(marker)[job]
    assert [r["where"] for r in runs] == ["wa", "wb"] and not overlapping(runs), runs
    wait_for(lambda: f"event=job.ended job={job} outcome=fenced" in a.output(), 20, interval=0.1, what="wa's word")
