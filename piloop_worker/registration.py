"""What the server hears of this worker: its hello (its pool, image, CAS, host sample and the leases it holds), sent
at registration and at every heartbeat, and registering, which names the worker and gives the timings."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from piloop_common.host.sample import Sampler, memory_pressure
from piloop_common.protocol.worker import PROTOCOL, HeldJob, HostSample, RegisterRequest, RegisterResponse, WorkerHello
from piloop_common.sdk.client import ApiClient
from piloop_worker import clock, pressure
from piloop_worker.context import WorkerContext
from piloop_worker.held import Held

log = logging.getLogger("piloop.worker")


class Registrar:
    """The worker's hello and its registration (by the main loop at start, by the heartbeat when forgotten)."""

    def __init__(
        self,
        ctx: WorkerContext,
        *,
        pool: str,
        image: str,
        cas_id: str,
        sampler: Sampler,
        info: Callable[[], dict[str, Any]],
    ) -> None:
        self.ctx = ctx
        self.pool, self.image, self.cas_id = pool, image, cas_id
        self.sampler = sampler
        self.psi_path = pressure.psi_path()
        self.info = info  # host, pid, version, cgroups, shim host: what `piloop worker list` shows
        self.sent = 0.0  # when the last registration was sent (`clock.now`): the safe side of its fence

    def host_sample(self) -> HostSample:
        """The cached host sample, with memory pressure read now (a small read that never blocks on /proc)."""
        return self.sampler.get().model_copy(update={"memory_pressure": memory_pressure(self.psi_path)})

    def hello(self, held: list[Held]) -> WorkerHello:
        sample = self.host_sample()
        timing = self.ctx.timing
        adm = pressure.admission(sample, timing.memory_pressure_max) if timing else ""
        return WorkerHello(
            protocol=PROTOCOL,
            pool=self.pool,
            image=self.image,
            cas_id=self.cas_id,
            sample=sample,
            jobs=[HeldJob(job=h.lease.job, token=h.lease.token) for h in held],  # the one place a lease is wired
            admission=adm,
        )

    def register(self, api: ApiClient, held: list[Held], sent: float | None = None) -> RegisterResponse:
        """Register (again) holding `held`; the timings and the name the server gives become the worker's."""
        hello = self.hello(held)
        req = RegisterRequest(**hello.model_dump(), name=self.ctx.name or None, info=self.info())
        self.sent = clock.now() if sent is None else sent
        timeout = self.ctx.timing.request_timeout_seconds if self.ctx.timing else None
        resp: RegisterResponse = api.call("POST", "/v1/worker/register", req, model=RegisterResponse, timeout=timeout)
        self.ctx.timing = resp.timing
        self.ctx.name = resp.worker
        log.info("event=worker.registered worker=%s pool=%s jobs=%d", self.ctx.name, self.pool, len(held))
        return resp
