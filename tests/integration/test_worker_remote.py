"""A real `piloop worker` against a real `piloop serve` over TCP: jobs run, fence, re-attach and report
through every fault the spec names (SIGKILL mid-job, a kill between a job's end and its report, refusals)."""

from __future__ import annotations

import json
import signal
import sys
import textwrap
import time
from pathlib import Path

import pytest

from piloop_common.cas.local import LocalStore
from tests.helpers.redis import wait_for
from tests.helpers.workers import (
    FENCE_AFTER,
    TOLERATION,
    events,
    job_cgroup,
    marker_job,
    marker_runs,
    pgid_alive,
    slot_dirs,
    state,
    submit,
    token,
    view,
)

# The `server` (a TCP `piloop serve` with a `gpu` pool) and `workers` fixtures are in tests/conftest.py.


# Appends "<pgid> <time> <job dir>" every 50 ms; runs until killed on the first try, for 1 s on the next.
MARKER_JOB = textwrap.dedent("""
    import os, time
    m = os.environ["MARKER"]
    first = not os.path.exists(m) or os.path.getsize(m) == 0
    end = time.time() + (1000 if first else 1.0)
    while time.time() < end:
        with open(m, "a") as f:
            f.write(f"{os.getpgid(0)} {time.time()} {os.environ['PILOOP_JOB_DIR']}\\n")
        time.sleep(0.05)
""")


def ticks(marker: Path) -> dict[str, list[tuple[int, float]]]:
    by_dir: dict[str, list[tuple[int, float]]] = {}
    for line in marker.read_text().splitlines():
        pgid, t, where = line.split(" ", 2)
        by_dir.setdefault(where, []).append((int(pgid), float(t)))
    return by_dir


def test_a_remote_worker_runs_an_evaluation(server, workers, tmp_path):
    d = server
    w = workers(d, token(d, "gpu1")).start()
    data = tmp_path / "data.txt"
    data.write_text("forty-two\n")
    # over a second long: host metrics start 1 s into a job (docs/worker.md)
    script = (
        "cat ../inputs/data.txt; echo from=$FROM; mkdir -p ../outputs; echo score=1 > ../outputs/result.txt; sleep 1.3"
    )
    job = submit(d, "sh", "-c", script, opts=("--input", str(data), "--env", "FROM=env"))
    v = state(d, job, "succeeded", "failed", "lost")
    assert v["state"] == "succeeded" and v["worker"] == "gpu1", v
    r = v["result"]
    store = LocalStore(d.home / "cas")
    assert b"".join(store.get_bytes(a) for a in r["log"]) == b"forty-two\nfrom=env\n"
    assert store.get_bytes(r["outputs"]["result.txt"]) == b"score=1\n"
    assert r["exit_code"] == 0 and r["usage"]["peak_rss_bytes"] > 0 and store.has(r["metrics"])
    assert "cpu_percent" in json.loads(store.get_bytes(r["metrics"]).splitlines()[0])
    short = state(d, submit(d, "true"), "succeeded", "failed", "lost")
    assert short["state"] == "succeeded" and short["result"]["metrics"] is None, short  # within its first second
    wait_for(
        lambda: not w.spool("gpu1") and not any(s.ended.exists() for s in slot_dirs(w.home / "work" / "gpu1")),
        20,
        what="the spool and job dir to be cleared",
    )
    rows = d.cli("worker", "list").stdout
    assert any(line.split()[:2] == ["gpu1", "gpu"] for line in rows.splitlines()), rows


def test_sigkilled_worker_fences_its_job_and_it_never_runs_twice(server, workers, tmp_path):
    d = server
    marker = tmp_path / "marker"
    a = workers(d, token(d, "wa")).start()
    job = submit(d, sys.executable, "-c", MARKER_JOB, opts=("--env", f"MARKER={marker}"))
    wait_for(lambda: marker.exists() and marker.read_text().count("\n") >= 3, 20, what="the job to run on wa")
    a.kill()
    killed = time.monotonic()
    (first_dir,) = ticks(marker)
    pgid = ticks(marker)[first_dir][0][0]
    wait_for(lambda: not pgid_alive(pgid), FENCE_AFTER + 3, interval=0.1, what="the job to be fenced")
    assert time.monotonic() - killed <= FENCE_AFTER + 3
    b = workers(d, token(d, "wb")).start()
    v = state(d, job, "succeeded", "failed", "lost", timeout=40)
    assert v["state"] == "succeeded" and v["worker"] == "wb", v
    runs = ticks(marker)
    assert len(runs) == 2
    second_dir = next(k for k in runs if k != first_dir)
    assert max(t for _, t in runs[first_dir]) < min(t for _, t in runs[second_dir])  # never at once
    # the fenced copy's report, sent when wa starts again, is late: kept as a stale report
    a.start()
    wait_for(
        lambda: "lease.stale_report" in d.cli("events", "--json").stdout,
        20,
        interval=0.2,
        what="wa's late report to be recorded stale",
    )
    assert "answer=stale" in a.output()
    b.kill()


