"""`WorkerContext`: what every part of a worker shares, and nothing else: the name it is registered under, the
server's timings, whether it reaches the server, and its stop (asked by a signal, or by the server's refusal)."""

from __future__ import annotations

import threading

from piloop_common.protocol.worker import Timing
from piloop_worker.reachability import Reachability


class WorkerContext:
    def __init__(self, name: str, reach: Reachability) -> None:
        self.name = name  # the server's name for this worker once registered (`--name`, else its token's)
        self.timing: Timing | None = None  # the server's, from registration on; renewals and claims bring newer
        self.reach = reach
        self.stopping = threading.Event()
        self.refused: str | None = None

    @property
    def timed(self) -> Timing:
        """The timings the server gave at registration, which comes before any part runs."""
        assert self.timing is not None, "the worker has not registered yet"
        return self.timing

    def refuse(self, reason: str) -> None:
        """The server refuses this worker: every part stops."""
        self.refused = reason
        self.stopping.set()

    def unreachable(self, error: BaseException) -> None:
        """A call to the server failed (`Reachability.failed`)."""
        self.reach.failed(error, self.name or "-")
