"""`python -m bench --quick` runs and prints its table, and `python -m bench.soak` its figures (smoke tests: no
figure is asserted, benchmarks are not tests). Few simulated workers, few jobs, to stay well under 30 s each."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_python_m_bench_quick_prints_its_table():
    got = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--only", "server", "--workers", "10"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert got.returncode == 0, got.stderr[-2000:]
    lines = got.stdout.splitlines()
    assert lines[0].startswith("| figure ") and "piloop/best" in lines[0], got.stdout
    assert any(line.startswith("| heartbeats/s, 10 workers") for line in lines), got.stdout
    assert any("load average" in line for line in lines), got.stdout


NEW_PARTS = ("recovery", "depth", "bytes", "heartbeats", "clone")


def test_python_m_bench_quick_measures_each_new_part(tmp_path):
    """The new parts of `--quick` in one run: each part's figures are in the run's JSON (facts of the run, not
    timings: a recovery either happened or carries its reason, the bytes are counted, the clone is at its head)."""
    out = tmp_path / "r.json"
    only = [x for part in NEW_PARTS for x in ("--only", part)]
    got = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", *only, "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert got.returncode == 0, got.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert not doc["failed"], doc["failed"]
    raw = doc["raw"]
    assert set(NEW_PARTS) <= set(raw), raw.keys()
    sides = raw["recovery"]["sides"]
    assert {"piloop short", "rq", "celery default", "celery short"} <= set(sides), sides
    for side in sides.values():
        # a side that ran again says whether its copies overlapped; one that did not says why
        assert (side["again_seconds"] is not None and side["overlapped"] is not None) or side["note"], side
    assert "never" in sides["rq"]["note"] or sides["rq"]["again_seconds"] is not None, sides["rq"]
    depths = raw["depth"]["depths"]
    assert [d["depth"] for d in depths] == [1000, 10_000], depths
    for d in depths:
        assert 0 < d["claim_p50_ms"] <= d["claim_p99_ms"] and d["bytes_per_queued_job"] > 0, d
    assert depths[0]["rq_bytes_per_queued_job"] > 0 and depths[0]["celery_bytes_per_queued_job"] > 0, depths[0]
    b = raw["bytes"]
    for key in ("piloop_queued", "rq_queued", "celery_queued", "piloop_finished", "rq_finished", "celery_finished"):
        assert b[key] > 0, (key, b)
    beats = raw["heartbeats"]["counts"]
    assert [c["workers"] for c in beats] == [100, 300], beats
    for c in beats:
        assert c["paced_heartbeats_per_second"] > 0 and c["paced_cpu"]["server"] > 0 and "rq_redis_cpu" in c, c
    c = raw["clone"]
    assert c["commits"] == 1000 and c["bundle_bytes"] > 0, c
    assert all(c[k] > 0 for k in ("first_seconds", "second_seconds", "git_clone_seconds")), c
    figures = {r["figure"].strip() for r in doc["rows"]}
    for start in (
        "recovery, worker SIGKILLed",
        "claim one of 10,000 queued",
        "Redis bytes a finished job",
        "heartbeats, 300 workers",
        "campaign clone, 1,000 commits",
    ):
        assert any(f.startswith(start) for f in figures), (start, figures)


def test_python_m_bench_soak_names_its_figures_and_retention_removes_the_jobs():
    """The retention soak, tiny: 300 jobs under a 2 s retention, rq and Celery at 20 jobs each. Facts only: the
    figures are named, and retention removed every job (what is left is far below 300 jobs' hashes)."""
    tiny = ["--jobs", "300", "--retention-seconds", "2", "--rate", "50", "--peer-jobs", "20", "--json"]
    got = subprocess.run(
        [sys.executable, "-m", "bench.soak", *tiny], cwd=ROOT, capture_output=True, text=True, timeout=150
    )
    assert got.returncode == 0, got.stderr[-2000:]
    f = json.loads(got.stdout)
    for key in ("piloop_bytes_per_job", "rq_bytes_per_job", "celery_bytes_per_job", "slope_bytes_per_second"):
        assert isinstance(f[key], int | float), (key, f[key])
    assert f["slope_bytes_per_1000_jobs"] is not None and f["slope_window"], f
    assert f["removed"] == 300 and f["retained_at_end"] == 0, f
    assert f["left"]["job_keys"] == 0, f["left"]
    # a retained job holds its hash and its report answer: 300 of them would be over 600 keys; the answers stay
    assert f["keys_end"] < f["keys_base"] + 300 + 20, (f["keys_base"], f["keys_end"])
    assert max(row[3] for row in f["series"]) > f["keys_end"], "the key count fell once the jobs were removed"


def test_python_m_bench_ops_costs_each_call_once_it_is_made():
    """Each kind of call measured, each for as many calls as asked (facts of the run, not figures: a call's CPU is
    above zero and its latency percentiles are ordered)."""
    got = subprocess.run(
        [sys.executable, "-m", "bench.ops", "--calls", "20", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert got.returncode == 0, got.stderr[-2000:]
    ops = {o["name"]: o for o in json.loads(got.stdout)["ops"]}
    assert set(ops) == {
        "submit (socket)",
        "claim (one job)",
        "log append (one chunk)",
        "report (one job)",
        "heartbeat (8 leases)",
    }
    assert ops["report (one job)"]["calls"] == 20 - 8 and ops["claim (one job)"]["calls"] == 20, ops
    for o in ops.values():
        assert o["server_cpu_ms"] > 0 and o["redis_commands"] >= 1 and 0 < o["p50_ms"] <= o["p99_ms"], o
    refused = subprocess.run(
        [sys.executable, "-m", "bench.ops", "--calls", "3"], cwd=ROOT, capture_output=True, text=True
    )
    assert refused.returncode == 2 and "--calls must be at least 16" in refused.stderr, refused.stderr


def test_a_bench_ended_by_sigterm_leaves_no_process_behind(tmp_path):
    """SIGTERM mid-drain: the bench ends, and every process it started (the server, its workers, their shims and
    jobs, Redis) ends with it, including any that left its tree. Its workers' job dirs are under `--worker-dirs`."""
    import signal

    import psutil

    from bench.children import RUN_ENV, marked
    from tests.helpers.redis import wait_for

    (tmp_path / "wd").mkdir()
    bench = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bench",
            "--quick",
            "--only",
            "jobs",
            "--jobs",
            "2000",
            "--out",
            str(tmp_path / "r.json"),
            "--worker-dirs",
            str(tmp_path / "wd"),
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        me = psutil.Process(bench.pid)

        def workers_running() -> list[psutil.Process]:
            kids = me.children(recursive=True)
            return kids if any("worker" in " ".join(p.cmdline()) for p in kids if p.is_running()) else []

        kids = wait_for(workers_running, 60, interval=0.2, what="the bench's piloop workers to start")
        mark = next(m for p in kids if p.is_running() and (m := p.environ().get(RUN_ENV)))
        wait_for(lambda: list((tmp_path / "wd").glob("bw-*/slots/[0-9]*")), 60, what="a slot under --worker-dirs")
        bench.send_signal(signal.SIGTERM)
        assert bench.wait(30) == 128 + signal.SIGTERM, bench.stderr.read() if bench.stderr else ""
        gone = wait_for(lambda: not [p for p in kids if p.is_running()] and not marked(mark), 10, what="all to end")
        assert gone
        assert not (tmp_path / "r.json").exists()  # a run cut short writes no figures
    finally:
        if bench.poll() is None:
            bench.kill()
