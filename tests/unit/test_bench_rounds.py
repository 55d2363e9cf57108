"""The bench's rounds: each drain's figures from its rounds (the median time and CPU, the most RSS, every failure),
and each round's own ratio of piloop to the best peer."""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from bench.__main__ import merge_rounds
from bench.measure import piloop_cpu
from bench.table import round_ratio, rows


def _drain(seconds: float, cpu: float, rss: float = 50.0, bad: int = 0) -> dict:
    return {
        "jobs": 100,
        "seconds": seconds,
        "not_succeeded": bad,
        "worker_rss_mib": rss,
        "server_rss_mib": rss + 10,
        "cpu_ms": {"server": cpu, "machine": 2 * cpu},
    }


def test_a_drain_is_the_median_of_its_rounds() -> None:
    rounds = [
        {"piloop process": _drain(1.0, 5.0, rss=60)},
        {"piloop process": _drain(4.0, 9.0, bad=1)},
        {"piloop process": _drain(2.0, 6.0, rss=55, bad=2)},
    ]
    got = merge_rounds(rounds)["piloop process"]
    assert got["seconds"] == 2.0  # so the rate shown is the median rate, 50 jobs/s
    assert got["cpu_ms"] == {"server": 6.0, "machine": 12.0}
    assert got["worker_rss_mib"] == 60 and got["server_rss_mib"] == 70
    assert got["not_succeeded"] == 3
    assert got["jobs"] == 100


def test_each_rounds_ratio_is_against_that_rounds_best_peer() -> None:
    one = {
        "piloop task": _drain(1.0, 1.0),
        "rq Worker python": _drain(4.0, 1.0),
        "Celery solo python": _drain(0.5, 1.0),
    }
    assert round_ratio(one, "task", "python") == pytest.approx(0.5)  # 100/s beside Celery solo's 200/s
    assert round_ratio({"piloop task": _drain(1.0, 1.0)}, "task", "python") is None


def test_the_table_names_the_rounds_and_gives_each_ratio() -> None:
    names = ["piloop process", "piloop task", "piloop task fresh", "rq Worker subprocess", "rq Worker python"]
    per = [
        {n: _drain(s, 1.0) for n, s in zip(names, secs, strict=True)}
        for secs in ([1.0, 1.0, 2.0, 2.0, 4.0], [2.0, 1.0, 4.0, 2.0, 1.0])
    ]
    jobs = {**merge_rounds(per), "rounds": per}
    drain_rows = [r for r in rows({"jobs": jobs}) if r["figure"].startswith("drain")]
    assert [r["figure"] for r in drain_rows] == [
        "drain 100 jobs, 2 workers: /bin/true each, median of 2 rounds",
        "drain 100 jobs, 2 workers: Python no-op, median of 2 rounds",
        "drain 100 jobs, 2 workers: Python no-op, a fork each, median of 2 rounds",
    ]
    assert drain_rows[0]["note"] == "each round's ratio: 2.00, 1.00"
    assert drain_rows[1]["note"] == "piloop: warm task processes (the default); each round's ratio: 4.00, 1.00"
    assert drain_rows[2]["note"] == "piloop: processes = fresh, a fork per task; each round's ratio: 2.00, 0.25"
    assert drain_rows[0]["ratio"] == pytest.approx((100 / 1.5) / 50)  # the medians' ratio


