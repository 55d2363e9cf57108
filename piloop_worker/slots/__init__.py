"""Slots: one long-lived supervisor per slot of a worker, reused for every job the slot runs (docs/worker.md,
"Slots"). The worker's side is `SlotHandle`; the supervisor is `python -m piloop_worker.slots.supervisor`."""

from piloop_worker.slots.handle import Gone, SlotHandle
from piloop_worker.slots.layout import SlotDir
from piloop_worker.slots.record import SlotRecord
from piloop_worker.slots.wire import SlotRequest

__all__ = ["Gone", "SlotDir", "SlotHandle", "SlotRecord", "SlotRequest"]
