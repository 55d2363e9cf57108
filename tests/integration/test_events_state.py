"""The events stream as state/events.py writes and reads it, on a real redis-server: an event's id is the
stream's, whatever its fields say, and values past the cap are cut."""

from __future__ import annotations

import pytest

from piloop_server.state.events import EventsState
from piloop_server.state.keys import Keys
from piloop_server.state.scripts import EventCap


def test_an_event_field_named_id_is_refused_and_a_stored_one_never_hides_the_stream_id(redis_client, namespace):
    keys = Keys(namespace)
    ev = EventsState(redis_client, keys, EventCap(1000, 64))
    with pytest.raises(ValueError, match="field named id"):
        ev.add("test.bad", "admin", id="handle-1")
    assert redis_client.xlen(keys.events()) == 0  # nothing written
    # one written by another hand (an older server, a script) with an `id` field
    eid = redis_client.xadd(keys.events(), {"type": "test.old", "by": "admin", "id": "handle-2"}).decode()
    (got,) = ev.read()
    assert got["id"] == eid and got["type"] == "test.old"
    (tail,) = ev.tail(1)
    assert tail["id"] == eid
    # the cursor is the stream's: reading after it finds nothing more
    assert ev.read(after=eid) == []


def test_a_value_past_the_cap_is_cut(redis_client, namespace):
    ev = EventsState(redis_client, Keys(namespace), EventCap(1000, 64))
    ev.add("test.long", "admin", note="x" * 1000)
    (got,) = ev.read()
    assert got["note"] == "x" * 64 + "..."
