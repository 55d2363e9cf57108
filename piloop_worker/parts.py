"""What the parts of `loop.Worker` (`claiming`, `jobstart`, `reporting`) share of it, typed once: its state, and the
methods one part calls on another. Each part is a base class of `Worker`; `Worker.__init__` sets the state."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING

from piloop_common.cas import Store
from piloop_common.protocol.worker import Assignment, ClaimRequest, ClaimResponse, HostSample, RegisterResponse, Timing
from piloop_common.sdk.client import ApiClient
from piloop_worker.cgroups import Cgroups
from piloop_worker.heartbeat import Reachability
from piloop_worker.held import Held
from piloop_worker.holdings import Holdings
from piloop_worker.relay import Relay
from piloop_worker.repos import Repos
from piloop_worker.room import Room
from piloop_worker.shimhost import ShimHost
from piloop_worker.sparedirs import SpareDirs
from piloop_worker.spool import Spool


class Part:
    api: ApiClient
    timing: Timing | None  # the server's, from registration on (`timed`)
    holdings: Holdings
    room: Room
    next_claim: float
    name: str
    image: str
    home: Path
    workdir: Path | None
    spare: SpareDirs | None
    spool: Spool | None
    store: Store
    repos: Repos
    cgroups: Cgroups
    relay: Relay | None
    host: ShimHost
    reach: Reachability
    stopping: threading.Event
    refused: str | None

    @property
    def timed(self) -> Timing:
        """The timings the server gave at registration, which comes before any part runs."""
        assert self.timing is not None, "the worker has not registered yet"
        return self.timing

    if TYPE_CHECKING:  # defined by Worker and the other parts; only named here

        def host_sample(self) -> HostSample: ...
        def refuse(self, reason: str) -> None: ...
        def register_with(self, api: ApiClient, held: list[Held], sent: float | None = None) -> RegisterResponse: ...
        def start_job(self, a: Assignment, sent: float, room: int) -> None: ...
        def _claim_ask(self, wait: float | None = None, most: int = ...) -> tuple[ClaimRequest, float, int] | None: ...
        def _claimed(self, resp: ClaimResponse, req: ClaimRequest, sent: float, room: int) -> None: ...
