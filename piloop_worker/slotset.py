"""The worker's slots: one `SlotHandle` per slot number under `<--dir>/slots/<n>/`, its supervisor started (or found)
at the slot's first job, and every supervisor's messages waited on at once (docs/worker.md, "Slots").

    slots = Slots(workdir)
    n = slots.free(busy)                     # the lowest slot number no held job is using
    handle = slots.handle(n)                 # opened (its supervisor started or found) on first use
    for n, msg in slots.wait(0.1):           # Started, Ended, Gone: the worker's loop acts on each
        ...

The heartbeat's thread writes deadlines and sends stops through `write_deadline` and `stop`, the main loop does the
rest; a datagram is sent whole, so the two threads' sends never mix.
"""

from __future__ import annotations

import contextlib
import logging
import selectors
import time
from pathlib import Path

from piloop_common.errors import Unavailable
from piloop_worker.jobfiles import JobFiles
from piloop_worker.records import StopReason
from piloop_worker.slots import Gone, SlotDir, SlotHandle, SlotRecord
from piloop_worker.slots.record import Assigned
from piloop_worker.slots.wire import Message, State

log = logging.getLogger("piloop.worker")


class Slots:
    """The slots of one worker on its `--dir`."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.handles: dict[int, SlotHandle] = {}
        # made once per slot: a job's start and its report each name a dozen of its paths, which pathlib builds slowly
        self._files: dict[int, JobFiles] = {}
        self.sel = selectors.DefaultSelector()
        # a job's generation names it to its slot's supervisor; from the clock, so never one that an earlier worker
        # on this dir gave a job its supervisor still holds
        self._generation = time.time_ns() // 1000

    def next_generation(self) -> int:
        self._generation += 1
        return self._generation

    def dir(self, n: int) -> SlotDir:
        return self.files(n).slot

    def files(self, n: int) -> JobFiles:
        """The paths of the files of slot `n`'s job."""
        files = self._files.get(n)
        if files is None:
            files = self._files[n] = JobFiles(SlotDir.of(self.workdir, n))
        return files

    def existing(self) -> list[int]:
        """The numbers of the slots an earlier worker on this dir made."""
        root = self.workdir / "slots"
        return sorted(int(p.name) for p in root.iterdir() if p.name.isdigit()) if root.is_dir() else []

    @staticmethod
    def free(busy: set[int]) -> int:
        """The lowest slot number not in `busy`."""
        n = 0
        while n in busy:
            n += 1
        return n

    def handle(self, n: int) -> SlotHandle:
        """Slot `n`'s handle, opened first when it is not (Unavailable when no supervisor answers)."""
        h = self.handles.get(n)
        if h is not None and h.sock is not None:
            return h
        self.open(n)
        return self.handles[n]

    def open(self, n: int) -> State:
        """Connect to slot `n`'s supervisor (starting one where none lives); what it holds."""
        old = self.handles.pop(n, None)
        if old is not None:
            self._forget(old)
        h = SlotHandle(self.dir(n))
        try:
            state = h.open()
        except Unavailable:
            h.close()
            raise
        self.handles[n] = h
        self.sel.register(h.fileno(), selectors.EVENT_READ, n)
        return state

    def wait(self, timeout: float) -> list[tuple[int, Message | Gone]]:
        """The messages the slots' supervisors sent, waiting up to `timeout` for the first."""
        got: list[tuple[int, Message | Gone]] = []
        if not self.handles:
            time.sleep(timeout)
            return got
        for key, _ in self.sel.select(timeout):
            n = key.data
            h = self.handles.get(n)
            if h is None:
                continue
            for msg in h.read():
                got.append((n, msg))
                if isinstance(msg, Gone):  # its socket is closed: the slot is opened again at its next job
                    self.handles.pop(n, None)
                    with contextlib.suppress(KeyError, ValueError):
                        self.sel.unregister(key.fd)
                    h.close()
        return got

    def write_deadline(self, n: int, generation: int, deadline: float) -> None:
        h = self.handles.get(n)
        if h is not None and h.record is not None:
            h.write_deadline(generation, deadline)

    def stop(self, n: int, generation: int, why: StopReason) -> None:
        h = self.handles.get(n)
        if h is not None:
            with contextlib.suppress(Unavailable, OSError):
                h.stop(generation, why)

    def assign(self, n: int, generation: int, job: str, token: str) -> None:
        """Note job `generation` as slot `n`'s in its record, until its end is acknowledged (`ack`)."""
        h = self.handles.get(n)
        if h is not None and h.record is not None:
            h.record.write_assigned(generation, job, token)

    def ack(self, n: int, generation: int) -> None:
        """The worker has job `generation`'s end: its supervisor forgets it, and the slot's record no longer names
        it."""
        h = self.handles.get(n)
        if h is not None:
            if h.record is not None and (noted := h.record.read_assigned()) and noted.generation == generation:
                h.record.write_assigned(0, "", "")
            with contextlib.suppress(Unavailable, OSError):
                h.ack(generation)

    def orphaned(self, n: int) -> Assigned | None:
        """The job slot `n`'s record names when no supervisor holds the slot: one that died with it (its worker
        too, or it would have seen it go), its end heard by no one."""
        slot = self.dir(n)
        if not slot.record.exists() or SlotHandle(slot).alive():
            return None
        rec = SlotRecord.open(slot.record)
        try:
            return rec.read_assigned()
        finally:
            rec.close()

    def close(self) -> None:
        """Let every supervisor go: each exits once its job (if any) has ended, its end kept in `ended.json`."""
        for h in list(self.handles.values()):
            h.bye()
            self._forget(h)
        self.handles.clear()
        self.sel.close()

    def _forget(self, h: SlotHandle) -> None:
        if h.sock is not None:
            with contextlib.suppress(KeyError, ValueError):
                self.sel.unregister(h.fileno())
        h.close()
