"""The worker's main loop: register, send the spool, re-attach, claim, start jobs, ship logs, report.

Threads: this loop (the main thread) and the heartbeat (`heartbeat.py`). Jobs run under shims forked by the shim
host, a process started before either thread existed. The loop's parts are modules of their own, each a part of
`Worker`: `claiming`, `jobstart`, `reporting`; `reattach` and `fencing` are functions it calls.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from piloop_common import __version__
from piloop_common.cas import Store
from piloop_common.errors import BadRequest, LeaseLost, PiloopError, Refused, Unavailable
from piloop_common.host.sample import Sampler, memory_pressure
from piloop_common.protocol.report import LogAppend
from piloop_common.protocol.worker import (
    PROTOCOL,
    HeartbeatResponse,
    HeldJob,
    HostSample,
    LeaseStatus,
    RegisterRequest,
    RegisterResponse,
    Timing,
    WorkerHello,
)
from piloop_common.sdk.client import ApiClient
from piloop_worker import clock, pressure
from piloop_worker.cgroups import Cgroups
from piloop_worker.claiming import Claiming
from piloop_worker.dirlock import hold_dir
from piloop_worker.fencing import apply_statuses, bury, fence_deadline
from piloop_worker.heartbeat import Heartbeat, Reachability, orphaned
from piloop_worker.held import Held
from piloop_worker.holdings import Holdings
from piloop_worker.jobstart import JobStarts
from piloop_worker.reattach import find_held
from piloop_worker.relay import Relay, socket_path
from piloop_worker.reporting import Reporting
from piloop_worker.repos import Repos
from piloop_worker.room import Room
from piloop_worker.shimhost import ShimHost
from piloop_worker.shimproto import StopReason
from piloop_worker.sparedirs import SpareDirs
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


class Worker(Claiming, JobStarts, Reporting):
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
        host: ShimHost,
    ) -> None:
        self.api_factory, self.pool, self.image, self.home = api_factory, pool, image, home
        self.name = name or ""
        self.workdir_arg = workdir
        self.workdir: Path | None = workdir or (home / "work" / name if name else None)
        self.spare: SpareDirs | None = None
        self.store, self.host = store, host
        self.repos = Repos(home / "repos", store)
        self.api = api_factory()
        self.reach = Reachability(where)
        self.holdings = Holdings()
        self.timing: Timing | None = None
        self.spool: Spool | None = None
        self.sampler = Sampler(workdir or home)
        self.psi_path = pressure.psi_path()
        self.relay: Relay | None = None
        self.cas_id = store.identity()
        # found before registering, so `info` can say; job cgroups are named by their dir, so any base name will do
        self.cgroups = Cgroups(name or socket.gethostname())
        self.refused: str | None = None
        self.stopping = threading.Event()
        self.next_claim = 0.0
        self.heartbeat: Heartbeat | None = None
        self.register_sent = 0.0
        self.room = Room()

    # -- what the server hears --------------------------------------------------------------
    def host_sample(self) -> HostSample:
        """The cached host sample, with memory pressure read now (a small read that never blocks on /proc)."""
        return self.sampler.get().model_copy(update={"memory_pressure": memory_pressure(self.psi_path)})

    def hello(self, held: list[Held]) -> WorkerHello:
        sample = self.host_sample()
        adm = pressure.admission(sample, self.timing.memory_pressure_max) if self.timing else ""
        return WorkerHello(
            protocol=PROTOCOL,
            pool=self.pool,
            image=self.image,
            cas_id=self.cas_id,
            sample=sample,
            jobs=[HeldJob(job=h.lease.job, token=h.lease.token) for h in held],  # the one place a lease is wired
            admission=adm,
        )

    def info(self) -> dict[str, Any]:
        return {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "version": __version__,
            "cgroups": f"v{self.cgroups.version}" if self.cgroups.available else f"none: {self.cgroups.reason}",
            "shim_host": self.host.pid,
        }

    def register_with(self, api: ApiClient, held: list[Held], sent: float | None = None) -> RegisterResponse:
        hello = self.hello(held)
        req = RegisterRequest(**hello.model_dump(), name=self.name or None, info=self.info())
        sent = clock.now() if sent is None else sent
        self.register_sent = sent
        timeout = self.timing.request_timeout_seconds if self.timing else None
        resp: RegisterResponse = api.call("POST", "/v1/worker/register", req, model=RegisterResponse, timeout=timeout)
        self.timing = resp.timing
        self.name = resp.worker
        log.info("event=worker.registered worker=%s pool=%s jobs=%d", self.name, self.pool, len(held))
        return resp

    def refuse(self, reason: str) -> None:
        self.refused = reason
        self.stopping.set()

    def apply(self, statuses: dict[str, LeaseStatus], sent: float, held: list[Held]) -> None:
        """Act on the server's word about each job we named that we still hold: renew its deadline, or stop it. A job
        reported while the word was on its way is no longer the server's (it answers `lost`), and its dir may be a
        spare by now, or a later job's: under the lock that reporting takes to give the dir away, it is left alone."""
        assert self.timing is not None
        deadline = fence_deadline(sent, self.timing)
        self.holdings.while_held(held, lambda still: apply_statuses(still, statuses, deadline, self.name))

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
                self.reach.failed(e, self.name or "-")
                if orphaned(self):  # a server gone before this worker registered: no heartbeat thread to see it
                    self.stopping.set()
            self.stopping.wait(backoff)
            backoff = min(backoff * 2, 10.0)

    def start(self) -> None:
        found = find_held(self.workdir, self.cgroups) if self.workdir else []
        resp = self._call_until_answered(lambda: self.register_with(self.api, found))
        self.reach.ok(self.name)
        if self.workdir is None:
            self.dir_lock = hold_dir(self.home / "work" / self.name)  # before anything looks in it (DirInUse)
            self.workdir = self.home / "work" / self.name
            self.sampler.disk_path = self.workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):  # a dir it cannot make there: each job dir is made and removed, as before
            self.spare = SpareDirs(self.workdir)
        if self.cgroups.available:
            log.info(
                "event=worker.cgroups worker=%s version=%d base=%s", self.name, self.cgroups.version, self.cgroups.base
            )
        else:
            log.warning(
                "event=worker.no_cgroups worker=%s reason=%r: jobs' memory grants are not enforced",
                self.name,
                self.cgroups.reason,
            )
        self.spool = Spool(self.home / "spool" / self.name)
        self.send_spool()
        statuses = resp.jobs
        sent = self.register_sent
        if self.workdir_arg is None and not found:
            found = find_held(self.workdir, self.cgroups)
            if found:
                sent = clock.now()
                statuses = self._call_until_answered(
                    lambda: (
                        self.api.call(
                            "POST",
                            "/v1/worker/heartbeat",
                            self.hello(found),
                            model=HeartbeatResponse,
                            timeout=self.timed.request_timeout_seconds,
                        ).jobs
                    )
                )
        self.relay = Relay(self.api_factory, self.timed.request_timeout_seconds, user=self.host.user)
        self._reattach(found, statuses, sent)
        self.heartbeat = Heartbeat(self, self.api_factory())
        self.heartbeat.start()

    def _reattach(self, found: list[Held], statuses: dict[str, LeaseStatus], sent: float) -> None:
        """Hold again the jobs an earlier worker left (`reattach.find_held`), as the server's `statuses` of them say."""
        # the groups of jobs an earlier worker reported, or left ended: the jobs found keep theirs until reported
        swept = self.cgroups.sweep({h.cgroup.path for h in found if h.cgroup is not None})
        if swept:
            log.info(
                "event=worker.cgroups_removed worker=%s count=%d (left by an earlier worker)", self.name, len(swept)
            )
        for h in found:
            self.holdings.add(h)
        self.apply(statuses, sent, found)
        for h in found:
            st = statuses.get(h.job, LeaseStatus.LOST)
            if st is LeaseStatus.OK and not h.jd.exit_json.exists():
                relay_at = Path(h.record.relay) if h.record and h.record.relay else socket_path(h.jd.root)
                self._relay_for(h.lease, relay_at, h.jd)
            log.info("event=job.reattached job=%s token=%s status=%s", *h.lease, st.value)

    # -- the loop ----------------------------------------------------------------------------
    def _check_stop(self) -> None:
        if self.refused is not None:
            raise WorkerRefused(self.refused)
        if self.stopping.is_set():
            raise ShutdownRequested()

    def loop(self) -> None:
        last_spool = clock.now()
        while True:
            self._check_stop()
            now = clock.now()
            ready: list[Held] = []
            for h in self.holdings.snapshot():
                self._tend(h, now, ready)
            self._send_all(ready)
            if now - last_spool > max(self.timed.renew_seconds, 1.0):
                last_spool = now
                self.send_spool()
            if now >= self.next_claim:
                self.claim()
            if not self.stopping.is_set():
                self.host.wait_exit(TICK)  # a shim whose job ended wakes the loop at once

    def _tend(self, h: Held, now: float, ready: list[Held] | None = None) -> None:
        try:
            self._tend_one(h, now, ready)
        except OSError as e:
            # a full or broken --dir fails this job's step, not the worker: it is tried again next tick
            if not h.disk_error:
                log.warning("event=job.disk_error job=%s worker=%s error=%s", h.job, self.name, e)
            h.disk_error = True

    def _tend_one(self, h: Held, now: float, ready: list[Held] | None = None) -> None:
        """One step for one job; a report due to be sent goes on `ready` (sent with the others that ended), or at once
        without one."""
        if h.report is None:
            if h.jd.exit_json.exists():
                self._build_report(h)
            elif now > h.shim_due and not h.jd.shim_alive() and not h.jd.exit_json.exists():
                bury(h.jd, self.cgroups)
            elif h.shipper.due(now):
                self._ship_log(h)
        if h.report is not None and now >= h.next_try:
            if ready is None:
                self._send(h)
            else:
                ready.append(h)

    def _ship_log(self, h: Held) -> None:
        try:
            new = h.shipper.upload(self.store, self.timed.log_max_bytes)
            if new:
                self.store.flush()  # chunks a cached CAS kept while its remote was away: the server checks them
                self.api.call(
                    "POST",
                    "/v1/worker/log",
                    LogAppend(protocol=PROTOCOL, job=h.lease.job, token=h.lease.token, chunks=new),
                    timeout=self.timed.request_timeout_seconds,
                )
                h.shipper.mark_posted(len(new))
        except LeaseLost:
            log.warning("event=job.lease_lost job=%s token=%s worker=%s", *h.lease, self.name)
            h.jd.request_stop(StopReason.LEASE_LOST)
        except Refused as e:
            self.refuse(e.message)
        except (PiloopError, OSError) as e:
            self.reach.failed(e, self.name)

    # -- ends --------------------------------------------------------------------------------
    def detach(self, budget: float) -> None:
        """Stop heartbeating and claiming; send the reports that are ready; leave the shims running."""
        if self.heartbeat is not None:
            self.heartbeat.stop.set()
        end = clock.now() + budget
        for h in self.holdings.snapshot():
            if clock.now() > end:
                break
            if h.report is None and h.jd.exit_json.exists():
                self._build_report(h)
            if h.report is not None:
                self._send(h)
        if self.heartbeat is not None:
            self.heartbeat.join(timeout=max(0.1, end - clock.now()))

    def stop_all(self, why: StopReason, wait: float) -> None:
        """Stop every job (its shim kills its process group) and wait for them to end."""
        if self.heartbeat is not None:
            self.heartbeat.stop.set()
        held = self.holdings.snapshot()
        for h in held:
            with contextlib.suppress(OSError):
                h.jd.request_stop(why)
        end = clock.now() + wait
        while clock.now() < end and any(h.jd.shim_alive() for h in held):
            time.sleep(0.05)

    def close(self) -> None:
        if self.relay is not None:
            self.relay.close()
        self.api.close()
        self.host.close()
        self.cgroups.close()
        with contextlib.suppress(Exception):
            self.store.close()
