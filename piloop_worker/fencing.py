"""Fencing: the deadline by which a job must stop unless a renewal moves it, and the server's word on each job applied
to its slot.

A slot's supervisor enforces the deadline itself (`slots/job.py`), so a job stops in time even when the worker is
dead; what is here is the worker's side: it writes the deadline each renewal acknowledged into the slot's mapped
record, and asks a supervisor to stop a job.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from piloop_common.protocol.worker import LeaseStatus, Timing
from piloop_worker.held import Held
from piloop_worker.holdings import Holdings
from piloop_worker.records import StopReason
from piloop_worker.slotset import Slots

log = logging.getLogger("piloop.worker")


def fence_deadline(sent: float, timing: Timing) -> float:
    """When a job must stop if nothing renews it: two heartbeats before its lease expires (the design's rule),
    or earlier still where the kill grace would not fit in those two heartbeats, so it is dead before the lease
    ends whatever the config. `sent` is the time (`clock.now`) the renewing call was sent (the safe side)."""
    margin = max(2 * timing.renew_seconds, timing.kill_grace_seconds + 0.2)
    return sent + timing.toleration_seconds - margin


def stop(slots: Slots, h: Held, why: StopReason) -> None:
    """Ask the supervisor of `h`'s slot to stop its job (nothing once the job has ended)."""
    if h.ended is None:
        slots.stop(h.slot, h.generation, why)


def apply_statuses(
    slots: Slots, held: Iterable[Held], statuses: dict[str, LeaseStatus], deadline: float, worker: str
) -> None:
    """Act on the server's word about each job named to it: move its deadline to `deadline`, or stop it. A job the
    server did not name is lost."""
    for h in held:
        if h.ended is not None:
            continue
        st = statuses.get(h.job, LeaseStatus.LOST)
        if st is LeaseStatus.OK:
            slots.write_deadline(h.slot, h.generation, deadline)
        elif st is LeaseStatus.CANCEL:
            stop(slots, h, StopReason.CANCELLED)
        else:
            log.warning("event=job.lost job=%s token=%s worker=%s", *h.lease, worker)
            stop(slots, h, StopReason.LOST)


def apply_answer(
    slots: Slots,
    holdings: Holdings,
    statuses: dict[str, LeaseStatus],
    sent: float,
    held: list[Held],
    timing: Timing,
    worker: str,
) -> None:
    """Act on the server's word about each job of `held` (named in a call sent at `sent`) that is still held: renew
    its deadline, or stop it. A job reported while the word was on its way is no longer the server's (it answers
    `lost`), and its slot may run a later job by then: under the lock that reporting takes, it is left alone."""
    deadline = fence_deadline(sent, timing)
    holdings.while_held(held, lambda still: apply_statuses(slots, still, statuses, deadline, worker))
