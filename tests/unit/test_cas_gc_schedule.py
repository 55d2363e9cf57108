"""The pass's schedule of the CAS garbage collection: once every `cas_gc_seconds` after the last one ended."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest

from piloop_server import cas_gc, tasks
from piloop_server.state.keys import Keys


class FakeRedis:
    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}

    def get(self, key: str) -> bytes | None:
        return self.values.get(key)


def _rt(every: float) -> Any:
    retention = SimpleNamespace(cas_gc_seconds=every, cas_grace_seconds=2 * 86400)
    return SimpleNamespace(
        settings=SimpleNamespace(plugins=SimpleNamespace(retention=retention)), redis=FakeRedis(), keys=Keys("t")
    )


@pytest.fixture
def submitted(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    got: list[tuple[str, str]] = []

    def submit(rt: Any, func: str, *args: Any, key: str, queue: str = tasks.DEFAULT) -> bool:
        got.append((func, key))
        return True

    monkeypatch.setattr(tasks, "submit", submit)
    return got


def test_the_first_collection_waits_a_period_from_the_start(submitted: list[tuple[str, str]]) -> None:
    rt, s = _rt(3600), cas_gc.GcSchedule()
    assert not s.tick(rt) and not submitted  # none ended, and the daemon only just started
    s.started_ms -= 3601 * 1000
    s.checked_at -= cas_gc.GcSchedule.CHECK_SECONDS
    assert s.tick(rt) and submitted == [("piloop_server.cas_gc:run_task", cas_gc.TASK_KEY)]


def test_a_recent_collection_defers_the_next_and_zero_never_runs(submitted: list[tuple[str, str]]) -> None:
    rt, s = _rt(3600), cas_gc.GcSchedule()
    s.started_ms -= 7200 * 1000
    rt.redis.values[rt.keys.cas_gc_last()] = str(int(time.time() * 1000) - 60_000).encode()  # a minute ago
    assert not s.tick(rt)
    rt.redis.values[rt.keys.cas_gc_last()] = str(int(time.time() * 1000) - 3_700_000).encode()
    s.checked_at -= cas_gc.GcSchedule.CHECK_SECONDS
    assert s.tick(rt)
    # queued and not yet ended: not queued again on the next check
    s.checked_at -= cas_gc.GcSchedule.CHECK_SECONDS
    assert not s.tick(rt) and len(submitted) == 1
    never = cas_gc.GcSchedule()
    never.started_ms = 0
    assert not never.tick(_rt(0)) and len(submitted) == 1
