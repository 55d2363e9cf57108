"""The bench's rounds: each drain's figures from its rounds (the median time and CPU, the most RSS, every failure),
and each round's own ratio of piloop to the best peer."""

from __future__ import annotations

import pytest

from bench.__main__ import merge_rounds, round_ratio, rows


def _drain(seconds: float, cpu: float, rss: float = 50.0, bad: int = 0) -> dict:
    return {"jobs": 100, "seconds": seconds, "not_succeeded": bad, "worker_rss_mib": rss, "server_rss_mib": rss + 10,
            "cpu_ms": {"server": cpu, "machine": 2 * cpu}}


def test_a_drain_is_the_median_of_its_rounds() -> None:
    rounds = [{"piloop process": _drain(1.0, 5.0, rss=60)}, {"piloop process": _drain(4.0, 9.0, bad=1)},
              {"piloop process": _drain(2.0, 6.0, rss=55, bad=2)}]
    got = merge_rounds(rounds)["piloop process"]
    assert got["seconds"] == 2.0  # so the rate shown is the median rate, 50 jobs/s
    assert got["cpu_ms"] == {"server": 6.0, "machine": 12.0}
    assert got["worker_rss_mib"] == 60 and got["server_rss_mib"] == 70
    assert got["not_succeeded"] == 3
    assert got["jobs"] == 100


def test_each_rounds_ratio_is_against_that_rounds_best_peer() -> None:
    one = {"piloop task": _drain(1.0, 1.0), "rq Worker python": _drain(4.0, 1.0),
           "Celery solo python": _drain(0.5, 1.0)}
    assert round_ratio(one, "task", "python") == pytest.approx(0.5)  # 100/s beside Celery solo's 200/s
    assert round_ratio({"piloop task": _drain(1.0, 1.0)}, "task", "python") is None


def test_the_table_names_the_rounds_and_gives_each_ratio() -> None:
    names = ["piloop process", "piloop task", "rq Worker subprocess", "rq Worker python"]
    per = [{n: _drain(s, 1.0) for n, s in zip(names, secs)} for secs in ([1.0, 1.0, 2.0, 4.0], [2.0, 1.0, 2.0, 1.0])]
    jobs = {**merge_rounds(per), "rounds": per}
    drain_rows = [r for r in rows({"jobs": jobs}) if r["figure"].startswith("drain")]
    assert [r["figure"] for r in drain_rows] == ["drain 100 jobs, 2 workers: /bin/true each, median of 2 rounds",
                                                 "drain 100 jobs, 2 workers: Python no-op, median of 2 rounds"]
    assert drain_rows[0]["note"] == "each round's ratio: 2.00, 1.00"
    assert drain_rows[1]["note"] == "piloop: tasks, each its own process; each round's ratio: 4.00, 1.00"
    assert drain_rows[0]["ratio"] == pytest.approx((100 / 1.5) / 50)  # the medians' ratio
