"""Slots: one long-lived supervisor per slot of a worker, reused for every job the slot runs (docs/worker.md,
"Slots"). The worker's side is `SlotHandle`; the supervisor is `python -m piloop_worker.slots.supervisor`."""

from typing import TYPE_CHECKING

from piloop_worker.slots.layout import SlotDir
from piloop_worker.slots.record import SlotRecord
from piloop_worker.slots.wire import SlotRequest

if TYPE_CHECKING:
    from piloop_worker.slots.handle import Gone, SlotHandle

__all__ = ["Gone", "SlotDir", "SlotHandle", "SlotRecord", "SlotRequest"]


def __getattr__(name: str) -> object:
    # the worker's side, imported on its first use: every supervisor starts by importing this package, and the
    # handle's modules (psutil's walk, the spawner, the errors) would cost each one's start ~10 ms of CPU
    if name in ("Gone", "SlotHandle"):
        from piloop_worker.slots import handle

        return getattr(handle, name)
    raise AttributeError(f"module 'piloop_worker.slots' has no attribute {name!r}")
