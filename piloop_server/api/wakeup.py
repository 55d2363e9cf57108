"""Wake claims that wait: an idle worker's claim waits (up to its `wait_seconds`) for a job to be queued.

Routes that queue a job or free a slot call `notify(app)` from any thread, and so does the pass when it queued jobs
(a retry whose backoff passed, an evaluation whose lease expired, a campaign's agent) or freed slots; a waiting claim
takes the current event before it looks (so a job queued while it looks is never missed) and tries again when it
fires. Jobs queued by another server are found when the wait ends (the claim's `wait_seconds`; piloop's worker
asks for at most 5 s).
"""

from __future__ import annotations

import asyncio
from typing import Any


class Wakeup:
    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self.event: asyncio.Event | None = None
        self.closing = False  # the daemon stops: a claim no longer waits, so the server's shutdown need not

    def current(self) -> asyncio.Event:
        """The event the next `notify` sets (call on the event loop)."""
        if self.event is None:
            self.loop, self.event = asyncio.get_running_loop(), asyncio.Event()
        return self.event

    def _fire(self) -> None:
        if self.event is not None:
            self.event.set()
            self.event = None

    def notify(self) -> None:
        """Wake every waiting claim (from any thread)."""
        loop = self.loop
        if loop is not None and self.event is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._fire)

    def close(self) -> None:
        """Wake every waiting claim for good: the daemon stops (call on the event loop)."""
        self.closing = True
        self._fire()


def of(app: Any) -> Wakeup:
    w = getattr(app.state, "wakeup", None)
    if w is None:
        w = app.state.wakeup = Wakeup()
    return w


def notify(app: Any) -> None:
    of(app).notify()