def test_a_report_spooled_before_a_kill_goes_out_when_the_worker_restarts(server, workers):
    d = server
    w = workers(d, token(d, "w1")).start()
    job = submit(d, "sh", "-c", "sleep 1.5; echo done")
    state(d, job, "running")
    d.stop()  # nobody answers (a paused server would still take the request into its socket's backlog)
    spooled = wait_for(lambda: w.spool("w1"), 10, what="the report in the spool")
    w.kill()
    assert json.loads(spooled[0].read_text())["outcome"] == "succeeded"
    d.start(listen=d.listen)
    assert view(d, job)["state"] == "running"
    w.start()
    v = state(d, job, "succeeded", "failed", "lost")
    assert v["state"] == "succeeded" and v["result"]["exit_code"] == 0
    wait_for(lambda: not w.spool("w1"), 20, what="the spool to empty")


def test_a_detached_worker_leaves_its_job_running_and_its_successor_reattaches(server, workers, tmp_path):
    d = server
    marker = tmp_path / "marker"
    w = workers(d, token(d, "w1")).start()
    job = submit(d, "sh", "-c", f"echo $$ >> {marker}; sleep 4; echo done")
    wait_for(lambda: marker.exists() and marker.read_text(), 20, what="the job to start")
    group = job_cgroup(int(marker.read_text().split()[0]))
    w.proc.send_signal(signal.SIGTERM)
    assert w.wait(10) == 0
    pgid = int(marker.read_text().split()[0])
    assert pgid_alive(pgid)  # detached, not stopped
    w.start()
    v = state(d, job, "succeeded", "failed", "lost")
    assert v["state"] == "succeeded", v
    assert marker.read_text().split() == [str(pgid)]  # the same run, re-attached, never restarted
    assert "event=job.reattached" in w.output() and "status=ok" in w.output()
    if group is not None:  # a job cgroup (where one can be made): removed, its first worker being gone
        assert not Path(group).exists()


def test_a_cancelled_job_is_stopped_and_reported(server, workers, tmp_path):
    d = server
    marker = tmp_path / "marker"
    workers(d, token(d, "w1")).start()
    job = submit(d, "sh", "-c", f"echo $$ >> {marker}; exec sleep 100")
    wait_for(lambda: marker.exists() and marker.read_text(), 20, what="the job to start")
    d.cli("job", "cancel", job, check=True)
    state(d, job, "cancelled")
    wait_for(lambda: not pgid_alive(int(marker.read_text())), 5, what="the job's processes to end")


def test_a_job_cancelled_while_its_worker_is_silent_ends_cancelled_and_never_runs_again(server, workers, tmp_path):
    """Cancel wins over expiry: the worker SIGSTOPped before it could hear the cancel, its lease expires, and the
    job ends `cancelled`, not queued again, though another worker of the pool waits for work."""
    d, marker = server, tmp_path / "marker"
    a = workers(d, token(d, "wa")).start()
    job = marker_job(d, marker, first_forever=True)
    first = wait_for(lambda: (r := marker_runs(marker).get(job)) and r[0], 20, interval=0.05, what="the job to start")
    state(d, job, "running")
    workers(d, token(d, "wb")).start()
    a.pause()
    d.cli("job", "cancel", job, check=True)
    wait_for(lambda: view(d, job)["state"] != "running", TOLERATION + 10, interval=0.1, what="the lease to expire")
    v = view(d, job)
    assert v["state"] == "cancelled" and "went silent" in v["reason"], v
    wait_for(lambda: not pgid_alive(first["pgid"]), 5, interval=0.1, what="its supervisor to fence the silent run")
    a.resume()  # its late report changes nothing
    wait_for(lambda: [e for e in events(d, "lease.stale_report") if e["job"] == job], 20, what="the late report")
    assert view(d, job)["state"] == "cancelled"
    assert len(marker_runs(marker)[job]) == 1  # never run again, on wb or anywhere
    assert [e["job"] for e in events(d, "lease.granted")].count(job) == 1


@pytest.mark.parametrize("case", ["revoked", "pool", "cas"])
def test_a_refused_worker_exits_3_with_the_reason(server, workers, case):
    d = server
    tok = token(d, "w1")
    if case == "revoked":
        d.cli("token", "revoke", "w1", check=True)
    w = workers(d, tok, pool="tpu" if case == "pool" else "gpu", same_cas=case != "cas").start()
    assert w.wait(20) == 3
    expect = {"revoked": "token w1 was revoked", "pool": "unknown pool tpu", "cas": "is not the server's"}[case]
    assert "piloop worker: refused by the server: " in w.output() and expect in w.output()


def test_a_token_revoked_mid_job_stops_the_job_and_exits_3(server, workers, tmp_path):
    d = server
    marker = tmp_path / "marker"
    w = workers(d, token(d, "w1")).start()
    submit(d, "sh", "-c", f"echo $$ >> {marker}; exec sleep 100")
    wait_for(lambda: marker.exists() and marker.read_text(), 20, what="the job to start")
    d.cli("token", "revoke", "w1", check=True)
    assert w.wait(20) == 3
    assert "token w1 was revoked" in w.output()
    assert not pgid_alive(int(marker.read_text()))


def test_a_worker_with_state_credentials_refuses_to_start(server, workers):
    d = server
    w = workers(d, token(d, "w1"), env={"PILOOP_REDIS_URL": "redis://127.0.0.1:1/0"}).start()
    assert w.wait(20) == 2
    assert (
        w.output()
        .strip()
        .endswith("PILOOP_REDIS_URL is set: a worker holds no state credentials; unset it on this machine")
    )
