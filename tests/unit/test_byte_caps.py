"""A job's log and a task's result bounded in bytes: the worker's shipper stopping at the cap with one marker, the
server's cut of a report's log against the live one, and a task's result over its cap."""

from __future__ import annotations

from pathlib import Path

from piloop_common.bytecaps import LOG_MARKER_ROOM, log_marker, result_refusal, task_result
from piloop_common.cas.local import LocalStore
from piloop_common.sizes import format_bytes
from piloop_server.state.logcap import Live, cut_log, live_prefix, tail
from piloop_worker.logs import LogShipper


def test_the_shipper_stops_at_the_cap_with_one_marker_and_a_restarted_one_ships_no_more(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "cas")
    output_log, state = tmp_path / "output.log", tmp_path / "log.json"
    output_log.write_bytes(b"a" * 6000)
    sh = LogShipper(output_log, state)
    first = sh.upload(store, max_bytes=10_000)
    assert [store.get_bytes(a) for a in first] == [b"a" * 6000] and not sh.truncated  # under the cap: all of it
    sh.mark_posted(len(first))
    with open(output_log, "ab") as f:
        f.write(b"b" * 9000)
    new = sh.upload(store, max_bytes=10_000)
    assert [store.get_bytes(a) for a in new] == [b"b" * 4000, log_marker(10_000)]
    assert sh.offset == 10_000 and sh.truncated
    sh.mark_posted(len(new))
    with open(output_log, "ab") as f:
        f.write(b"c" * 100)
    again = LogShipper(output_log, state, resume=True)  # a restarted worker knows the log was cut
    assert again.truncated and not again.due(0.0) and not again.due(1000.0)
    assert again.upload(store, max_bytes=10_000) == [] and len(again.chunks) == 3
    assert sum(len(store.get_bytes(a)) for a in again.chunks) == 10_000 + len(log_marker(10_000))


def test_a_log_exactly_at_the_cap_is_whole(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "cas")
    output_log = tmp_path / "output.log"
    output_log.write_bytes(b"x" * 4096)
    sh = LogShipper(output_log, tmp_path / "log.json")
    assert [store.get_bytes(a) for a in sh.upload(store, max_bytes=4096)] == [b"x" * 4096]
    assert not sh.truncated
    assert len(log_marker(2**40)) <= LOG_MARKER_ROOM  # the marker of any cap fits the room the server leaves


def test_a_reports_log_matches_the_live_one_at_its_end() -> None:
    assert live_prefix(["a", "b", "c", "d"], ["x", "a", "b"]) == 2  # an earlier attempt's chunks before them
    assert live_prefix(["a", "b"], []) == 0
    assert live_prefix(["q", "b"], ["a", "b"]) == 0  # the report's first chunks are not the live ones
    assert live_prefix(["a", "a", "a"], ["a", "a"]) == 2


def test_a_reports_log_is_cut_at_the_byte_cap_past_the_live_one() -> None:
    sizes = {"c": 400, "d": 400, "m": 60}
    live = Live(["a", "b"], bytes=600)
    assert tail(["a", "b", "c", "d"], live, 100) == ["c", "d"]  # only the chunks not sized at their append
    cut = cut_log(["a", "b", "c", "d"], live, sizes, most_chunks=100, most_bytes=1000)
    assert (cut.log, cut.dropped, cut.truncated) == (["a", "b", "c"], 1, True)  # d would pass the cap and its room
    whole = cut_log(["a", "b", "c"], live, sizes, most_chunks=100, most_bytes=1000)
    assert (whole.log, whole.dropped, whole.truncated) == (["a", "b", "c"], 0, False)
    at_cap = Live(["a", "b"], bytes=1000)
    marked = cut_log(["a", "b", "m"], at_cap, sizes, most_chunks=100, most_bytes=1000)
    assert (marked.log, marked.dropped, marked.truncated) == (["a", "b", "m"], 0, True)  # the worker's marker
    was_cut = Live(["a"], bytes=100, cut=True, truncated=True)
    assert tail(["a", "m"], was_cut, 100) == []
    assert cut_log(["a", "m"], was_cut, sizes, 100, 1000).log == ["a"]  # nothing after a cut, however small
    few = cut_log(["a", "b", "c", "d"], Live([]), sizes, most_chunks=3, most_bytes=10**9)
    assert (few.log, few.dropped, few.truncated) == (["a", "b", "c"], 1, False)


def test_a_tasks_result_over_its_cap_is_refused_naming_the_key_and_the_size(tmp_path: Path) -> None:
    assert format_bytes(64 * 2**20) == "64 MiB" and format_bytes(80 * 2**20) == "80 MiB"
    assert format_bytes(int(80.04 * 2**20)) == "80.0 MiB" and format_bytes(512) == "512 bytes"
    assert result_refusal(64 * 2**20, 64 * 2**20) == ""
    assert result_refusal(int(80.04 * 2**20), 64 * 2**20) == (
        "the task's result is 80.0 MiB, over [plugins.state] result_max_bytes = 64 MiB"
    )
    task = {"runner": "task"}
    assert task_result(task, ["out.txt", "result.pickle"]) == "result.pickle"
    assert task_result({"runner": "process"}, ["result.json"]) is None  # a process's output of that name is its own
    why = result_refusal(2000, 1024)
    assert "result_max_bytes = 1 KiB" in why and "2.0 KiB" in why
