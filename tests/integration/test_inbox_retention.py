"""The inbox is bounded: acknowledged items leave `events_seconds` after their acknowledgement, from the pass of a
real `piloop serve`, and past `[plugins.state] inbox_max` the oldest acknowledged items go first, then the oldest;
a flood of escalations is cut back as it comes. Counted in Redis's hash, not through the API.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from piloop_server.state.events import EventsState
from piloop_server.state.keys import Keys
from piloop_server.state.scripts import EventCap
from tests.helpers.redis import wait_for
from tests.helpers.serve import FAST_EXECUTOR, Daemon, short_home

AGE = 2  # events_seconds: the acknowledged items are waited past it before the daemon's first pass
CAP = 100
pytestmark = pytest.mark.timeout(90)


def _ids(r: Any, keys: Keys) -> set[str]:
    return {k.decode() for k in r.hkeys(keys.inbox())}


def _raised(r: Any, keys: Keys) -> dict[str, int]:
    return {k.decode(): json.loads(v)["at_ms"] for k, v in r.hgetall(keys.inbox()).items()}


def _assert_oldest_went(left: set[str], removed: set[str], raised: dict[str, int]) -> None:
    """Of the unacknowledged items, those removed were raised no later than any kept (items of one millisecond tie)."""
    assert removed, "nothing was removed"
    assert max(raised[e] for e in removed) <= min(raised[e] for e in left), "a newer item went before an older one"


def test_the_pass_removes_acknowledged_items_past_their_age_and_cuts_the_inbox_to_its_cap(
    redis_server: Any, redis_client: Any, namespace: str
) -> None:
    keys = Keys(namespace)
    events = EventsState(redis_client, keys)  # the default cap: nothing is cut as the items are written
    acked = [events.escalate("test.acked", f"acked {i}") for i in range(30)]
    unacked = [events.escalate("test.open", f"open {i}") for i in range(CAP + 30)]
    for eid in acked:
        assert events.ack(eid, "admin")
    acked_at = time.time()
    raised = _raised(redis_client, keys)
    assert redis_client.hlen(keys.inbox()) == 30 + CAP + 30
    wait_for(lambda: time.time() > acked_at + AGE + 0.5, AGE + 5, what=f"the acknowledgements to pass {AGE} s")

    config = FAST_EXECUTOR + f"\n[plugins.retention]\nevents_seconds = {AGE}\n"
    config += f'\n[plugins.state]\nurl = "{redis_server.url}"\ninbox_max = {CAP}\n'
    d = Daemon(short_home(), config=config, namespace=namespace)
    d.start()
    try:
        seeded = set(acked) | set(unacked)
        wait_for(lambda: len(_ids(redis_client, keys) & seeded) == CAP, 40, interval=0.2, what="the inbox's prune")
        left = _ids(redis_client, keys) & seeded
        assert not left & set(acked), "an acknowledged item past its age is still in the hash"
        assert left <= set(unacked)
        _assert_oldest_went(left, set(unacked) - left, raised)
        assert redis_client.hlen(keys.inbox()) <= CAP  # the daemon's own escalations, if any, within the cap too
    finally:
        d.cleanup()


def test_past_the_cap_acknowledged_items_go_first_then_the_oldest(redis_client: Any, namespace: str) -> None:
    keys = Keys(namespace)
    events = EventsState(redis_client, keys, EventCap(inbox_most=CAP))
    items = [events.escalate("test", f"item {i}") for i in range(CAP + 10)]  # under the flood margin: none cut yet
    newest_acked = items[-5:]
    for eid in newest_acked:
        events.ack(eid, "admin")
    assert redis_client.hlen(keys.inbox()) == CAP + 10

    raised = _raised(redis_client, keys)
    got = events.prune_inbox(None, batch=7)  # batches smaller than the hash: the scan and the removal page
    assert (got.acked, got.over_cap) == (0, 10)
    left = _ids(redis_client, keys)
    assert len(left) == CAP and not left & set(newest_acked), "the acknowledged ones go first"
    _assert_oldest_went(left, set(items[:-5]) - left, raised)
    # no age given: acknowledged items stay while under the cap
    assert events.prune_inbox(None) == type(got)(0, 0)


def test_a_flood_of_escalations_never_grows_the_inbox_past_its_cap_and_a_tenth(
    redis_client: Any, namespace: str
) -> None:
    keys = Keys(namespace)
    events = EventsState(redis_client, keys, EventCap(inbox_most=CAP))
    most = 0
    last = ""
    for i in range(5 * CAP):
        last = events.escalate("test.flood", f"flood {i}")
        most = max(most, int(redis_client.hlen(keys.inbox())))
    assert most <= CAP + CAP // 10, most
    assert CAP <= redis_client.hlen(keys.inbox()) <= CAP + CAP // 10
    assert last in _ids(redis_client, keys)  # the newest is kept: the oldest went
    assert f"flood {5 * CAP - 1}" in {i["message"] for i in events.inbox()}
    assert "flood 0" not in {i["message"] for i in events.inbox()}
