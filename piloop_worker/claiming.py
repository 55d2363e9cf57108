"""Claims: what the worker asks the server for (the kinds, how many, the memory it can grant, how long to wait), and
what it does with the answer. A claim rides the reports of the jobs that ended (`reporting.py`), or goes alone.
"""

from __future__ import annotations

from piloop_common.errors import NotFound, PiloopError, Refused
from piloop_common.protocol.worker import PROTOCOL, ClaimRequest, ClaimResponse
from piloop_worker import clock, pressure
from piloop_worker.parts import Part
from piloop_worker.room import available_mb

# a claim's ask (the server gives at most the free slots): a few, so a burst is spread over the workers waiting for
# it; a claim carried by reports asks for as many as they free, so a busy worker refills each slot in one call
EVALUATIONS_PER_CLAIM = 4
LONG_POLL_MAX = 5.0  # the longest an idle worker's claim waits at the server


class Claiming(Part):
    """The worker's claims (a part of `loop.Worker`)."""

    def room_mb(self) -> int:
        """What this worker can grant: its available memory less the pool's reserve (`room.Room`)."""
        assert self.timing is not None
        granted = self.holdings.granted_mb()
        return self.room.measure(available_mb(), granted, self.timed.memory_reserve_mb, idle=not self.holdings.granting)

    def _claim_ask(
        self, wait: float | None = None, most: int = EVALUATIONS_PER_CLAIM
    ) -> tuple[ClaimRequest, float, int] | None:
        """The claim to send now, when and the room it offers; None when the host's memory pressure admits none (the
        next is put off a renew period). Idle, a claim waits at the server for a job (a long poll) instead of coming
        back a renew period later; a worker with jobs never waits there, so its main loop keeps tending them."""
        assert self.timing is not None
        if pressure.admission(self.host_sample(), self.timed.memory_pressure_max):
            self.next_claim = clock.now() + self.timed.renew_seconds
            return None
        sent = clock.now()
        if wait is None:
            wait = 0.0 if self.holdings else min(self.timed.renew_seconds, LONG_POLL_MAX)
        room = self.room_mb()
        return (
            ClaimRequest(protocol=PROTOCOL, want={"agent": 1, "evaluation": most}, wait_seconds=wait, room_mb=room),
            sent,
            room,
        )

    def claim(self) -> None:
        assert self.timing is not None
        ask = self._claim_ask()
        if ask is None:
            return
        req, sent, _ = ask
        try:
            resp: ClaimResponse = self.api.call(
                "POST",
                "/v1/worker/claim",
                req,
                model=ClaimResponse,
                timeout=self.timed.request_timeout_seconds + req.wait_seconds,
            )
        except Refused as e:
            self.refuse(e.message)
            return
        except NotFound:
            self.next_claim = sent + self.timed.renew_seconds  # the heartbeat registers again
            return
        except (PiloopError, OSError) as e:
            self.reach.failed(e, self.name)
            self.next_claim = sent + self.timed.renew_seconds
            return
        self._claimed(resp, *ask)

    def _claimed(self, resp: ClaimResponse, req: ClaimRequest, sent: float, room: int) -> None:
        """Start what a claim leased, and say when to claim next."""
        if resp.timing is not None:
            self.timing = resp.timing  # the leases' own: each job's first deadline must not outlast its lease
        assert self.timing is not None
        for a in resp.leases:
            self.start_job(a, sent, room)
            room -= a.memory_mb or 0
        idle = not self.holdings
        if resp.leases:
            self.next_claim = sent + 0.05
        elif resp.reason == "nothing" and (req.wait_seconds or idle):
            self.next_claim = 0.0  # nothing queued: an idle worker waits for a job at the server (again)
        else:
            self.next_claim = sent + max(0.5, self.timed.renew_seconds)
