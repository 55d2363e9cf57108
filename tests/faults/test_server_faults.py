"""Faults table: the server does not answer (SIGSTOP), the machine sleeps (the daemon, its worker and their jobs
all stopped at once), and `piloop serve` restarts with jobs running on its `serve` worker."""

from __future__ import annotations

import datetime
import os
import re
import signal
import subprocess
import sys
import time

from tests.helpers.jobprocs import descendants, supervisor_of
from tests.helpers.redis import wait_for
from tests.helpers.serve import FAST_EXECUTOR, cli_env
from tests.helpers.slowdown import scaled
from tests.helpers.workers import (
    GRACE,
    TOLERATION,
    events,
    kill_tree_of,
    lease_seconds_left,
    marker_job,
    marker_runs,
    overlapping,
    pgid_alive,
    state,
    submit,
    tcp_server,
    token,
)


def test_the_server_does_not_answer_the_worker_fences_its_job_before_the_lease_ends(server, workers, tmp_path):
    d, marker = server, tmp_path / "marker"
    w = workers(d, token(d, "wa")).start()
    job = marker_job(d, marker, first_forever=True)
    first = wait_for(lambda: (r := marker_runs(marker).get(job)) and r[0], 20, interval=0.05, what="the job to start")
    state(d, job, "running")
    d.pause()
    paused = time.monotonic()
    # the lease's last renewal is in: it ends when its key's TTL runs out in Redis (which runs on), unless the daemon
    # is back first; the worker's fence is its last acknowledged send + toleration − 2 × renew, sooner than that
    lease_ends = time.monotonic() + lease_seconds_left(d, job)
    assert paused < lease_ends <= paused + TOLERATION
    wait_for(lambda: "event=worker.unreachable" in w.output(), 5, what="the worker to log worker.unreachable")
    wait_for(lambda: not pgid_alive(first["pgid"]), TOLERATION + 2, interval=0.05, what="the job to be fenced")
    gone = time.monotonic()
    print(f"\nthe job was fenced {lease_ends - gone:.2f} s before its lease's end")
    assert gone < lease_ends, gone - lease_ends  # before its lease could expire
    wait_for(lambda: time.monotonic() > paused + TOLERATION + 2, TOLERATION + 3)  # the lease's time is past
    assert w.output().count("event=worker.unreachable") == 1  # at the first failure, then at most once a minute
    d.resume()
    v = state(d, job, timeout=40)
    assert v["state"] == "succeeded", v
    runs = marker_runs(marker)[job]
    assert len(runs) == 2 and not overlapping(runs), runs
    assert [e["job"] for e in events(d, "job.succeeded")].count(job) == 1
    assert "event=worker.reachable" in w.output()
    # the daemon itself was away longer than the grace period: the spec's "the machine sleeps" row holds, nothing
    # expires. The lease is re-armed (by the pass, or by the heartbeat or report that reaches the API first), so the
    # fenced run's report lands on time: the evaluation is queued again (not an attempt), never a result
    assert events(d, "daemon.rearmed") and not [e for e in events(d, "lease.expired") if e["job"] == job]
    mine = [e for e in events(d) if e.get("job") == job and e.get("token") == first["token"].split(".")[0]]
    assert [e["type"] for e in mine if e["type"] in ("job.queued", "lease.stale_report")] == ["job.queued"], mine
    assert v["token"].split(".")[0] != first["token"].split(".")[0] and v["attempts"] == 1


def _pgid(pid: int) -> int:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return 0


def _freeze(pids: list[int], pgids: list[int], sig: int) -> None:
    for g in pgids:
        try:
            os.killpg(g, sig)
        except ProcessLookupError:
            pass
    for p in pids:
        try:
            os.kill(p, sig)
        except ProcessLookupError:
            pass


def test_the_machine_sleeps_a_gap_longer_than_grace_is_the_daemons_absence_nothing_expires(server, tmp_path):
    d, marker = server, tmp_path / "marker"
    # 6 s: it is still running after the thaw (a frozen sleep ends at once on waking), so the re-armed lease is its
    job = marker_job(d, marker, pool="serve", seconds=6)
    run = wait_for(lambda: (r := marker_runs(marker).get(job)) and r[0], 20, interval=0.05, what="the job to start")
    state(d, job, "running")
    supervisor = supervisor_of(run["pid"])
    # everything on the machine stops at once: the daemon and its worker (one process group), every process under
    # them, the job's supervisor and the job (Redis is elsewhere and runs on, its lease TTLs counting down)
    under = {p for p in descendants(d.proc.pid) if _pgid(p) != run["pgid"]}
    everything = ([d.proc.pid], sorted(under | {supervisor}), [run["pgid"]])
    _freeze(everything[1], [everything[0][0], everything[2][0]], signal.SIGSTOP)
    asleep = time.monotonic()
    # longer than the grace period; shorter than the fence (toleration − 2 × renew = 5 s): SIGSTOP, unlike a real
    # suspend, lets CLOCK_MONOTONIC run on, so a longer freeze would have the job's supervisor fence it on waking
    wait_for(lambda: time.monotonic() > asleep + GRACE + 1.5, GRACE + 3)
    _freeze(everything[1], [everything[2][0], everything[0][0]], signal.SIGCONT)
    v = state(d, job, timeout=30)
    assert v["state"] == "succeeded", v
    assert not [e for e in events(d, "lease.expired") if e["job"] == job]
    (rearmed,) = events(d, "daemon.rearmed")
    assert int(rearmed["gap_ms"]) > GRACE * 1000 and int(rearmed["leases"]) >= 1
    runs = marker_runs(marker)[job]
    assert len(runs) == 1 and runs[0]["ended"], runs


