"""Whether the worker reaches its server: `event=worker.unreachable` once at the first failure, then at most once a
minute, and `event=worker.reachable` on the way back. Every part of the worker reports its calls' failures here."""

from __future__ import annotations

import logging
import threading

from piloop_worker import clock

log = logging.getLogger("piloop.worker")


class Reachability:
    """Logs `event=worker.unreachable` at the first failure, then at most once a minute, and the way back."""

    EVERY = 60.0

    def __init__(self, server: str) -> None:
        self.server = server
        self.lock = threading.Lock()
        self.down_since: float | None = None
        self.logged_at = 0.0

    def failed(self, error: BaseException, who: str) -> None:
        now = clock.now()
        with self.lock:
            first = self.down_since is None
            if first:
                self.down_since = now
            if first or now - self.logged_at >= self.EVERY:
                self.logged_at = now
                msg = getattr(error, "message", None) or str(error)
                log.warning(
                    "event=worker.unreachable worker=%s server=%s error=%s", who, self.server, msg.replace("\n", " ")
                )

    def ok(self, who: str) -> None:
        with self.lock:
            if self.down_since is not None:
                log.info(
                    "event=worker.reachable worker=%s server=%s after_seconds=%.1f",
                    who,
                    self.server,
                    clock.now() - self.down_since,
                )
                self.down_since = None
