"""PILOOP_TEST_SLOWDOWN (docs/testing.md): one factor for every deadline the tests wait on, never below 1."""

from __future__ import annotations

import pytest

from tests.helpers import slowdown
from tests.helpers.redis import wait_for


def test_the_factor_stretches_deadlines_and_defaults_to_the_load_per_cpu(monkeypatch):
    monkeypatch.delenv(slowdown.ENV, raising=False)
    monkeypatch.setattr(slowdown.os, "getloadavg", lambda: (0.5, 0.5, 0.5))
    assert slowdown.scaled(30) == 30  # an idle machine: never below 1
    cpus = len(slowdown.os.sched_getaffinity(0))
    monkeypatch.setattr(slowdown.os, "getloadavg", lambda: (4.0 * cpus, 1.0, 1.0))
    assert slowdown.scaled(30) == 120  # load 4 per CPU: deadlines 4 × as long
    monkeypatch.setattr(slowdown.os, "getloadavg", lambda: (0.5, 0.5, 0.5))
    monkeypatch.setenv(slowdown.ENV, "2.5")
    assert slowdown.scaled(30) == 75
    # the wait helpers stretch their own deadlines: a 0.2 s wait says it gave up after 0.5 s
    with pytest.raises(AssertionError, match=r"timed out after 0.5s waiting for nothing"):
        wait_for(lambda: False, 0.2, interval=0.05, what="nothing")


@pytest.mark.parametrize(
    ("raw", "says"),
    [("fast", "give a number"), ("0.5", "give a number of at least 1"), ("nan", "give a number of at least 1")],
)
def test_a_factor_that_is_no_number_of_at_least_one_is_refused_naming_it(monkeypatch, raw, says):
    monkeypatch.setenv(slowdown.ENV, raw)
    with pytest.raises(ValueError, match=f"PILOOP_TEST_SLOWDOWN={raw!r}: {says}"):
        slowdown.factor()
