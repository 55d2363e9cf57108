"""A warm task process whose task can no longer be renewed: its worker and shim host are SIGKILLed (the task's shim
lives on), so no renewal comes; the shim kills the warm process before the lease ends, and the server's copy of the
task on another worker never runs beside it."""

from __future__ import annotations

import time

from piloop_common.tasks import Client
from tests.helpers import warm_tasks_mod as m
from tests.helpers.redis import wait_for
from tests.helpers.slowdown import scaled
from tests.helpers.workers import (
    FENCE_AFTER,
    KILL_GRACE,
    TOLERATION,
    events,
    marker_runs,
    overlapping,
    pgid_alive,
    state,
    token,
)


def test_a_warm_task_that_cannot_renew_is_killed_before_its_lease_ends_and_never_overlaps(server, workers, tmp_path):
    d, marker = server, tmp_path / "marker"
    a = workers(d, token(d, "wa")).start()
    with Client.from_env(d.home) as c:
        before = m.where.apply_async(pool="gpu", client=c).get(timeout=scaled(60))
        job = m.marker.apply_async((str(marker), True), pool="gpu", client=c).id
    first = wait_for(lambda: (r := marker_runs(marker).get(job)) and r[-1], 30, interval=0.05, what="the first run")
    assert first["where"] == "wa"
    warm_pid = first["pgid"]  # a warm process is its own group's leader: the one the task before ran in
    assert warm_pid == before["pid"], (first, before)
    a.kill()
    killed = time.time()
    wait_for(lambda: not pgid_alive(warm_pid), FENCE_AFTER + KILL_GRACE + 2, interval=0.05, what="the task fenced")
    dead = time.time()
    state(d, job, "queued", timeout=TOLERATION + 10)
    (expired,) = [e for e in events(d, "lease.expired") if e["job"] == job]
    b = workers(d, token(d, "wb")).start()
    v = state(d, job, timeout=60)
    assert v["state"] == "succeeded" and v["worker"] == "wb", v
    runs = marker_runs(marker)[job]
    assert [r["where"] for r in runs] == ["wa", "wb"] and not overlapping(runs), runs
    # dead before the server could hand the task on: its last line is before the lease's end
    assert dead - killed < TOLERATION and runs[0]["last"] < runs[1]["start"], (killed, dead, runs)
    # and the lease ended (its event's stream id is Redis's clock, this machine's) after the warm task's last line
    assert (
        expired["token"].split(".")[0] == first["token"].split(".")[0]
        and int(expired["id"].split("-")[0]) / 1000 > runs[0]["last"]
    ), expired
    b.kill()
