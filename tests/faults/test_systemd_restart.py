"""Faults table: a worker restarted by systemd. With `KillMode=process` (contrib/systemd/) a stop is SIGTERM to the
worker's main process alone: it detaches, its jobs run on under their supervisors, and the next start re-attaches
them. The default, `KillMode=control-group`, signals every process of the unit, supervisors and jobs too: the run is
lost."""

from __future__ import annotations

import os
import signal

import psutil

from tests.helpers.jobprocs import supervisor_of
from tests.helpers.redis import wait_for
from tests.helpers.workers import FENCE_AFTER, events, marker_job, marker_runs, overlapping, pgid_alive, state, token


def _systemd_worker(d, workers, tmp_path, name: str):
    """A worker started as contrib/systemd/piloop-worker@gpu.service starts it: the token from `--token-file`
    (none in the environment) and the same `--dir` at every start."""
    tok = tmp_path / f"{name}.token"
    tok.write_text(token(d, name) + "\n")
    tok.chmod(0o600)
    w = workers(d, "", env={"PILOOP_HTTPS_TOKEN": ""})
    w.args = ("--token-file", str(tok), "--dir", str(w.home / "work" / "gpu"))
    return w.start()


def _supervisors(marker, jobs: list[str]) -> dict[str, dict]:
    """{job: its first run's supervisor, pid and process group}, from the job's own marker lines."""
    runs = marker_runs(marker)
    return {j: {"supervisor": supervisor_of(runs[j][0]["pid"]), **runs[j][0]} for j in jobs}


def _alive(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _started(marker, jobs: list[str]) -> dict[str, dict]:
    return wait_for(
        lambda: (r := marker_runs(marker)) and all(j in r for j in jobs) and {j: r[j][0] for j in jobs},
        30,
        interval=0.05,
        what="every job to start",
    )


def test_systemd_stops_the_worker_alone_its_jobs_run_on_and_the_next_start_reattaches_them(server, workers, tmp_path):
    d, marker = server, tmp_path / "marker"
    w = _systemd_worker(d, workers, tmp_path, "wa")
    # the gpu pool's two slots: one agent and one evaluation, each long enough to outlast the restart
    jobs = [marker_job(d, marker, kind="agent", seconds=10), marker_job(d, marker, seconds=10)]
    first = _started(marker, jobs)
    for j in jobs:
        state(d, j, "running")
    supervisors = _supervisors(marker, jobs)
    assert w.proc is not None
    # `systemctl restart` under KillMode=process: SIGTERM to the main pid, not to its group or its control group
    os.kill(w.proc.pid, signal.SIGTERM)
    assert w.wait(30) == 0, w.output()
    assert "event=worker.detaching worker=wa jobs=2" in w.output()
    # the jobs and their supervisors stay in the unit
    for j, s in supervisors.items():
        assert _alive(psutil.Process(s["supervisor"])) and pgid_alive(s["pgid"]), (j, marker_runs(marker)[j])
    before = w.output()
    w.start()  # the same home, token file and --dir
    for j in jobs:
        v = state(d, j, timeout=40)
        assert v["state"] == "succeeded" and v["token"].split(".")[0] == first[j]["token"].split(".")[0], v
        runs = marker_runs(marker)[j]
        # the same run, re-attached, never restarted (so nothing overlaps it): one process group, ended by itself
        assert len(runs) == 1 and runs[0]["ended"] and runs[0]["pgid"] == first[j]["pgid"], runs
        assert [e["job"] for e in events(d, "lease.granted")].count(j) == 1
        assert [e["job"] for e in events(d, "job.succeeded")].count(j) == 1
    after = w.output()[len(before) :]
    assert after.count("event=job.reattached") == 2 and "status=ok" in after, after
    assert not [e for e in events(d, "lease.expired", "lease.stale_report") if e.get("job") in jobs]


def _unit_of(w, run: dict) -> list[int]:
    """Every process in the worker's unit: the worker, everything under it, the job's supervisor and the job (the
    supervisors' sessions are their own, but a control group holds them all)."""
    assert w.proc is not None
    found = [w.proc.pid, *(p.pid for p in psutil.Process(w.proc.pid).children(recursive=True))]
    assert supervisor_of(run["pid"]) in found and run["pid"] in found, (found, run)
    return found


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def test_systemd_sigterms_the_whole_control_group_the_run_dies_and_is_not_reattached(server, workers, tmp_path):
    d, marker = server, tmp_path / "marker"
    w = _systemd_worker(d, workers, tmp_path, "wa")
    job = marker_job(d, marker, seconds=4)
    (first,) = _started(marker, [job]).values()
    state(d, job, "running")
    # KillMode=control-group's stop: SIGTERM to every process of the unit at once (nothing is left for its SIGKILL)
    _signal_all(_unit_of(w, first), signal.SIGTERM)
    assert w.wait(30) == 0, w.output()
    wait_for(lambda: not pgid_alive(first["pgid"]), 5, interval=0.05, what="the job to die with its unit")
    w.start()
    v = state(d, job, timeout=FENCE_AFTER + 30)
    runs = marker_runs(marker)[job]
    assert not runs[0]["ended"], runs  # a detached run would have run on to its end
    # the job had the SIGTERM itself and died of it before its supervisor stopped it: reported failed, or, where it
    # stopped it first, lost and run again from the start; re-attached in neither case
    assert (v["state"], v["reason"], len(runs)) == ("failed", "killed by signal 15", 1) or (
        v["state"] == "succeeded" and len(runs) == 2 and v["token"].split(".")[0] != first["token"].split(".")[0]
    ), (v, runs)
    assert not overlapping(runs)


def test_systemd_kills_the_whole_control_group_the_run_is_lost_and_runs_again(server, workers, tmp_path):
    d, marker = server, tmp_path / "marker"
    w = _systemd_worker(d, workers, tmp_path, "wa")
    job = marker_job(d, marker, seconds=3)
    (first,) = _started(marker, [job]).values()
    state(d, job, "running")
    # KillMode=control-group's final SIGKILL (or `systemctl kill -s KILL`): every process of the unit at once;
    # nothing is left to write an exit record
    _signal_all(_unit_of(w, first), signal.SIGKILL)
    assert w.wait(10) == -signal.SIGKILL
    wait_for(lambda: not pgid_alive(first["pgid"]), 5, interval=0.05, what="the job to die with its unit")
    before = w.output()
    w.start()
    v = state(d, job, timeout=FENCE_AFTER + 30)
    assert v["state"] == "succeeded" and v["token"].split(".")[0] != first["token"].split(".")[0], v
    runs = marker_runs(marker)[job]
    # the killed run never ended; the job ran again from the start under a new lease
    assert len(runs) == 2 and not runs[0]["ended"] and runs[1]["ended"] and not overlapping(runs), runs
    assert [e["job"] for e in events(d, "lease.granted")].count(job) == 2
    assert [e["job"] for e in events(d, "job.succeeded")].count(job) == 1
    after = w.output()[len(before) :]
    # the restarted worker found the run's supervisor gone and said so: lost, queued again by it, not by an expiry
    assert "outcome=lost" in after, after
    said = [e["type"] for e in events(d) if e.get("job") == job and e.get("by") == "worker:wa"]
    assert "job.queued" in said and "lease.expired" not in [e["type"] for e in events(d) if e.get("job") == job]
