"""A slot's deadline record: a small file on the worker's `--dir`, mapped by the worker and by the slot's supervisor.

    rec = SlotRecord.open(slot.record)      # made full-size (zeros, fsynced) the first time
    rec.write(generation, deadline)          # the worker, at each acknowledged heartbeat
    rec.read()                               # the supervisor, when it wakes: (generation, deadline) or None

The record is (seq, generation, deadline): `seq` is a sequence lock. The writer makes it odd, writes the two values,
and makes it even again; a reader that sees an odd `seq`, or another `seq` after reading the values, met a write
halfway and reads again, so it never takes a generation of one write with the deadline of another. There is one
writer (the worker holding the slot's connection). The file is made once at its full size and written in place
through the mapping, so a renewal needs no new block on a full disk and no system call at all.

`deadline` is a `clock.now()` time (CLOCK_BOOTTIME seconds); `generation` names the job the deadline is for (the
worker's counter, carried in `start`), so a deadline written for one job never fences or spares the next.

After it, at `ASSIGNED_AT`, the worker notes the job it started on the slot (generation, job, token; seqlocked the
same way) and clears it once it has the job's end: a worker that restarts and finds the slot's supervisor dead with
a job noted there knows that job was lost with it (`write_assigned`, `read_assigned`).
"""

from __future__ import annotations

import mmap
import os
import struct
from pathlib import Path
from typing import NamedTuple

SIZE = 256  # the deadline's cache line and the assigned job's, never a second page
ASSIGNED_AT = 64
_ASSIGNED = struct.Struct("<QQH")  # seq, generation, length of "<job>\n<token>"
ASSIGNED_TEXT_MAX = SIZE - ASSIGNED_AT - _ASSIGNED.size
_LAYOUT = struct.Struct("<QQd")  # seq, generation, deadline
_SEQ = struct.Struct("<Q")
_VALUES = struct.Struct("<Qd")
READ_TRIES = 1000  # a writer that stops halfway (SIGSTOP, SIGKILL) leaves `seq` odd: give up, the safe side


class Deadline(NamedTuple):
    generation: int
    deadline: float


class Assigned(NamedTuple):
    generation: int
    job: str
    token: str


class SlotRecord:
    """The mapped record of one slot; `close()` unmaps it."""

    def __init__(self, path: Path, mapped: mmap.mmap) -> None:
        self.path = path
        self._map = mapped

    @classmethod
    def open(cls, path: Path) -> SlotRecord:
        """Map the record at `path`, making it first (zeros, fsynced once) when it is missing or short."""
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            if (size := os.fstat(fd).st_size) < SIZE:
                os.pwrite(fd, bytes(SIZE - size), size)  # its block allocated now, never at a renewal
                os.fsync(fd)
            mapped = mmap.mmap(fd, SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)  # the mapping keeps the file
        return cls(path, mapped)

    def write(self, generation: int, deadline: float) -> None:
        """Set the deadline of job `generation`: seq odd, the values, seq even."""
        seq = _SEQ.unpack_from(self._map, 0)[0]
        seq += 1 if seq % 2 == 0 else 0  # one left odd by a writer killed halfway: that write never finished
        _SEQ.pack_into(self._map, 0, seq)
        _VALUES.pack_into(self._map, _SEQ.size, generation, deadline)
        _SEQ.pack_into(self._map, 0, seq + 1)

    def read(self) -> Deadline | None:
        """The last whole write, or None when none can be read (never written, or a writer stopped halfway)."""
        for _ in range(READ_TRIES):
            before, generation, deadline = _LAYOUT.unpack_from(self._map, 0)
            if before % 2:
                continue
            if _SEQ.unpack_from(self._map, 0)[0] != before:
                continue
            return Deadline(generation, deadline) if before else None
        return None

    def write_assigned(self, generation: int, job: str, token: str) -> None:
        """Note job `generation` (its job id and token) as the slot's; generation 0 clears it."""
        text = f"{job}\n{token}".encode()[:ASSIGNED_TEXT_MAX] if generation else b""
        seq = _SEQ.unpack_from(self._map, ASSIGNED_AT)[0]
        seq += 1 if seq % 2 == 0 else 0
        _SEQ.pack_into(self._map, ASSIGNED_AT, seq)
        struct.pack_into("<QH", self._map, ASSIGNED_AT + _SEQ.size, generation, len(text))
        self._map[ASSIGNED_AT + _ASSIGNED.size : ASSIGNED_AT + _ASSIGNED.size + len(text)] = text
        _SEQ.pack_into(self._map, ASSIGNED_AT, seq + 1)

    def read_assigned(self) -> Assigned | None:
        """The job noted as the slot's, or None (none, or a writer stopped halfway)."""
        for _ in range(READ_TRIES):
            before, generation, n = _ASSIGNED.unpack_from(self._map, ASSIGNED_AT)
            if before % 2:
                continue
            text = bytes(self._map[ASSIGNED_AT + _ASSIGNED.size : ASSIGNED_AT + _ASSIGNED.size + n])
            if _SEQ.unpack_from(self._map, ASSIGNED_AT)[0] != before:
                continue
            job, _, token = text.decode(errors="replace").partition("\n")
            return Assigned(generation, job, token) if generation and job else None
        return None

    def close(self) -> None:
        self._map.close()


__all__ = ["SIZE", "Assigned", "Deadline", "SlotRecord"]
