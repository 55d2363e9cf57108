"""The heartbeat: its own thread and its own HTTP client, so a slow job, claim or sample never starves it.

Each acknowledged heartbeat moves every held job's fencing deadline to
`send time + toleration − 2 × renew` (the send time, taken before the call, is the safe side).
One failed call gives nothing up: only the deadline, enforced by each slot's supervisor, fences a job.

A worker that a server started (`PILOOP_ORPHAN_EXIT_SECONDS` in its environment) exits by itself once it has not
reached its server for that long and holds no job, so it never outlives a stopped server, also one that is gone before
the worker ever registered; `0` means as soon as the server counts it unreachable (`grace_seconds`). Without the
variable a worker never exits on its own.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from pathlib import Path

from piloop_common.config.settings import ExecutorConfig
from piloop_common.errors import NotFound, PiloopError, Refused
from piloop_common.host import health
from piloop_common.host.health import WorkerHealth
from piloop_common.protocol.worker import HeartbeatResponse
from piloop_common.sdk.client import ApiClient
from piloop_worker import clock
from piloop_worker.context import WorkerContext
from piloop_worker.fencing import apply_answer
from piloop_worker.holdings import Holdings
from piloop_worker.registration import Registrar
from piloop_worker.slotset import Slots

log = logging.getLogger("piloop.worker")
ORPHAN_ENV = "PILOOP_ORPHAN_EXIT_SECONDS"
DEFAULT_GRACE_SECONDS = ExecutorConfig.model_fields["grace_seconds"].default


def orphan_after(grace_seconds: float) -> float | None:
    """How long this worker outlives an unreachable server, or None: forever."""
    raw = os.environ.get(ORPHAN_ENV, "").strip()
    if not raw:
        return None
    try:
        return float(raw) or grace_seconds
    except ValueError:
        log.warning("event=worker.bad_env %s=%r (a number of seconds): ignored", ORPHAN_ENV, raw)
        return None


def orphaned(ctx: WorkerContext, holdings: Holdings) -> bool:
    """Whether this worker, holding no job, has not reached its server for its orphan time (logged once, when it
    has). Before it ever registered it knows no `grace_seconds` from the server: then the default's."""
    grace = ctx.timing.grace_seconds if ctx.timing else DEFAULT_GRACE_SECONDS
    after = orphan_after(grace)
    down = ctx.reach.down_since
    if after is None or down is None or clock.now() - down < after or holdings:
        return False
    log.warning(
        "event=worker.orphaned worker=%s after_seconds=%g (the server is unreachable and this worker "
        "holds no job: it exits)",
        ctx.name or "-",
        after,
    )
    return True


class Heartbeat(threading.Thread):
    """Renews what `holdings` holds every renew period with its own `api` client (registering again through
    `registrar` when the server forgot the worker), and records each acknowledged beat in `workdir`'s health."""

    def __init__(
        self,
        ctx: WorkerContext,
        api: ApiClient,
        *,
        holdings: Holdings,
        slots: Slots,
        registrar: Registrar,
        workdir: Path,
    ) -> None:
        super().__init__(name="heartbeat", daemon=True)
        self.ctx, self.api, self.holdings, self.registrar, self.workdir = ctx, api, holdings, registrar, workdir
        self.slots = slots
        self.stop = threading.Event()

    def run(self) -> None:
        wait = self._period()
        while not self.stop.wait(wait):
            try:
                ok = self.beat()
            except Exception as e:  # never let one surprise end the heartbeat
                log.exception("event=worker.heartbeat_error error=%s", e)
                ok = False
            wait = self._period() if ok else min(self._period(), self._backoff())
            self._check_orphan()
        self.api.close()

    def _check_orphan(self) -> None:
        if orphaned(self.ctx, self.holdings):
            self.ctx.stopping.set()

    def _period(self) -> float:
        renew = self.ctx.timed.renew_seconds
        return renew * random.uniform(0.9, 1.1)

    _fails = 0

    def _backoff(self) -> float:
        self._fails += 1
        return min(0.25 * 2.0 ** (self._fails - 1), 30.0)

    def beat(self) -> bool:
        ctx = self.ctx
        held = self.holdings.snapshot()
        hello = self.registrar.hello(held)
        sent, sent_wall = clock.now(), time.time()
        try:
            resp = self.api.call(
                "POST",
                "/v1/worker/heartbeat",
                hello,
                model=HeartbeatResponse,
                timeout=ctx.timed.request_timeout_seconds,
            )
            statuses = resp.jobs
            if resp.timing is not None:
                ctx.timing = resp.timing  # the renewal's own: the fence below must not outlast the lease it renewed
        except Refused as e:
            ctx.refuse(e.message)
            return False
        except NotFound:
            # the server forgot this worker (its state was lost or it expired): register again, same jobs
            try:
                statuses = self.registrar.register(self.api, held, sent).jobs
            except Refused as e:
                ctx.refuse(e.message)
                return False
            except PiloopError as e:
                ctx.unreachable(e)
                return False
        except PiloopError as e:
            ctx.unreachable(e)
            return False
        self._fails = 0
        ctx.reach.ok(ctx.name)
        apply_answer(self.slots, self.holdings, statuses, sent, held, ctx.timed, ctx.name)
        self._record_health(sent_wall)
        return True

    def _record_health(self, sent_wall: float) -> None:
        """`<dir>/health.json` for `piloop worker check`: this heartbeat, sent at `sent_wall`, was acknowledged."""
        timing = self.ctx.timing
        if timing is None:
            return
        record = WorkerHealth(
            worker=self.ctx.name, pid=os.getpid(), acked_at=sent_wall, grace_seconds=timing.grace_seconds
        )
        try:
            health.write(self.workdir, record)
        except OSError as e:  # a full disk: the check then says the record is old, which it is
            log.warning("event=worker.health_unwritten worker=%s error=%s", self.ctx.name, e.strerror)