# the restart's own timings: a stop and a start take seconds on a loaded machine (each a Python's imports), so the
# jobs outlive it and the fence (toleration − 2 × renew) leaves it ample room; re-attaching is what is tested here
RESTART_EXECUTOR = FAST_EXECUTOR.replace("grace_seconds = 2\n", "grace_seconds = 10\n").replace(
    "toleration_seconds = 6\n", "toleration_seconds = 40\n"
)
assert RESTART_EXECUTOR.count("= 10\n") and RESTART_EXECUTOR.count("= 40\n")


def test_piloop_serve_restarts_its_worker_reattaches_and_each_job_finishes_once(redis_server, namespace, tmp_path):
    d, marker = tcp_server(redis_server.url, namespace, config=RESTART_EXECUTOR), tmp_path / "marker"
    try:
        _restarts_and_reattaches(d, marker)
    finally:
        d.cleanup()
        kill_tree_of(str(d.home))


def _restarts_and_reattaches(d, marker) -> None:
    jobs = [marker_job(d, marker, pool="serve", seconds=scaled(20)) for _ in range(2)]
    for j in jobs:
        state(d, j, "running")
    before = {j: marker_runs(marker)[j][0]["pgid"] for j in jobs}
    assert len(set(before.values())) == 2 and all(pgid_alive(g) for g in before.values()), before
    # `piloop stop` waits for the daemon's pid to go; the test's Popen is its parent and must reap it (a detached
    # daemon's parent is init)
    stopper = subprocess.Popen(
        [sys.executable, "-m", "piloop_common.cli", "stop"],
        env=cli_env(d.home, d.env),
        stdout=subprocess.PIPE,
        text=True,
    )
    d.proc.wait(scaled(40))
    out = stopper.communicate(timeout=scaled(20))[0]
    assert "its worker's jobs run on" in out, out  # detached: under their supervisors
    # detached, not stopped: each job's group still runs, or (a slow stop on a loaded machine) its run already
    # ended by itself, not killed
    for j, g in before.items():
        assert pgid_alive(g) or marker_runs(marker)[j][0]["ended"], (j, marker_runs(marker)[j])
    d.start(listen=d.listen)
    for j in jobs:
        v = state(d, j, timeout=30)
        assert v["state"] == "succeeded" and v["attempts"] == 1, v
        runs = marker_runs(marker)[j]
        assert len(runs) == 1 and runs[0]["ended"], runs  # the same run, re-attached, never restarted
        assert [e["job"] for e in events(d, "lease.granted")].count(j) == 1  # never requeued
    log = (d.home / "logs" / "worker-serve.log").read_text()
    assert log.count("event=job.reattached") == 2 and "status=ok" in log


UNREACHABLE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*event=worker\.unreachable ", re.M)


def _unreachable_at(w) -> list[float]:
    """When the worker logged `event=worker.unreachable`, from its log's own timestamps (seconds)."""
    fmt = "%Y-%m-%d %H:%M:%S,%f"
    return [datetime.datetime.strptime(t, fmt).timestamp() for t in UNREACHABLE.findall(w.output())]


def test_the_server_does_not_answer_for_over_a_minute_each_call_is_tried_again_and_logged_once_a_minute(
    server, workers, tmp_path
):
    d, go = server, tmp_path / "go"
    w = workers(d, token(d, "wa")).start()
    job = submit(d, "sh", "-c", f"while [ ! -e {go} ]; do sleep 0.05; done; echo done")
    state(d, job, "running")
    d.pause()
    go.touch()  # the job ends while nobody answers: its report has to wait
    wait_for(lambda: _unreachable_at(w), 5, what="worker.unreachable at the first failure")
    wait_for(lambda: w.spool("wa"), 10, what="the unsent report kept to be tried again")
    seen = {"most": 0}

    def second_line() -> bool:
        seen["most"] = max(seen["most"], len(_unreachable_at(w)))
        return seen["most"] >= 2

    # heartbeats, claims and the report fail many times a second meanwhile; the log says so once a minute
    wait_for(second_line, 60 + 15, interval=0.2, what="the second worker.unreachable line")
    first, second = _unreachable_at(w)
    assert 60 <= second - first < 60 + 10, second - first
    d.resume()
    v = state(d, job, "succeeded", timeout=30)  # the report, tried again, lands
    assert v["worker"] == "wa" and v["result"]["exit_code"] == 0, v
    wait_for(lambda: not w.spool("wa"), 10, what="the spool to empty")
    back = wait_for(
        lambda: re.search(r"event=worker\.reachable worker=wa .*after_seconds=([\d.]+)", w.output()),
        10,
        what="worker.reachable",
    )
    assert float(back.group(1)) >= 60
    later = submit(d, "true")  # and it claims again
    assert state(d, later, "succeeded")["worker"] == "wa"
    assert len(_unreachable_at(w)) == 2


def test_a_worker_started_while_the_server_does_not_answer_tries_to_register_again_until_it_does(server, workers):
    d = server
    tok = token(d, "wb")
    d.stop()  # connections are refused: each try fails at once
    w = workers(d, tok).start()
    wait_for(lambda: _unreachable_at(w), 15, what="worker.unreachable at the first failed register")
    spool = w.home / "spool" / "wb"
    assert w.alive and not spool.exists()  # it waits, unregistered: a worker opens its spool once registered
    d.start(listen=d.listen)
    wait_for(lambda: "event=worker.reachable worker=wb" in w.output(), 30, what="the register, tried again, to land")
    # reachable is said at the first answer (the check before the CAS); the spool opens once the register is in
    wait_for(spool.is_dir, 15, interval=0.1, what="the spool, opened once registered")
    job = submit(d, "true")
    assert state(d, job, "succeeded")["worker"] == "wb"
    assert len(_unreachable_at(w)) == 1  # under a minute: the first failure's line only
