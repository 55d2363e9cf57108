"""One factor for every deadline the tests wait on: `PILOOP_TEST_SLOWDOWN` (default 1; docs/testing.md).

A loaded machine (a CI runner shared with other jobs, a laptop compiling) runs the same work slower: set the factor,
and every wait helper (`wait_for`, `Daemon.start`, `state`, …) and pytest's per-test timeout stretch by it. A
deadline is a bound on how long a condition may take to come true, never a sleep, so a larger factor costs nothing
when the machine is fast. Unset, the factor follows the machine: its 1-minute load average per CPU when that is
above 1 (a 2-CPU host at load 8 waits 4 × as long), so a plain `make test` holds on a busy host too."""

from __future__ import annotations

import os

ENV = "PILOOP_TEST_SLOWDOWN"


def factor() -> float:
    """The factor from the environment: a number ≥ 1 (anything else is a mistake, named); unset, the load's."""
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return load_factor()
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{ENV}={raw!r}: give a number, such as 1 (the default) or 3 on a loaded machine") from None
    if not value >= 1:
        raise ValueError(f"{ENV}={raw!r}: give a number of at least 1 (a deadline is never shortened)")
    return value


def scaled(seconds: float) -> float:
    """`seconds` of a deadline, stretched by the factor."""
    return seconds * factor()


def load_factor() -> float:
    """The 1-minute load average per CPU this process may use, never below 1: read at each call, so a deadline set
    while the machine is busy is stretched as it is busy."""
    cpus = len(os.sched_getaffinity(0)) or 1
    return max(1.0, os.getloadavg()[0] / cpus)
