"""Claims: what the worker asks the server for (the kinds, how many, the memory it can grant, how long to wait), and
what it does with the answer. A claim rides the reports of the jobs that ended (`reporting.py`), or goes alone.
"""

from __future__ import annotations

from collections.abc import Callable

from piloop_common.errors import NotFound, PiloopError, Refused
from piloop_common.protocol.worker import PROTOCOL, Assignment, ClaimRequest, ClaimResponse, HostSample
from piloop_common.sdk.client import ApiClient
from piloop_worker import clock, pressure
from piloop_worker.context import WorkerContext
from piloop_worker.holdings import Holdings
from piloop_worker.room import Room, available_mb

# a claim's ask (the server gives at most the free slots): a few, so a burst is spread over the workers waiting for
# it; a claim carried by reports asks for as many as they free, so a busy worker refills each slot in one call
EVALUATIONS_PER_CLAIM = 4
LONG_POLL_MAX = 5.0  # the longest an idle worker's claim waits at the server

# what a claim carried by reports is: its request, when it was sent, the room (MiB) it offered
Ask = tuple[ClaimRequest, float, int]


class Claimer:
    """The worker's claims: when the next is due, what it asks, and the jobs its answer leased handed to `start`
    (`Starter.start`: the assignment, when the claim was sent, the room left for it)."""

    def __init__(
        self,
        ctx: WorkerContext,
        *,
        api: ApiClient,
        holdings: Holdings,
        sample: Callable[[], HostSample],
        start: Callable[[Assignment, float, int], None],
    ) -> None:
        self.ctx, self.api, self.holdings = ctx, api, holdings
        self.sample, self.start = sample, start
        self.room = Room()
        self.next_claim = 0.0
        self.paused_until = 0.0  # a pause (a full --dir) that neither a freed slot nor a claim's answer shortens

    def soon(self) -> None:
        """Claim at the next look: a slot is free."""
        self.next_claim = 0.0

    def pause(self, seconds: float) -> None:
        """Claim nothing for `seconds`."""
        self.paused_until = clock.now() + seconds

    def due(self, now: float) -> bool:
        return now >= self.next_claim and now >= self.paused_until

    def room_mb(self) -> int:
        """What this worker can grant: its available memory less the pool's reserve (`room.Room`)."""
        granted = self.holdings.granted_mb()
        return self.room.measure(
            available_mb(), granted, self.ctx.timed.memory_reserve_mb, idle=not self.holdings.granting
        )

    def ask(self, wait: float | None = None, most: int = EVALUATIONS_PER_CLAIM) -> Ask | None:
        """The claim to send now, when and the room it offers; None when the host's memory pressure admits none (the
        next is put off a renew period). Idle, a claim waits at the server for a job (a long poll) instead of coming
        back a renew period later; a worker with jobs never waits there, so its main loop keeps tending them."""
        timed = self.ctx.timed
        if clock.now() < self.paused_until:
            return None
        if pressure.admission(self.sample(), timed.memory_pressure_max):
            self.next_claim = clock.now() + timed.renew_seconds
            return None
        sent = clock.now()
        if wait is None:
            wait = 0.0 if self.holdings else min(timed.renew_seconds, LONG_POLL_MAX)
        room = self.room_mb()
        return (
            ClaimRequest(protocol=PROTOCOL, want={"agent": 1, "evaluation": most}, wait_seconds=wait, room_mb=room),
            sent,
            room,
        )

    def claim(self) -> None:
        ask = self.ask()
        if ask is None:
            return
        req, sent, _ = ask
        timed = self.ctx.timed
        try:
            resp: ClaimResponse = self.api.call(
                "POST",
                "/v1/worker/claim",
                req,
                model=ClaimResponse,
                timeout=timed.request_timeout_seconds + req.wait_seconds,
            )
        except Refused as e:
            self.ctx.refuse(e.message)
            return
        except NotFound:
            self.next_claim = sent + timed.renew_seconds  # the heartbeat registers again
            return
        except (PiloopError, OSError) as e:
            self.ctx.unreachable(e)
            self.next_claim = sent + timed.renew_seconds
            return
        self.claimed(resp, *ask)

    def claimed(self, resp: ClaimResponse, req: ClaimRequest, sent: float, room: int) -> None:
        """Start what a claim leased, and say when to claim next."""
        if resp.timing is not None:
            self.ctx.timing = resp.timing  # the leases' own: each job's first deadline must not outlast its lease
        for a in resp.leases:
            self.start(a, sent, room)
            room -= a.memory_mb or 0
        idle = not self.holdings
        if resp.leases:
            self.next_claim = sent + 0.05
        elif resp.reason == "nothing" and (req.wait_seconds or idle):
            self.next_claim = 0.0  # nothing queued: an idle worker waits for a job at the server (again)
        else:
            self.next_claim = sent + max(0.5, self.ctx.timed.renew_seconds)
