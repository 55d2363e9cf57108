"""`slots.record`: a slot's deadline record, mapped by two sides, read whole or not at all; and `slots.wire`, the
messages over a slot's socket, typed once and refused by name."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from piloop_worker.records import CgroupGrant, ExitRecord, StopReason, UsageRecord
from piloop_worker.slots import record as rec_mod
from piloop_worker.slots.record import SIZE, Deadline, SlotRecord
from piloop_worker.slots.wire import (
    Ack,
    Bye,
    Ended,
    Hello,
    Holding,
    SlotRequest,
    Start,
    Started,
    State,
    Stop,
    WireError,
    encode,
    parse,
)


def test_a_record_is_made_full_size_and_reads_none_until_written(tmp_path: Path) -> None:
    r = SlotRecord.open(tmp_path / "slot")
    assert os.path.getsize(tmp_path / "slot") == SIZE
    assert r.read() is None
    r.write(3, 1234.5)
    assert r.read() == Deadline(3, 1234.5)
    r.close()


def test_two_mappings_see_each_others_writes_in_place(tmp_path: Path) -> None:
    worker, supervisor = SlotRecord.open(tmp_path / "slot"), SlotRecord.open(tmp_path / "slot")
    inode = os.stat(tmp_path / "slot").st_ino
    for g in range(1, 50):
        worker.write(g, g * 10.0)
        assert supervisor.read() == Deadline(g, g * 10.0)
    assert os.stat(tmp_path / "slot").st_ino == inode and os.path.getsize(tmp_path / "slot") == SIZE
    worker.close()
    again = SlotRecord.open(tmp_path / "slot")  # a restarted worker: the record kept, not zeroed
    assert again.read() == Deadline(49, 490.0)
    again.close()
    supervisor.close()


def test_a_write_left_halfway_reads_as_none_and_the_next_write_mends_it(tmp_path: Path) -> None:
    r = SlotRecord.open(tmp_path / "slot")
    r.write(1, 5.0)
    rec_mod._SEQ.pack_into(r._map, 0, 3)  # a writer killed between its two seq updates
    assert r.read() is None  # never a value that may be half of two writes
    r.write(2, 6.0)
    assert r.read() == Deadline(2, 6.0)
    r.close()


def test_a_reader_never_takes_the_generation_of_one_write_with_the_deadline_of_another(tmp_path: Path) -> None:
    w, r = SlotRecord.open(tmp_path / "slot"), SlotRecord.open(tmp_path / "slot")
    stop = threading.Event()
    bad: list[Deadline] = []

    def write() -> None:
        g = 0
        while not stop.is_set():
            g += 1
            w.write(g, g * 1.5)

    t = threading.Thread(target=write)
    t.start()
    try:
        seen = 0
        for _ in range(100_000):
            got = r.read()
            if got is not None:
                seen += 1
                if got.deadline != got.generation * 1.5:
                    bad.append(got)
    finally:
        stop.set()
        t.join()
    assert not bad and seen
    w.close()
    r.close()


REQUEST = SlotRequest(
    argv=["sh", "-c", "exit 3"],
    env={"A": "1"},
    cgroup=CgroupGrant("/sys/fs/cgroup/x", 2, 64, 60.0),
    task="mod:fn",
    args=b'{"args": [1]}',
    parent=b"\x00\xff",
    warm_max_tasks=10,
)


@pytest.mark.parametrize(
    "msg",
    [
        Hello(),
        Bye(),
        Ack(4),
        Stop(4, StopReason.CANCELLED),
        Start(4, "job1", "tok", 123.25, REQUEST),
        Started(4, 99, 1700000000.5),
        Ended(4, ExitRecord(exit_code=0, usage=UsageRecord(10, 0.5), error=("builtins.OSError",)), b"\x01" * 10),
        Ended(5, ExitRecord(lost=True, reason="gone"), None, "/w/.piloop-result.json"),
        State(Holding(4, "job1", "tok", 99, 1.5, "/cg"), [Ended(3, ExitRecord(exit_code=1))]),
        State(None, []),
        # the worker's record of the assignment, opaque to the supervisor, given back for a restarted worker
        Start(4, "job1", "tok", 123.25, REQUEST, {"job": "job1", "spec": {"argv": ["true"]}}),
        State(
            Holding(4, "job1", "tok", 99, 1.5, None, {"job": "job1"}), [Ended(3, ExitRecord(), None, None, "j", "t")]
        ),
        Ended(6, ExitRecord(exit_code=0), None, None, "job1", "tok", {"job": "job1", "kind": "evaluation"}),
        Start(5, "j", "t", 1.0, SlotRequest(argv=["x"], task="m:f", args_file="/s/in/args.json", parent_file="/s/p")),
    ],
)
def test_each_message_round_trips(msg: object) -> None:
    assert parse(encode(msg)) == msg  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        (b"\xff", "not JSON"),
        (b"[1]", "message must be a JSON object"),
        (b'{"t": "launch"}', "unknown message type 'launch'"),
        (b'{"t": "ack"}', "ack: missing field 'generation'"),
        (b'{"t": "ack", "generation": "x"}', "ack: invalid literal"),
        (
            b'{"t": "start", "generation": 1, "job": "j", "token": "t", "deadline": 1, "request": {"argv": "true"}}',
            "start: request: argv must be a list",
        ),
        (b'{"t": "ended", "generation": 1, "exit": {}, "result": "***"}', "ended: result is not base64"),
    ],
)
def test_a_malformed_datagram_is_refused_by_name(raw: bytes, says: str) -> None:
    with pytest.raises(WireError, match="^" + says.replace("(", r"\(").replace("[", r"\[")):
        parse(raw)


def test_a_field_this_release_does_not_know_is_ignored() -> None:
    raw = b'{"t": "stop", "generation": 2, "reason": "cancelled", "later": true}'
    assert parse(raw) == Stop(2, StopReason.CANCELLED)
    assert parse(b'{"t": "stop", "generation": 2, "reason": "what"}') == Stop(2, StopReason.STOPPED)


def test_the_job_noted_on_a_slot_reads_back_whole_and_clears(tmp_path: Path) -> None:
    rec = SlotRecord.open(tmp_path / "slot")
    assert rec.read_assigned() is None
    rec.write_assigned(7, "j1234567890ab", "1000000000001." + "f" * 32)
    rec.write(7, 12.5)  # the deadline beside it is its own
    again = SlotRecord.open(tmp_path / "slot")  # as another process maps it
    assert again.read_assigned() == (7, "j1234567890ab", "1000000000001." + "f" * 32)
    assert again.read() == (7, 12.5)
    rec.write_assigned(0, "", "")
    assert again.read_assigned() is None
    rec.close()
    again.close()
