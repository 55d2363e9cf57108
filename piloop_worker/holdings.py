"""What the worker holds: each job it runs (`held.Held`) under its lease (a job run again on this worker, its first
run's report not yet sent, is held twice), the slot each uses, and the memory each was
granted.

The main loop adds a job when it starts or re-attaches one and removes it once its report is answered; the heartbeat
thread names a snapshot to the server, and acts on the answer only for the jobs still held (`while_held`), under the
same lock a removal takes: a job's slot may run a later job by then.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from piloop_worker.held import Held
from piloop_worker.lease import HeldLease


class Holdings:
    """The jobs one worker holds, by lease, behind one lock; and their grants (MiB), the main loop's alone."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._held: dict[HeldLease, Held] = {}
        self._grants: dict[str, int] = {}  # job -> its grant (MiB), 0 for none

    def __len__(self) -> int:
        with self._lock:
            return len(self._held)

    def add(self, h: Held) -> None:
        with self._lock:
            self._held[h.lease] = h

    def remove(self, h: Held, then: Callable[[], None] | None = None) -> None:
        """Let `h`'s job go, and run `then` under the lock: a heartbeat's answer on its way meanwhile finds the job
        gone and leaves its slot alone."""
        with self._lock:
            self._held.pop(h.lease, None)
            if then is not None:
                then()

    def by_generation(self, slot: int, generation: int) -> Held | None:
        with self._lock:
            return next((h for h in self._held.values() if h.slot == slot and h.generation == generation), None)

    def busy_slots(self) -> set[int]:
        """The slots a held job still uses (`Held.uses_slot`)."""
        with self._lock:
            return {h.slot for h in self._held.values() if h.uses_slot}

    def snapshot(self) -> list[Held]:
        with self._lock:
            return list(self._held.values())

    def report_ids(self) -> set[str]:
        """The ids of the reports the held jobs are sending."""
        with self._lock:
            return {h.report.report_id for h in self._held.values() if h.report is not None}

    def while_held(self, held: list[Held], act: Callable[[list[Held]], None]) -> None:
        """Run `act` on those of `held` still held, under the lock (none is removed meanwhile)."""
        with self._lock:
            act([h for h in held if self._held.get(h.lease) is h])

    # -- grants: read and written by the main loop only -------------------------------------
    def grant(self, job: str, mb: int) -> None:
        self._grants[job] = mb

    def granted_mb(self) -> int:
        """The grants of the jobs held (an adopted one's from its record); a job let go drops its own."""
        total = 0
        held = self.snapshot()
        for h in held:
            if h.job not in self._grants:
                self._grants[h.job] = (h.record.memory_mb if h.record else None) or 0
            total += self._grants[h.job]
        for job in set(self._grants) - {h.job for h in held}:
            del self._grants[job]
        return total

    @property
    def granting(self) -> bool:
        """Whether any job holds a grant (as of the last `granted_mb`)."""
        return bool(self._grants)
