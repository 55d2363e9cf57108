"""The heartbeat's answer acts only on jobs the worker still holds: a job reported while the answer was on its way
(the server then answers `lost`, and its slot may run a later job by then) is left alone."""

from __future__ import annotations

import socket
from pathlib import Path

from piloop_common.protocol.worker import HeartbeatResponse, LeaseStatus, Timing
from piloop_worker.fencing import apply_answer, fence_deadline
from piloop_worker.held import Held
from piloop_worker.holdings import Holdings
from piloop_worker.lease import HeldLease
from piloop_worker.logs import LogShipper
from piloop_worker.records import StopReason
from piloop_worker.slots import SlotHandle, SlotRecord
from piloop_worker.slots.wire import Stop, parse
from piloop_worker.slotset import Slots

TIMING = Timing(
    renew_seconds=1,
    grace_seconds=3,
    toleration_seconds=9,
    request_timeout_seconds=1,
    kill_grace_seconds=0.5,
    memory_pressure_max=0.9,
)


class _Slot:
    """Slot 0's handle in `slots`, its record mapped and its socket one end of a pair: `sent()` is what the worker
    sent its supervisor."""

    def __init__(self, slots: Slots) -> None:
        self.handle = SlotHandle(slots.dir(0))
        self.handle.slot.make()
        self.handle.record = SlotRecord.open(self.handle.slot.record)
        self.handle.sock, self.peer = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        slots.handles[0] = self.handle

    def sent(self) -> list[object]:
        self.peer.setblocking(False)
        got = []
        while True:
            try:
                got.append(parse(self.peer.recv(1 << 16)))
            except BlockingIOError:
                return got


def _held(job: str, generation: int) -> Held:
    return Held(
        HeldLease(job, "1000000000001.ab"),
        "evaluation",
        0,
        generation,
        LogShipper(Path("/nonexistent"), Path("/nonexistent")),
    )


def _holding(*held: Held) -> Holdings:
    out = Holdings()
    for h in held:
        out.add(h)
    return out


def test_a_lost_answer_for_a_job_reported_meanwhile_sends_nothing_and_a_held_one_is_stopped(tmp_path):
    slots = Slots(tmp_path)
    slot = _Slot(slots)
    kept, reported = _held("j1", 2), _held("j2", 1)
    answer = {"j1": LeaseStatus.LOST, "j2": LeaseStatus.LOST}
    apply_answer(slots, _holding(kept), answer, 0.0, [kept, reported], TIMING, "w1")
    assert slot.sent() == [Stop(2, StopReason.LOST)]  # the held job's generation only, never the reported one's


def test_a_held_job_named_ok_gets_its_deadline_in_its_slots_record(tmp_path):
    slots = Slots(tmp_path)
    slot = _Slot(slots)
    kept = _held("j1", 7)
    apply_answer(slots, _holding(kept), {"j1": LeaseStatus.OK}, 100.0, [kept], TIMING, "w1")
    got = SlotRecord.open(slots.dir(0).record).read()
    assert got is not None and got.generation == 7 and got.deadline == fence_deadline(100.0, TIMING)
    assert slot.sent() == []


def test_the_servers_word_is_parsed_once_and_a_word_this_worker_does_not_know_is_lost() -> None:
    answer = HeartbeatResponse.model_validate({"jobs": {"a": "ok", "b": "cancel", "c": "lost", "d": "paused"}})
    assert answer.jobs == {"a": LeaseStatus.OK, "b": LeaseStatus.CANCEL, "c": LeaseStatus.LOST, "d": LeaseStatus.LOST}
    assert HeartbeatResponse(jobs={"a": "ok"}).model_dump(mode="json")["jobs"] == {"a": "ok"}  # the server's side


def test_a_held_lease_names_its_report_by_the_pair() -> None:
    lease = HeldLease("j1", "1000000000001.ab")
    assert (
        lease.report_id
        == HeldLease("j1", "1000000000001.ab").report_id
        != HeldLease("j1", "1000000000002.ab").report_id
    )
    assert lease.name == "j1.1000000000001"
