"""Faults table: a late report (an evaluation's, and an agent's with its commits), the same report twice, a report
naming blobs the server's CAS lacks, and a report that waits in the spool while its worker is stopped or dead."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import uuid
from pathlib import Path

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
from tests.integration.test_campaigns import GIT_ENV, make_repo, show


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
    assert (
        stale["token"].split(".")[0] == first["token"].split(".")[0]
        and stale["by"] == "worker:wa"
        and stale["outcome"] == "fenced"
    )
    result = json.loads(stale["result"])
    store = LocalStore(d.home / "cas")
    # kept as its size and the addresses it names, never its body; the blobs stay in the CAS
    assert result["bytes"] > 0 and result["log_chunks"] >= 1
    assert b"partial\n" in [store.get_bytes(a) for a in result["addresses"]]
    assert all(store.has(a) for a in result["addresses"])
    # the job itself went back to the queue under a new token and ran again, once
    v = state(d, job, timeout=30)
    assert v["state"] == "succeeded" and v["token"].split(".")[0] != first["token"].split(".")[0], v
    assert store.get_bytes(v["result"]["outputs"]["result.txt"]) == b"final\n"
    assert "answer=stale" in w.output()


def _gated(gate: Path, script: str) -> str:
    """`script`, once the test has created `gate`: a job that is still running however slow the machine is."""
    return f"while [ ! -e {gate} ]; do sleep 0.05; done; {script}"


def _spooled_report(d, w, name: str, script: str) -> tuple[str, dict]:
    """A job whose report is written to the spool while nobody answers; the worker is then killed."""
    gate = w.home / "go"
    job = submit(d, "sh", "-c", _gated(gate, script))
    state(d, job, "running")
    d.stop()  # nobody answers (a paused server would still take the request into its socket's backlog)
    gate.touch()  # the job ends only now, its report out to a server that is gone
    (spooled,) = wait_for(lambda: w.spool(name), 15, what="the report in the spool")
    w.kill()
    return job, json.loads(spooled.read_text())


def test_the_same_report_twice_the_second_gets_the_first_answer(server, workers):
    d = server
    tok = token(d, "w1")
    w = workers(d, tok).start()
    job, report = _spooled_report(d, w, "w1", "echo done")
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


def test_a_spooled_report_for_a_job_retention_pruned_is_dropped_and_the_ones_behind_it_go_out(server, workers):
    d = server
    w = workers(d, token(d, "w1")).start()
    job, report = _spooled_report(d, w, "w1", "echo done")
    # a report older in the spool for a job no longer kept (pruned while its worker was away): first in line
    pruned = {**report, "job": "j" + "0" * 12, "report_id": str(uuid.uuid4())}
    first = w.home / "spool" / "w1" / f"{pruned['report_id']}.json"
    first.write_text(json.dumps(pruned))
    os.utime(first, (1, 1))
    d.start(listen=d.listen)
    w.start()
    v = state(d, job)
    assert v["state"] == "succeeded", v  # the pruned job's report did not hold the real one back
    wait_for(lambda: not w.spool("w1"), 10, what="the spool to empty")
    assert not list((w.home / "spool" / "w1").glob("*.bad"))  # answered stale, not set aside as malformed


def test_a_report_naming_blobs_the_cas_lacks_loses_the_job_naming_them(server, workers):
    d = server
    w = workers(d, token(d, "w1")).start()
    job, report = _spooled_report(d, w, "w1", "mkdir -p ../outputs; echo 42 > ../outputs/score.txt")
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
    gate = w.home / "go"
    job = submit(d, "sh", "-c", _gated(gate, "echo done"))
    state(d, job, "running")
    d.stop()
    gate.touch()
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


def test_an_agents_late_report_is_refused_and_its_commits_and_log_stay_in_the_cas_by_address(server, workers, tmp_path):
    d, flags = server, tmp_path / "flags"
    flags.mkdir()
    base = make_repo(tmp_path / "repo", big=10)
    # the first agent waits for `go`, then commits and ends well: a run whose report (its commits) is built only
    # once its worker wakes, after its lease is gone; later agents just wait to be stopped
    agent = (
        f"if [ ! -e {flags}/agent ]; then touch {flags}/agent; while [ ! -e {flags}/go ]; do sleep 0.05; done; "
        'echo late > late.txt && git add late.txt && git commit -qm "late $PILOOP_JOB" && echo "agent says bye"; '
        "else sleep 600; fi"
    )
    w = workers(d, token(d, "wa", "--pool", "gpu")).start()
    p = d.cli(
        "campaign",
        "create",
        "late",
        "--repo",
        str(tmp_path / "repo"),
        "--agent-pool",
        "gpu",
        "--eval-pool",
        "gpu",
        "--agent-cmd",
        agent,
        "--eval-cmd",
        "echo score=1",
    )
    assert p.returncode == 0, p.stderr
    wait_for(lambda: (flags / "agent").exists(), 30, interval=0.05, what="the first agent to start")
    (run,) = show(d, "late")["runs"]
    job = run["job"]
    held = state(d, job, "running")
    w.pause()
    (flags / "go").touch()  # it commits and exits 0 before its shim's deadline: nothing is fenced
    wait_for(
        lambda: [e for e in events(d, "lease.expired") if e["job"] == job],
        TOLERATION + 10,
        interval=0.2,
        what="the agent's lease to expire",
    )
    assert view(d, job)["state"] == "worker_lost"
    w.resume()  # now it collects the agent's commits into the CAS and reports them, late
    (stale,) = wait_for(
        lambda: [e for e in events(d, "lease.stale_report") if e["job"] == job],
        30,
        interval=0.2,
        what="the agent's late report to be kept as stale",
    )
    assert (
        stale["token"].split(".")[0] == held["token"].split(".")[0]
        and stale["by"] == "worker:wa"
        and stale["outcome"] == "succeeded"
    )
    wait_for(lambda: "answer=stale" in w.output(), 10, what="the worker to log the refusal")
    # refused: the run stays lost, its commits never become its branch in the campaign's repo
    assert view(d, job)["state"] == "worker_lost"
    lost = {r["job"]: r for r in show(d, "late")["runs"]}[job]
    assert lost["state"] == "worker_lost" and lost["score"] is None and lost["evaluation"] == "", lost
    repo = d.home / "campaigns" / "late" / "repo.git"
    assert not _git(repo, "for-each-ref", f"refs/heads/runs/{job}")
    # kept by address: each address the event names is read back from the server's CAS with `piloop cas get`
    addresses = json.loads(stale["result"])["addresses"]
    blobs = {}
    for i, a in enumerate(addresses):
        out = tmp_path / f"blob{i}"
        d.cli("cas", "get", a, "-o", str(out), check=True)
        blobs[a] = out
    bundles = [f for f in blobs.values() if f.read_bytes().startswith(b"# v2 git bundle")]
    assert len(bundles) == 1, addresses
    assert any(b"agent says bye" in f.read_bytes() for f in blobs.values()), addresses  # its log
    # the bundle holds the agent's commit on top of the base: fetched into a clone, it is there with its file
    clone = tmp_path / "clone"
    _git(tmp_path, "clone", "-q", str(tmp_path / "repo"), str(clone))
    _git(clone, "fetch", "-q", str(bundles[0]), "HEAD:refs/heads/late")
    assert _git(clone, "log", "-1", "--format=%s", "late") == f"late {job}"
    assert _git(clone, "rev-parse", "late~1") == base
    assert _git(clone, "show", "late:late.txt") == "late"


def _git(cwd: Path, *args: str) -> str:
    env = {**os.environ, **GIT_ENV}
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout.strip()
