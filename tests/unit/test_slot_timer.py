"""`slots.timer.BootTimer`: a timerfd on CLOCK_BOOTTIME a selector watches, armed at an absolute `clock.now()`."""

from __future__ import annotations

import select
from collections.abc import Iterator

import pytest

from piloop_worker import clock
from piloop_worker.slots.timer import BootTimer
from tests.helpers.slowdown import scaled


@pytest.fixture
def timer() -> Iterator[BootTimer]:
    t = BootTimer.open()
    if t is None:
        pytest.skip("no timerfd here")
    yield t
    t.close()


def test_it_fires_at_its_time_and_not_before(timer: BootTimer) -> None:
    at = clock.now() + 0.2
    timer.arm(at)
    assert not select.select([timer], [], [], 0.05)[0] or clock.now() >= at
    assert select.select([timer], [], [], scaled(5))[0] and clock.now() >= at
    timer.drain()
    assert not select.select([timer], [], [], 0)[0]  # quiet until armed again


def test_a_time_already_passed_fires_at_once_and_rearming_moves_it(timer: BootTimer) -> None:
    timer.arm(clock.now() - 10)
    assert select.select([timer], [], [], scaled(2))[0]
    timer.drain()
    timer.arm(clock.now() + 60)
    timer.arm(clock.now() + 0.05)  # moved sooner
    assert select.select([timer], [], [], scaled(5))[0]