def test_the_cpu_row_compares_the_whole_machine_and_splits_it() -> None:
    piloop = {
        **_drain(1.0, 1.0),
        "cpu_ms": {
            "server": 1.0,
            "workers": 2.2,
            "redis": 0.3,
            "machine": 6.0,
            "worker": 1.9,
            "supervisors": 1.5,
            "jobs": 0.8,
        },
    }
    celery = {**_drain(0.5, 1.0), "cpu_ms": {"workers": 2.2, "jobs": 0.8, "redis": 0.2, "machine": 3.0}}
    rq = {**_drain(4.0, 1.0), "cpu_ms": {"workers": 9.0, "jobs": 6.0, "redis": 0.5, "machine": 12.0}}
    jobs = {
        "piloop process": piloop,
        "Celery solo subprocess": celery,
        "rq Worker subprocess": rq,
        "piloop task": _drain(1.0, 1.0),
    }
    cpu = [r for r in rows({"jobs": jobs}) if r["figure"].startswith("  CPU a job")]
    assert [r["figure"] for r in cpu] == [
        "  CPU a job of that drain, whole machine: /bin/true each",
        "  CPU a job of that drain, whole machine: Python no-op",
    ]
    assert cpu[1]["ratio"] is None and cpu[1]["note"] == "piloop: server 1.00"  # no peer ran Python no-ops here
    assert cpu[0]["peers"] == {"rq Worker": 12.0, "Celery solo": 3.0} and cpu[0]["better"] == "lower"
    assert cpu[0]["ratio"] == pytest.approx(2.0)  # piloop's 6 ms beside the cheaper peer's 3
    # the peer named is the one that spent the least; its worker's own CPU is its workers' less what they reaped
    assert cpu[0]["note"] == (
        "piloop: worker 1.90, supervisors 1.50, jobs 0.80, server 1.00, Redis 0.30; "
        "Celery solo: worker 1.40, jobs 0.80, Redis 0.20"
    )


def _burn_then(seconds: float, then: str) -> str:
    """Python that burns `seconds` of its own CPU, then runs `then`."""
    return f"import time\nend = time.process_time() + {seconds}\nwhile time.process_time() < end: pass\n{then}"


def test_piloop_cpu_finds_the_supervisors_and_their_jobs(tmp_path) -> None:
    """A worker, a slot supervisor and the job the supervisor reaps, each burning its own CPU (0.1, 0.4, 0.8 s): each
    part lands where piloop_cpu says, whatever else its interpreter's start-up costs (under 0.1 s)."""
    ready = tmp_path / "ready"
    spawn = "import subprocess, sys; subprocess.run([sys.executable, '-c', {!r}])"
    job = _burn_then(0.8, "")
    supervisor = _burn_then(0.4, spawn.format(job) + f"\nopen({str(ready)!r}, 'w').close(); sys.stdin.read()")
    worker = subprocess.Popen(
        [sys.executable, "-c", _burn_then(0.1, spawn.format(supervisor))], stdin=subprocess.PIPE, start_new_session=True
    )
    try:
        end = time.monotonic() + 60
        while not ready.exists():
            assert time.monotonic() < end, "the supervisor's job never ended"
            time.sleep(0.02)
        got = piloop_cpu([worker.pid])
        for part, burnt in (("worker", 0.1), ("supervisors", 0.4), ("jobs", 0.8)):
            assert burnt - 0.02 <= got[part] < burnt + 0.1, (part, got)
    finally:
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()


def test_a_recovery_that_did_not_happen_is_a_note_not_a_figure() -> None:
    """A side that did not run the job again within the run's limit shows no figure and no ratio, and its reason is
    in the notes; a side that did shows its seconds beside the peer that did too."""
    side = lambda name, again, note="": {  # noqa: E731
        "side": name,
        "again_seconds": again,
        "overlapped": None if again is None else False,
        "note": note,
    }
    res = {
        "recovery": {
            "limit_seconds": 15,
            "sides": {
                "piloop short": side("piloop, short timings", 6.2),
                "celery short": side("Celery, visibility_timeout 6 s", 40.0),
                "rq": side("rq Worker", None, "never: in StartedJobRegistry after 15 s"),
                "celery default": side("Celery, visibility_timeout 3600 s (default)", None, "> the run's limit"),
            },
        }
    }
    got = {r["figure"].strip(): r for r in rows(res)}
    short = next(r for f, r in got.items() if "short timings" in f)
    assert short["piloop"] == 6.2 and short["best"] == 40.0 and short["ratio"] == pytest.approx(6.2 / 40.0)
    assert "no overlap" in short["note"]
    peers = got["recovery: rq, Celery at its default visibility_timeout"]
    assert peers["piloop"] is None and peers["ratio"] is None
    assert "never: in StartedJobRegistry" in peers["note"] and "> the run's limit" in peers["note"]


def test_depths_that_are_not_counts_are_refused() -> None:
    from bench.__main__ import _counts

    assert _counts("1000,1000000") == [1000, 1_000_000]
    for bad in ("ten", "1000,", "0", "-5"):
        with pytest.raises(argparse.ArgumentTypeError, match=re.escape(repr(bad))):
            _counts(bad)
