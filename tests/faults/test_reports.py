"""Faults table: a late report, the same report twice, a report naming blobs the server's CAS lacks, and a
report that waits in the spool while its worker is stopped or dead."""

from __future__ import annotations

import json
import signal

from piloop_common.cas.local import LocalStore
from tests.helpers.redis import wait_for
from tests.helpers.workers import (
    FENCE_AFTER,
    KILL_GRACE,
    TOLERATION,
    events,
    marker_job,
    marker_runs,
    pgid_alive,
    state,
    submit,
    token,
    view,
    worker_api,
)


def test_a_late_report_is_refused_and_kept_as_a_stale_report_event_its_blobs_in_the_cas(server, workers, tmp_path):
    d, marker = server, tmp_path / "marker"
    w = workers(d, token(d, "wa")).start()
    job = marker_job(d, marker, first_forever=True)
    first = wait_for(lambda: (r := marker_runs(marker).get(job)) and r[0], 20, interval=0.05, what="the job to start")
    w.pause()  # the worker and its shim host stop; the job's shim does not, and fences it at its deadline
    wait_for(lambda: not pgid_alive(first["pgid"]), FENCE_AFTER + KILL_GRACE + 2, interval=0.1, what="the fence")
    wait_for(
        lambda: [e for e in events(d, "lease.expired") if e["job"] == job],
        TOLERATION + 5,
        interval=0.2,
        what="the lease to expire",
    )
    w.resume()  # its report of the fenced run, with the partial output, is now late
    (stale,) = wait_for(
        lambda: [e for e in events(d, "lease.stale_report") if e["job"] == job],
        20,
        interval=0.2,
        what="the late report to be kept as stale",
    )
    assert stale["token"] == first["token"] and stale["by"] == "worker:wa" and stale["outcome"] == "fenced"
    result = json.loads(stale["result"])
    store = LocalStore(d.home / "cas")
    # kept as its size and the addresses it names, never its body; the blobs stay in the CAS
    assert result["bytes"] > 0 and result["log_chunks"] >= 1
    assert b"partial\n" in [store.get_bytes(a) for a in result["addresses"]]
    assert all(store.has(a) for a in result["addresses"])
    # the job itself went back to the queue under a new token and ran again, once
    v = state(d, job, timeout=30)
    assert v["state"] == "succeeded" and v["token"] != first["token"], v
    assert store.get_bytes(v["result"]["outputs"]["result.txt"]) == b"final\n"
    assert "answer=stale" in w.output()


def _spooled_report(d, w, name: str, script: str) -> tuple[str, dict]:
    """A job whose report is written to the spool while nobody answers; the worker is then killed."""
    job = submit(d, "sh", "-c", script)
    state(d, job, "running")
    d.stop()  # nobody answers (a paused server would still take the request into its socket's backlog)
    (spooled,) = wait_for(lambda: w.spool(name), 15, what="the report in the spool")
    w.kill()
    return job, json.loads(spooled.read_text())


def test_the_same_report_twice_the_second_gets_the_first_answer(server, workers):
    d = server
    tok = token(d, "w1")
    w = workers(d, tok).start()
    job, report = _spooled_report(d, w, "w1", "sleep 1; echo done")
    d.start(listen=d.listen)
    with worker_api(d, tok) as api:
        first = api.call("POST", "/v1/worker/report", report)
        second = api.call("POST", "/v1/worker/report", report)
    assert first == second == {"answer": "accepted", "state": "succeeded"}
    w.start()  # and the worker's own copy, from its spool, a third
    # the worker logs the answer just after it removes the spool file: wait for both
    wait_for(lambda: not w.spool("w1") and "answer=accepted" in w.output(), 20, what="the spool to empty")
    assert view(d, job)["state"] == "succeeded"
    assert [e["job"] for e in events(d, "job.succeeded")].count(job) == 1


def test_a_report_naming_blobs_the_cas_lacks_loses_the_job_naming_them(server, workers):
    d = server
    w = workers(d, token(d, "w1")).start()
    job, report = _spooled_report(d, w, "w1", "sleep 1; mkdir -p ../outputs; echo 42 > ../outputs/score.txt")
    gone = report["outputs"]["score.txt"]
    LocalStore(d.home / "cas").path_of(gone).unlink()  # the blob leaves the server's CAS before the report lands
    d.start(listen=d.listen)
    w.start()
    v = state(d, job)
    assert v["state"] == "lost" and gone in v["reason"] and "the CAS lacks 1 blob" in v["reason"], v
    assert v["attempts"] == 0
    wait_for(lambda: not w.spool("w1"), 10, what="the spool to empty")


def test_a_report_waits_in_the_spool_while_its_worker_is_stopped_and_goes_out_when_it_starts(server, workers):
    d = server
    w = workers(d, token(d, "w1")).start()
    job = submit(d, "sh", "-c", "sleep 1; echo done")
    state(d, job, "running")
    d.stop()
    wait_for(lambda: w.spool("w1"), 15, what="the report in the spool")
    w.proc.send_signal(signal.SIGTERM)  # detaches: the report it could not send stays
    assert w.wait(20) == 0
    (spooled,) = w.spool("w1")
    assert spooled.parent == w.home / "spool" / "w1" and json.loads(spooled.read_text())["job"] == job
    d.start(listen=d.listen)
    assert view(d, job)["state"] == "running"
    w.start()
    v = state(d, job)
    assert v["state"] == "succeeded" and v["result"]["exit_code"] == 0, v
    wait_for(lambda: not w.spool("w1"), 10, what="the spool to empty")
