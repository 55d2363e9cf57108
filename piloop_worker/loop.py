"""The worker's main loop: register, send the spool, re-attach, claim, start jobs, ship logs, report.

Threads: this loop (the main thread) and the heartbeat (`heartbeat.py`). Jobs run under each slot's supervisor
(`slots/`), a process of its own that outlives the worker. `Worker` composes its parts, each handed what it uses: the
`Registrar` (its hello, registering), `Holdings` (what it holds), `Slots` (the slots' supervisors), a `Claimer`, a
`Starter`, a `Reporter`, the `Heartbeat`; `reattach` and `fencing` are functions it calls. It owns their order: start,
the loop, and the ends.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from piloop_common import __version__
from piloop_common.cas import Store
from piloop_common.errors import BadRequest, LeaseLost, PiloopError, Refused, Unavailable
from piloop_common.host.sample import Sampler
from piloop_common.protocol.report import LogAppend
from piloop_common.protocol.worker import PROTOCOL, HeartbeatResponse
from piloop_common.sdk.client import ApiClient
from piloop_worker import clock, fencing
from piloop_worker.cgroups import Cgroups
from piloop_worker.claiming import Claimer
from piloop_worker.context import WorkerContext
from piloop_worker.dirlock import hold_dir
from piloop_worker.heartbeat import Heartbeat, orphaned
from piloop_worker.held import Held
from piloop_worker.holdings import Holdings
from piloop_worker.jobstart import Starter
from piloop_worker.jobuser import JobUser
from piloop_worker.reachability import Reachability
from piloop_worker.reattach import find_held, reattach
from piloop_worker.records import StopReason
from piloop_worker.registration import Registrar
from piloop_worker.relay import Relay
from piloop_worker.reporting import Reporter
from piloop_worker.repos import Repos
from piloop_worker.slots import Gone
from piloop_worker.slots.wire import Ended, Message
from piloop_worker.slotset import Slots
from piloop_worker.spool import Spool

log = logging.getLogger("piloop.worker")

TICK = 0.1


class ShutdownRequested(BaseException):
    """SIGTERM or SIGINT: detach. A BaseException, so no `except Exception` swallows it."""


class WorkerRefused(BaseException):
    """The server refuses this worker (protocol, pool, token, CAS): stop every job, exit 3."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class ServerUntrusted(BaseException):
    """The server's certificate is not trusted at start: a setup mistake no retry fixes, so the worker exits 5."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass
class Crew:
    """The parts that run jobs, made at start once the worker is registered and knows its dir."""

    claimer: Claimer
    starter: Starter
    reporter: Reporter
    relay: Relay


class Worker:
    """One worker: its registration, its loop over the jobs it holds, and its ends (detach, stop, close)."""

    def __init__(
        self,
        *,
        api_factory: Callable[[], ApiClient],
        where: str,
        pool: str,
        image: str,
        name: str | None,
        workdir: Path | None,
        home: Path,
        store: Store,
        user: JobUser | None = None,
        warm_tasks: tuple[int, int] | None = None,
    ) -> None:
        self.api_factory, self.home = api_factory, home
        self.ctx = WorkerContext(name or "", Reachability(where))
        self.workdir_arg = workdir
        self.workdir: Path | None = workdir or (home / "work" / name if name else None)
        self.store = store
        self.user = user  # the user every job runs as (`[plugins.executor] run_as`), or None: the worker's
        self.warm_tasks = warm_tasks  # Python tasks in warm processes: their most tasks and resident MiB
        self.slots: Slots | None = Slots(self.workdir) if self.workdir else None
        self.image = image
        self.repos = Repos(home / "repos", store)
        self.api = api_factory()
        self.holdings = Holdings()
        self.sampler = Sampler(workdir or home)
        # found before registering, so `info` can say; job cgroups are named by their dir, so any base name will do
        self.cgroups = Cgroups(name or socket.gethostname())
        self.registrar = Registrar(
            self.ctx, pool=pool, image=image, cas_id=store.identity(), sampler=self.sampler, info=self.info
        )
        self.crew: Crew | None = None
        self.heartbeat: Heartbeat | None = None

    def info(self) -> dict[str, Any]:
        return {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "version": __version__,
            "cgroups": f"v{self.cgroups.version}" if self.cgroups.available else f"none: {self.cgroups.reason}",
        }

    # -- start -------------------------------------------------------------------------------
    def _call_until_answered(self, fn: Callable[[], Any]) -> Any:
        backoff = 0.25
        while True:
            self._check_stop()
            try:
                return fn()
            except Refused as e:
                raise WorkerRefused(e.message) from e
            except (PiloopError, OSError) as e:
                if isinstance(e, BadRequest):
                    raise
                if isinstance(e, Unavailable) and e.details.get("tls") in ("untrusted", "plain_http"):
                    raise ServerUntrusted(e.message) from e  # only at start: once running, it is an outage
                self.ctx.unreachable(e)
                if orphaned(self.ctx, self.holdings):  # a server gone before this worker registered: no heartbeat
                    self.ctx.stopping.set()
            self.ctx.stopping.wait(backoff)
            backoff = min(backoff * 2, 10.0)

    def start(self) -> None:
        found = find_held(self.slots, self.cgroups) if self.slots else []
        resp = self._call_until_answered(lambda: self.registrar.register(self.api, found))
        ctx = self.ctx
        ctx.reach.ok(ctx.name)
        if self.workdir is None:
            self.dir_lock = hold_dir(self.home / "work" / ctx.name)  # before anything looks in it (DirInUse)
            self.workdir = self.home / "work" / ctx.name
            self.sampler.disk_path = self.workdir
        workdir = self.workdir
        workdir.mkdir(parents=True, exist_ok=True)
        slots = self.slots = self.slots or Slots(workdir)
        if self.cgroups.available:
            log.info(
                "event=worker.cgroups worker=%s version=%d base=%s", ctx.name, self.cgroups.version, self.cgroups.base
            )
        else:
            log.warning(
                "event=worker.no_cgroups worker=%s reason=%r: jobs' memory grants are not enforced",
                ctx.name,
                self.cgroups.reason,
            )
        spool = Spool(self.home / "spool" / ctx.name)
        self.crew = crew = self._crew(workdir, slots, spool)
        crew.reporter.send_spool()
        statuses = resp.jobs
        sent = self.registrar.sent
        if self.workdir_arg is None and not found:
            found = find_held(slots, self.cgroups)
            if found:
                sent = clock.now()
                statuses = self._call_until_answered(
                    lambda: (
                        self.api.call(
                            "POST",
                            "/v1/worker/heartbeat",
                            self.registrar.hello(found),
                            model=HeartbeatResponse,
                            timeout=ctx.timed.request_timeout_seconds,
                        ).jobs
                    )
                )
        reattach(
            found,
            statuses,
            sent,
            holdings=self.holdings,
            slots=slots,
            cgroups=self.cgroups,
            relay=crew.relay,
            timing=ctx.timed,
            worker=ctx.name,
        )
        self.heartbeat = Heartbeat(
            ctx, self.api_factory(), holdings=self.holdings, slots=slots, registrar=self.registrar, workdir=workdir
        )
        self.heartbeat.start()

    def _crew(self, workdir: Path, slots: Slots, spool: Spool) -> Crew:
        ctx, api, holdings = self.ctx, self.api, self.holdings
        relay = Relay(self.api_factory, ctx.timed.request_timeout_seconds, user=self.user)

        def pause_claims(seconds: float) -> None:
            claimer.pause(seconds)

        starter = Starter(
            ctx,
            api=api,
            holdings=holdings,
            slots=slots,
            store=self.store,
            repos=self.repos,
            cgroups=self.cgroups,
            relay=relay,
            workdir=workdir,
            home=self.home,
            image=self.image,
            user=self.user,
            warm_tasks=self.warm_tasks,
            register=self._register_again,
            pause_claims=pause_claims,
        )
        claimer = Claimer(ctx, api=api, holdings=holdings, sample=self.registrar.host_sample, start=starter.start)
        reporter = Reporter(
            ctx,
            api=api,
            holdings=holdings,
            slots=slots,
            claimer=claimer,
            store=self.store,
            spool=spool,
            repos=self.repos,
            cgroups=self.cgroups,
            relay=relay,
        )
        return Crew(claimer, starter, reporter, relay)

    def _register_again(self) -> None:
        """Register again holding what the worker holds: the server's record of this worker is wrong."""
        self.registrar.register(self.api, self.holdings.snapshot())

    # -- the loop ----------------------------------------------------------------------------
    def _check_stop(self) -> None:
        if self.ctx.refused is not None:
            raise WorkerRefused(self.ctx.refused)
        if self.ctx.stopping.is_set():
            raise ShutdownRequested()

    def loop(self) -> None:
        assert self.crew is not None and self.slots is not None, "the worker has not started"
        claimer, reporter, slots = self.crew.claimer, self.crew.reporter, self.slots
        last_spool = clock.now()
        while True:
            self._check_stop()
            now = clock.now()
            ready: list[Held] = []
            for h in self.holdings.snapshot():
                self._tend(reporter, h, now, ready)
            reporter.send_all(ready)
            if now - last_spool > max(self.ctx.timed.renew_seconds, 1.0):
                last_spool = now
                reporter.send_spool()
            if claimer.due(now):
                claimer.claim()
            if not self.ctx.stopping.is_set():
                # a supervisor whose job ended wakes the loop at once
                for n, msg in slots.wait(TICK):
                    self._heard(n, msg)

    def _heard(self, n: int, msg: Message | Gone) -> None:
        """A slot's supervisor said something: a job's end is kept on its holding, and reported at the next look."""
        assert self.slots is not None
        if isinstance(msg, Ended):
            h = self.holdings.by_generation(n, msg.generation)
            if h is None:
                self.slots.ack(n, msg.generation)  # an end this worker never started nor adopted: nothing to report
            elif h.ended is None:
                h.ended = msg
        elif isinstance(msg, Gone):
            log.warning("event=slot.gone slot=%d pid=%d worker=%s", n, msg.pid, self.ctx.name)

    def _tend(self, reporter: Reporter, h: Held, now: float, ready: list[Held]) -> None:
        try:
            self._tend_one(reporter, h, now, ready)
        except OSError as e:
            # a full or broken --dir fails this job's step, not the worker: it is tried again next tick
            if not h.disk_error:
                log.warning("event=job.disk_error job=%s worker=%s error=%s", h.job, self.ctx.name, e)
            h.disk_error = True

    def _tend_one(self, reporter: Reporter, h: Held, now: float, ready: list[Held]) -> None:
        """One step for one job; a report due to be sent goes on `ready`, sent with the others that ended."""
        if h.report is None:
            if h.ended is not None:
                reporter.build(h)
            elif h.shipper.due(now):
                self._ship_log(h)
        if h.report is not None and now >= h.next_try:
            ready.append(h)

    def _ship_log(self, h: Held) -> None:
        try:
            new = h.shipper.upload(self.store, self.ctx.timed.log_max_bytes)
            if new:
                self.store.flush()  # chunks a cached CAS kept while its remote was away: the server checks them
                self.api.call(
                    "POST",
                    "/v1/worker/log",
                    LogAppend(protocol=PROTOCOL, job=h.lease.job, token=h.lease.token, chunks=new),
                    timeout=self.ctx.timed.request_timeout_seconds,
                )
                h.shipper.mark_posted(len(new))
        except LeaseLost:
            log.warning("event=job.lease_lost job=%s token=%s worker=%s", *h.lease, self.ctx.name)
            assert self.slots is not None
            fencing.stop(self.slots, h, StopReason.LEASE_LOST)
        except Refused as e:
            self.ctx.refuse(e.message)
        except (PiloopError, OSError) as e:
            self.ctx.unreachable(e)

    # -- ends --------------------------------------------------------------------------------
    def detach(self, budget: float) -> None:
        """Stop heartbeating and claiming; send the reports that are ready; leave the supervisors running their jobs."""
        if self.heartbeat is not None:
            self.heartbeat.stop.set()
        end = clock.now() + budget
        if self.crew is not None and self.slots is not None:
            reporter = self.crew.reporter
            for n, msg in self.slots.wait(0.0):
                self._heard(n, msg)
            for h in self.holdings.snapshot():
                if clock.now() > end:
                    break
                if h.report is None and h.ended is not None:
                    reporter.build(h)
                if h.report is not None:
                    reporter.send(h)
        if self.heartbeat is not None:
            self.heartbeat.join(timeout=max(0.1, end - clock.now()))

    def stop_all(self, why: StopReason, wait: float) -> None:
        """Stop every job (its supervisor kills its process group) and wait for them to end; their ends stay with
        the supervisors, reported by the worker that starts next on this dir."""
        if self.heartbeat is not None:
            self.heartbeat.stop.set()
        if self.slots is None:
            return
        held = self.holdings.snapshot()
        for h in held:
            fencing.stop(self.slots, h, why)
        end = clock.now() + wait
        while clock.now() < end and any(h.ended is None for h in held):
            for n, msg in self.slots.wait(0.05):
                self._heard(n, msg)

    def close(self) -> None:
        if self.crew is not None:
            self.crew.relay.close()
        self.api.close()
        if self.slots is not None:
            self.slots.close()
        self.cgroups.close()
        with contextlib.suppress(Exception):
            self.store.close()
