"""Which of the servers on one namespace runs the pass: the holder of the leader lease (state/leader.py).

A thread renews the lease (or tries to take it) every third of its TTL, so a live leader renews twice before it
could lapse and a follower takes a lapsed lease within a third of the TTL. The pass asks `fence()` before it
starts and between its steps: only a lease this process confirmed less than a TTL ago (its own monotonic clock,
which runs on while the process is stopped) counts. The scripts check the token too (include/fence.lua): that
catches the step a stopped leader was already in when it woke.
"""

from __future__ import annotations

import logging
import threading
import time

from piloop_common.errors import PiloopError
from piloop_server.state.errors import UNREACHABLE
from piloop_server.state.leader import LeaderLease
from piloop_server.state.scripts import Fence

log = logging.getLogger("piloop.leader")
RENEWALS_PER_TTL = 3


class Leadership:
    def __init__(self, lease: LeaderLease, ttl_seconds: float) -> None:
        self.lease = lease
        self.ttl = ttl_seconds
        self.token = ""
        self.confirmed = 0.0  # monotonic, when the call that last confirmed the lease began
        self._failing = False
        self._lock = threading.Lock()  # the token and its confirmation
        self._ticking = threading.Lock()  # one renewal at a time: two at once would depose this server by itself

    @property
    def instance(self) -> str:
        return self.lease.instance

    def tick(self) -> None:
        """Renew or take the lease once; Redis out of reach keeps the token, which lapses here by the clock."""
        with self._ticking:
            self._tick()

    def _tick(self) -> None:
        started = time.monotonic()
        try:
            held = self.lease.hold(self.token, int(self.ttl * 1000))
        except (*UNREACHABLE, PiloopError) as e:
            if not self._failing:
                log.warning("event=pass.lease_failed error=%s (retrying)", e)
            self._failing = True
            return
        self._failing = False
        with self._lock:
            if held.leading and held.token != self.token:
                # a server taking the pass is the normal start (and a handover): news, not a fault
                log.info(
                    "event=pass.leader instance=%s token=%s (this server runs the pass)", self.instance, held.token
                )
            elif not held.leading and self.token:
                log.warning("event=pass.deposed instance=%s token=%s leader=%s", self.instance, self.token, held.holder)
            self.token = held.token
            self.confirmed = started if held.leading else 0.0

    def fence(self) -> Fence | None:
        """The pass's fence while this server leads by its own clock, else None (the pass waits)."""
        with self._lock:
            if self.token and time.monotonic() - self.confirmed < self.ttl:
                return self.lease.fence(self.token)
            return None

    def fence_now(self) -> Fence | None:
        """The pass's fence, renewing the lease first when its confirmation is stale: a pass after this process was
        stopped (a suspended machine) runs at once, not a renewal period later, so a gap in the pass is the
        daemon's own and expire.lua re-arms every lease before a worker's late report or heartbeat lands."""
        fence = self.fence()
        if fence is None:
            self.tick()
            fence = self.fence()
        return fence

    def run(self, stop: threading.Event) -> None:
        self.tick()
        while not stop.wait(self.ttl / RENEWALS_PER_TTL):
            self.tick()

    def resign(self) -> None:
        """At a clean stop: give the lease up so that another server takes the pass at its next renewal."""
        with self._lock:
            token, self.token = self.token, ""
        if token:
            try:
                self.lease.resign(token)
            except (*UNREACHABLE, PiloopError):
                pass  # it lapses by its TTL
