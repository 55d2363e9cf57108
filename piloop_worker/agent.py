"""The worker's main loop: register, send the spool, re-attach, claim, start jobs, ship logs, report.

Threads: this loop (the main thread) and the heartbeat (`heartbeat.py`). Jobs run under shims forked
by the shim host, a process started before either thread existed.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import psutil

from piloop_common import __version__, envnames
from piloop_common.cas import Store
from piloop_common.client import ApiClient
from piloop_common.errors import (
    BadRequest,
    LeaseLost,
    NotFound,
    PiloopError,
    Refused,
    StoreError,
    Unavailable,
    from_payload,
)
from piloop_common.gitrepo import GitError
from piloop_common.hostinfo import Sampler, memory_pressure
from piloop_common.protocol import (
    PROTOCOL,
    REPORTS_PER_CALL,
    Assignment,
    BundleRequest,
    BundleResponse,
    CampaignJob,
    ClaimRequest,
    ClaimResponse,
    HeldJob,
    LogAppend,
    RegisterRequest,
    RegisterResponse,
    ReleaseRequest,
    ReportRequest,
    ReportResponse,
    ReportsRequest,
    ReportsResponse,
    Timing,
    Usage,
    WorkerHello,
)
from piloop_worker import clock, pressure
from piloop_worker.cgroups import Cgroups, JobCgroup
from piloop_worker.dirlock import hold_dir
from piloop_worker.heartbeat import Heartbeat, Reachability, orphaned
from piloop_worker.jobdir import JobDir, SpareDirs, files_under, read_json, scan
from piloop_worker.logs import LogShipper
from piloop_worker.relay import Relay, socket_path
from piloop_worker.repos import Repos, parse_score
from piloop_worker.room import Room, available_mb
from piloop_worker.shimhost import ShimHost
from piloop_worker.spool import Spool

log = logging.getLogger("piloop.worker")

REPORT_NS = uuid.UUID("5d1b7c3e-8f0a-4e4b-9c55-7a1f0c2d9e61")
SHIM_START_SECONDS = 10.0  # a shim that has not taken its dir's lock by then never will
TICK = 0.1
# a claim's ask (the server gives at most the free slots): a few, so a burst is spread over the workers waiting for
# it; a claim carried by reports asks for as many as they free, so a busy worker refills each slot in one call
EVALUATIONS_PER_CLAIM = 4
LONG_POLL_MAX = 5.0  # the longest an idle worker's claim waits at the server


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


# where `piloop` is: the worker's own interpreter's bin dir (a venv's), whatever PATH started the worker
BIN_DIR = os.path.dirname(sys.executable)


def job_path(spec_env: dict[str, str]) -> str:
    """A job's PATH: the worker's bin dir first, so the job's `piloop` is the worker's, then the spec's PATH, else
    the worker's own."""
    rest = spec_env.get("PATH", os.environ.get("PATH", os.defpath))
    if rest == BIN_DIR or rest.startswith(BIN_DIR + os.pathsep):
        return rest
    return f"{BIN_DIR}{os.pathsep}{rest}" if rest else BIN_DIR


def report_id_for(job: str, token: str) -> str:
    """One report id per lease, so a report rebuilt after a crash is the same report to the server."""
    return str(uuid.uuid5(REPORT_NS, f"{job}/{token}"))


@dataclass
class Held:
    job: str
    token: str
    kind: str
    jd: JobDir
    shipper: LogShipper
    # when its shim must hold the dir's lock by: a shim gone after it is found at once, a fresh job's or a
    # re-attached one's alike (0.0: a re-attached job's shim held it long ago)
    shim_due: float = 0.0
    report: ReportRequest | None = None
    next_try: float = 0.0
    tries: int = 0
    disk_error: bool = False
    cgroup: JobCgroup | None = None  # given back (`Cgroups.give`) with its dir, once the job is reported


def outcome_of(rec: dict[str, Any]) -> tuple[str, str]:
    """The report's outcome and reason for an exit record."""
    stopped = rec.get("stopped") or ""
    if rec.get("lost"):
        return "lost", rec.get("reason") or "the job's shim is gone"
    if stopped == "fenced":
        return "fenced", "the worker could not renew the lease before its deadline"
    if stopped in ("lost", "lease_lost"):
        return "lost", "the server says the lease is lost"
    if stopped == "cancelled":
        return "cancelled", "cancelled"
    if stopped.startswith("refused"):
        return "lost", "the server refused the worker"
    if stopped == "shim terminated":
        return "lost", "the job's shim was terminated"
    if stopped == "timeout":
        return "failed", "timeout"
    if rec.get("oom"):
        return "failed", rec.get("reason") or "out of memory"
    if rec.get("reason"):
        return "failed", rec["reason"]
    if rec.get("exit_code") == 0:
        return "succeeded", ""
    if rec.get("signal"):
        return "failed", f"killed by signal {rec['signal']}"
    return "failed", f"exit code {rec.get('exit_code')}"


def fence_deadline(sent: float, timing: Timing) -> float:
    """When a job must stop if nothing renews it: two heartbeats before its lease expires (the design's rule),
    or earlier still where the kill grace would not fit in those two heartbeats, so it is dead before the lease
    ends whatever the config. `sent` is the time (`clock.now`) the renewing call was sent (the safe side)."""
    margin = max(2 * timing.renew_seconds, timing.kill_grace_seconds + 0.2)
    return sent + timing.toleration_seconds - margin


def _safe_name(name: str) -> bool:
    p = PurePosixPath(name)
    return bool(name) and not p.is_absolute() and ".." not in p.parts and name not in (".",)


class Worker:
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
        self.lock = threading.RLock()
        self.held: dict[str, Held] = {}
        self.timing: Timing | None = None  # type: ignore[assignment]
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
        self.grants: dict[str, int] = {}  # job -> its grant (MiB), 0 for none

    # -- what the server hears --------------------------------------------------------------
    def snapshot(self) -> list[Held]:
        with self.lock:
            return list(self.held.values())

    def host_sample(self):
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
            jobs=[HeldJob(job=h.job, token=h.token) for h in held],
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

    def apply(self, statuses: dict[str, str], sent: float, held: list[Held]) -> None:
        """Act on the server's word about each job we named: renew its deadline, or stop it."""
        assert self.timing is not None
        deadline = fence_deadline(sent, self.timing)
        for h in held:
            st = statuses.get(h.job, "lost")
            try:
                if st == "ok":
                    if h.jd.root.exists():
                        h.jd.write_deadline(deadline)
                elif st == "cancel":
                    h.jd.request_stop("cancelled")
                else:
                    if not h.jd.exit_json.exists():
                        log.warning("event=job.lost job=%s token=%s worker=%s", h.job, h.token, self.name)
                    h.jd.request_stop("lost")
            except FileNotFoundError:
                pass  # reported and removed meanwhile
            except OSError as e:
                # a full disk: this job's deadline stays where it was (its shim fences it there, the safe side),
                # and the other jobs still get theirs
                log.warning("event=job.deadline_unwritten job=%s worker=%s error=%s", h.job, self.name, e)

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
                if isinstance(e, Unavailable) and e.details.get("tls") == "untrusted":
                    raise ServerUntrusted(e.message) from e  # only at start: once running, it is an outage
                self.reach.failed(e, self.name or "-")
                if orphaned(self):  # a server gone before this worker registered: no heartbeat thread to see it
                    self.stopping.set()
            self.stopping.wait(backoff)
            backoff = min(backoff * 2, 10.0)

    def start(self) -> None:
        found = self._scan_dirs() if self.workdir else []
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
            found = self._scan_dirs()
            if found:
                sent = clock.now()
                statuses = self._call_until_answered(
                    lambda: self.api.call(
                        "POST", "/v1/worker/heartbeat", self.hello(found), timeout=self.timing.request_timeout_seconds
                    )["jobs"]
                )
        # the groups of jobs an earlier worker reported, or left ended: the jobs found keep theirs until reported
        swept = self.cgroups.sweep({h.cgroup.path for h in found if h.cgroup is not None})
        if swept:
            log.info(
                "event=worker.cgroups_removed worker=%s count=%d (left by an earlier worker)", self.name, len(swept)
            )
        self.relay = Relay(self.api_factory, self.timing.request_timeout_seconds, user=self.host.user)
        with self.lock:
            for h in found:
                self.held[h.job] = h
        self.apply(statuses, sent, found)
        for h in found:
            st = statuses.get(h.job, "lost")
            if st == "ok" and not h.jd.exit_json.exists():
                self._relay_for(
                    h.job, h.token, Path((h.jd.record() or {}).get("relay") or socket_path(h.jd.root)), h.jd
                )
            log.info("event=job.reattached job=%s token=%s status=%s", h.job, h.token, st)
        self.heartbeat = Heartbeat(self, self.api_factory())
        self.heartbeat.start()

    def _scan_dirs(self) -> list[Held]:
        """Job dirs left by an earlier worker: live shims to re-attach, ended jobs to report."""
        assert self.workdir is not None
        out = []
        for jd in scan(self.workdir):
            rec = jd.record()
            if not rec or "job" not in rec:
                jd.remove()  # died before its lease was written down
                continue
            if not jd.shim_alive() and not jd.exit_json.exists():
                self._shim_gone(jd)
            out.append(
                Held(
                    rec["job"],
                    rec["token"],
                    rec.get("kind", ""),
                    jd,
                    LogShipper(jd),
                    cgroup=self._cgroup_of(read_json(jd.shim_json) or {}),
                )
            )
        return out

    def _cgroup_of(self, shim_record: dict[str, Any]) -> JobCgroup | None:
        """The cgroup a job ran in, as its shim wrote it down in `shim.json`."""
        path = shim_record.get("cgroup")
        return JobCgroup(Path(path), self.cgroups.version) if path and self.cgroups.available else None

    def _shim_gone(self, jd: JobDir) -> None:
        """The shim died without an exit record: kill what it left, and record the job lost."""
        info = read_json(jd.shim_json) or {}
        pgid = info.get("pgid")
        if pgid:
            with contextlib.suppress(psutil.Error, OSError):
                p = psutil.Process(pgid)
                if abs(p.create_time() - float(info.get("started", 0))) < 5:
                    os.killpg(pgid, signal.SIGKILL)
        if (cg := self._cgroup_of(info)) is not None:
            cg.kill_all()  # what left the job's process group
        jd.write_exit(
            {
                "exit_code": None,
                "signal": None,
                "oom": False,
                "stopped": "",
                "lost": True,
                "reason": "the job's shim died before the job ended",
                "usage": Usage().model_dump(),
                "duration_seconds": 0.0,
            }
        )

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
            for h in self.snapshot():
                self._tend(h, now, ready)
            self._send_all(ready)
            if now - last_spool > max(self.timing.renew_seconds, 1.0):
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
                self._shim_gone(h.jd)
            elif h.shipper.due(now):
                self._ship_log(h)
        if h.report is not None and now >= h.next_try:
            if ready is None:
                self._send(h)
            else:
                ready.append(h)

    def _ship_log(self, h: Held) -> None:
        try:
            new = h.shipper.upload(self.store)
            if new:
                self.api.call(
                    "POST",
                    "/v1/worker/log",
                    LogAppend(protocol=PROTOCOL, job=h.job, token=h.token, chunks=new),
                    timeout=self.timing.request_timeout_seconds,
                )
                h.shipper.mark_posted(len(new))
        except LeaseLost:
            log.warning("event=job.lease_lost job=%s token=%s worker=%s", h.job, h.token, self.name)
            h.jd.request_stop("lease_lost")
        except Refused as e:
            self.refuse(e.message)
        except (PiloopError, OSError) as e:
            self.reach.failed(e, self.name)

    def _build_report(self, h: Held) -> None:
        rec = h.jd.exit_record() or {}
        # its shim is idle (the shim's word said so first, unless it was lost), or gone, or ends
        self.host.ended(h.jd.root.name, last=bool(rec.get("lost")) or rec.get("stopped") == "shim terminated")
        outcome, reason = outcome_of(rec)
        try:
            outcome, reason, campaign = self._campaign_results(h, outcome, reason)
            h.shipper.upload(self.store)
            outputs = {name: self.store.put_file(path) for name, path in files_under(h.jd.outputs)}
            metrics = self.store.put_file(h.jd.metrics) if h.jd.metrics.exists() else None
        except (StoreError, PiloopError, OSError) as e:
            log.warning("event=job.report_deferred job=%s error=%s", h.job, e)
            self.reach.failed(e, self.name)
            return
        report = ReportRequest(
            protocol=PROTOCOL,
            report_id=report_id_for(h.job, h.token),
            job=h.job,
            token=h.token,
            outcome=outcome,
            exit_code=rec.get("exit_code"),
            signal=rec.get("signal"),
            oom=bool(rec.get("oom")),
            reason=reason,
            usage=Usage.model_validate(rec.get("usage") or {}),
            log=list(h.shipper.chunks),
            outputs=outputs,
            metrics=metrics,
            duration_seconds=float(rec.get("duration_seconds") or 0.0),
            **campaign,
        )
        assert self.spool is not None
        try:
            self.spool.write(report)  # before it is sent: a worker that dies now sends it at its next start
        except OSError as e:
            if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            # sent all the same: a worker that dies before the answer leaves the lease to expire, and the job runs
            # again, which is better than a job held `running` until the spool's filesystem has room
            log.warning("event=job.report_unspooled job=%s reason=disk_full error=%s", h.job, e)
        h.report = report
        log.info(
            "event=job.ended job=%s outcome=%s reason=%r exit_code=%s", h.job, outcome, reason, rec.get("exit_code")
        )

    def _send_all(self, ready: list[Held]) -> None:
        """The reports of jobs that ended since the last look, up to 64 a call, the last call carrying the claim for
        the slots they free: a busy worker's round is one call, not a report and a claim."""
        if not ready:
            return
        ask = (
            None
            if self.stopping.is_set() or self.refused is not None
            else self._claim_ask(wait=0.0, most=max(EVALUATIONS_PER_CLAIM, len(ready)))
        )
        if ask is None and len(ready) == 1:
            self._send(ready[0])
            return
        for i in range(0, len(ready), REPORTS_PER_CALL):
            batch = ready[i : i + REPORTS_PER_CALL]
            carried = ask if i + REPORTS_PER_CALL >= len(ready) else None  # the claim rides the last call
            answers, got = self.send_reports(
                [h.report for h in batch if h.report is not None], carried[0] if carried is not None else None
            )
            for h, answer in zip(batch, answers, strict=True):
                try:
                    self._sent(h, answer)
                except OSError as e:
                    log.warning("event=job.disk_error job=%s worker=%s error=%s", h.job, self.name, e)
            if carried is not None and got is not None:
                self._claimed(got, *carried)

    def _send(self, h: Held) -> None:
        assert h.report is not None
        self._sent(h, self.send_report(h.report))

    def _sent(self, h: Held, answer: str | None) -> None:
        if answer is None:
            h.tries += 1
            h.next_try = clock.now() + min(0.5 * 2**h.tries, 30.0)
            return
        with self.lock:
            self.held.pop(h.job, None)
        if self.relay is not None:
            self.relay.remove(h.job)
        h.jd.remove(self.spare)
        if h.cgroup is not None:
            self.cgroups.give(h.cgroup)
        self.next_claim = 0.0  # a slot is free

    def send_report(self, report: ReportRequest) -> str | None:
        """Send one spooled report; its answer (and the spool file gone), or None to try again later."""
        assert self.spool is not None and self.timing is not None
        try:
            got: ReportResponse = self.api.call(
                "POST", "/v1/worker/report", report, model=ReportResponse, timeout=self.timing.request_timeout_seconds
            )
        except Refused as e:
            self.refuse(e.message)
            return None
        except BadRequest as e:
            log.error("event=job.report_refused job=%s report=%s error=%s", report.job, report.report_id, e.message)
            with contextlib.suppress(OSError):
                self.spool.path(report.report_id).rename(self.spool.path(report.report_id).with_suffix(".bad"))
            return "bad"
        except (PiloopError, OSError) as e:
            self.reach.failed(e, self.name)
            return None
        self.spool.remove(report.report_id)
        log.info("event=job.reported job=%s outcome=%s answer=%s", report.job, report.outcome, got.answer)
        return got.answer

    def send_reports(
        self, reports: list[ReportRequest], claim: ClaimRequest | None = None
    ) -> tuple[list[str | None], ClaimResponse | None]:
        """Send spooled reports in one call, and `claim` after them; each report's answer (its spool file gone), or
        None to try it again later, and the claim's answer (None: not claimed, the loop claims alone)."""
        assert self.spool is not None and self.timing is not None
        try:
            got: ReportsResponse = self.api.call(
                "POST",
                "/v1/worker/reports",
                ReportsRequest(protocol=PROTOCOL, reports=reports, claim=claim),
                model=ReportsResponse,
                timeout=self.timing.request_timeout_seconds,
            )
        except Refused as e:
            self.refuse(e.message)
            return [None] * len(reports), None
        except BadRequest:
            # the call as a whole refused (or a server without claims in reports): each alone says which
            return [self.send_report(r) for r in reports], None
        except (PiloopError, OSError) as e:
            self.reach.failed(e, self.name)
            return [None] * len(reports), None
        out: list[str | None] = []
        for report, a in zip(reports, got.answers, strict=True):
            if a.error is None:
                self.spool.remove(report.report_id)
                log.info("event=job.reported job=%s outcome=%s answer=%s", report.job, report.outcome, a.answer)
                out.append(a.answer)
            elif isinstance(from_payload({"error": a.error, "message": a.message}, 400), BadRequest):
                log.error("event=job.report_refused job=%s report=%s error=%s", report.job, report.report_id, a.message)
                with contextlib.suppress(OSError):
                    self.spool.path(report.report_id).rename(self.spool.path(report.report_id).with_suffix(".bad"))
                out.append("bad")
            else:
                self.reach.failed(from_payload({"error": a.error, "message": a.message}, 500), self.name)
                out.append(None)
        return out, got.claim

    def send_spool(self) -> None:
        """Send every spooled report that no job of ours is sending right now."""
        assert self.spool is not None
        with self.lock:
            mine = {h.report.report_id for h in self.held.values() if h.report is not None}
        for report in self.spool.pending():
            if report.report_id in mine:
                continue
            if self.send_report(report) is None:
                return
            assert self.workdir is not None
            JobDir.for_lease(self.workdir, report.job, report.token).remove()

    # -- claims and starts ------------------------------------------------------------------
    def granted_mb(self) -> int:
        """The grants of the jobs this worker holds (re-attached ones from their job.json)."""
        total = 0
        held = self.snapshot()
        for h in held:
            if h.job not in self.grants:
                self.grants[h.job] = int((h.jd.record() or {}).get("memory_mb") or 0)
            total += self.grants[h.job]
        for job in set(self.grants) - {h.job for h in held}:
            del self.grants[job]
        return total

    def room_mb(self) -> int:
        """What this worker can grant: its available memory less the pool's reserve (`room.Room`)."""
        assert self.timing is not None
        granted = self.granted_mb()
        return self.room.measure(available_mb(), granted, self.timing.memory_reserve_mb, idle=not self.grants)

    def _claim_ask(
        self, wait: float | None = None, most: int = EVALUATIONS_PER_CLAIM
    ) -> tuple[ClaimRequest, float, int] | None:
        """The claim to send now, when and the room it offers; None when the host's memory pressure admits none (the
        next is put off a renew period). Idle, a claim waits at the server for a job (a long poll) instead of coming
        back a renew period later; a worker with jobs never waits there, so its main loop keeps tending them."""
        assert self.timing is not None
        if pressure.admission(self.host_sample(), self.timing.memory_pressure_max):
            self.next_claim = clock.now() + self.timing.renew_seconds
            return None
        sent = clock.now()
        if wait is None:
            with self.lock:
                wait = 0.0 if self.held else min(self.timing.renew_seconds, LONG_POLL_MAX)
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
                timeout=self.timing.request_timeout_seconds + req.wait_seconds,
            )
        except Refused as e:
            self.refuse(e.message)
            return
        except NotFound:
            self.next_claim = sent + self.timing.renew_seconds  # the heartbeat registers again
            return
        except (PiloopError, OSError) as e:
            self.reach.failed(e, self.name)
            self.next_claim = sent + self.timing.renew_seconds
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
        with self.lock:
            idle = not self.held
        if resp.leases:
            self.next_claim = sent + 0.05
        elif resp.reason == "nothing" and (req.wait_seconds or idle):
            self.next_claim = 0.0  # nothing queued: an idle worker waits for a job at the server (again)
        else:
            self.next_claim = sent + max(0.5, self.timing.renew_seconds)

    def start_job(self, a: Assignment, sent: float, room: int) -> None:
        """Start `a`, leased by a claim sent at `sent` when this worker could grant `room` MiB (less the grants of
        the jobs that claim started before this one)."""
        assert self.timing is not None and self.workdir is not None
        if a.image and a.image != self.image:
            log.info("event=job.released job=%s reason=image wants=%s have=%s", a.job, a.image, self.image or "-")
            with contextlib.suppress(PiloopError, OSError):
                self.api.call(
                    "POST",
                    "/v1/worker/release",
                    ReleaseRequest(protocol=PROTOCOL, job=a.job, token=a.token, reason="image"),
                    timeout=self.timing.request_timeout_seconds,
                )
                # the server matched the job to an image we do not have: its record of ours is wrong, so
                # register again (it filters claims by that record) rather than be handed the job again
                self.register_with(self.api, self.snapshot())
            return
        jd = JobDir.for_lease(self.workdir, a.job, a.token)
        record = a.model_dump(mode="json", exclude={"secrets"})
        record["secret_names"] = sorted(a.secrets)
        record["claimed_at"] = time.time()
        relay_at = self.relay.path_for(jd.root) if self.relay is not None else socket_path(jd.root)
        record["relay"] = str(relay_at)
        try:
            # the claim renewed nothing yet: the lease's clock started at most when the claim was sent
            jd.create(record, fence_deadline(sent, self.timing), self.spare)
        except OSError as e:
            # a full --dir: nothing ran, so give the job back (not an attempt) and claim nothing for a while
            jd.remove()
            why = "disk_full" if e.errno in (errno.ENOSPC, errno.EDQUOT) else "dir"
            log.warning("event=job.released job=%s reason=%s worker=%s error=%s", a.job, why, self.name, e)
            with contextlib.suppress(PiloopError, OSError):
                self.api.call(
                    "POST",
                    "/v1/worker/release",
                    ReleaseRequest(protocol=PROTOCOL, job=a.job, token=a.token, reason=f"{why}: {e.strerror}"),
                    timeout=self.timing.request_timeout_seconds,
                )
            self.next_claim = clock.now() + 10 * self.timing.renew_seconds
            return
        h = Held(a.job, a.token, a.kind, jd, LogShipper(jd))
        with self.lock:
            self.held[a.job] = h
        self._relay_for(a.job, a.token, relay_at, jd)
        log.info("event=job.started job=%s token=%s kind=%s worker=%s", a.job, a.token, a.kind, self.name)
        stage = "inputs"
        try:
            for name, addr in a.spec.inputs.items():
                if not _safe_name(name):
                    raise ValueError(f"input name {name!r} is not a relative path inside the job's dir")
                dest = jd.inputs / name
                dest.parent.mkdir(parents=True, exist_ok=True)
                self.store.get_file(addr, dest, durable=False, in_place=True)
            stage = "repo"
            camp_env = self._prepare_campaign(a, jd) if a.spec.campaign is not None else {}
        except (PiloopError, OSError, ValueError) as e:
            msg = getattr(e, "message", None) or str(e)
            jd.write_exit(
                {
                    "exit_code": None,
                    "signal": None,
                    "oom": False,
                    "stopped": "",
                    "reason": f"{stage}: {msg}",
                    "usage": Usage().model_dump(),
                    "duration_seconds": 0.0,
                }
            )
            return
        cgroup = None
        self.grants[a.job] = a.memory_mb or 0
        if self.cgroups.available:
            # its grant is its limit; a job without one is limited to the worker's room
            limit = a.memory_mb or max(room, 1)
            try:
                h.cgroup = cg = self.cgroups.take(limit)
                cgroup = {
                    "path": str(cg.path),
                    "version": cg.version,
                    "limit_mb": limit,
                    "held_seconds": self.timing.memory_held_seconds,
                }
            except OSError as e:
                log.warning("event=job.no_cgroup job=%s error=%s", a.job, e)
        # what the job adds to the worker's environment, which the shim host has (`shim.job_env`); never a secret
        # that would shadow it (the server refuses those too)
        secrets, refused = envnames.injectable(a.secrets)
        for name in refused:
            log.error("event=secret.refused job=%s name=%s: %s", a.job, name[:80], envnames.problem(name))
        env = {
            **a.spec.env,
            **secrets,
            "PILOOP_JOB": a.job,
            "PILOOP_LEASE_TOKEN": a.token,
            "PILOOP_JOB_DIR": str(jd.root),
            "PILOOP_RELAY": str(relay_at),
            "PILOOP_HOME": str(self.home),
            **camp_env,
            "PATH": job_path(a.spec.env),
        }
        h.shim_due = clock.now() + SHIM_START_SECONDS
        self.host.run_job(
            {
                "dir": str(jd.root),
                "argv": a.spec.argv,
                "env": env,
                "timeout": a.spec.timeout_seconds,
                "kill_grace": self.timing.kill_grace_seconds,
                "cgroup": cgroup,
                "metrics_seconds": 5,
                "task": a.spec.argv[0] if a.spec.runner == "task" else None,
            }
        )

    def _prepare_campaign(self, a: Assignment, jd: JobDir) -> dict[str, str]:
        """A campaign job's clone (its cwd) and, for an agent, its workspace copy; the env that says where."""
        camp = a.spec.campaign
        assert camp is not None and self.timing is not None

        def newer(have: list[str]) -> BundleResponse:
            return self.api.call(
                "POST",
                "/v1/worker/bundle",
                BundleRequest(protocol=PROTOCOL, job=a.job, token=a.token, have=have),
                model=BundleResponse,
                timeout=self.timing.request_timeout_seconds * 3,
            )

        fetched = self.repos.checkout(camp, jd.work, newer)
        jd.write_fetched(fetched)
        env = {"PILOOP_CAMPAIGN": camp.repo.campaign, "PILOOP_BASE_COMMIT": camp.repo.commit}
        if camp.collect:
            self.repos.give_workspace(camp, jd.workspace)
            env |= {"PILOOP_WORKSPACE": str(jd.workspace), "PILOOP_RUN_BRANCH": camp.repo.branch}
        log.info(
            "event=job.repo job=%s campaign=%s commit=%s fetched_bytes=%d",
            a.job,
            camp.repo.campaign,
            camp.repo.commit[:12],
            fetched,
        )
        return env

    def _campaign_results(self, h: Held, outcome: str, reason: str) -> tuple[str, str, dict[str, Any]]:
        """An agent's commits and workspace writes, an evaluation's score; the outcome and reason they leave.
        Only a run that succeeded is taken back or scored: partial output never is."""
        spec = ((h.jd.record() or {}).get("spec") or {}).get("campaign")
        if not spec:
            return outcome, reason, {}
        camp = CampaignJob.model_validate(spec)
        out: dict[str, Any] = {"fetched_bytes": h.jd.read_fetched()}
        if outcome != "succeeded":
            return outcome, reason, out
        if camp.collect:
            try:
                out["head"], out["bundle"], out["workspace"] = self.repos.collect(camp, h.jd.work, h.jd.workspace)
            except GitError as e:
                return "failed", f"the run's commits cannot be read: {e.message}", out
        if camp.score:
            out["score"] = parse_score(h.jd.output_log)
            if out["score"] is None:
                return (
                    "failed",
                    (
                        "no score: the eval command's last line must be `score=<number>` or a JSON "
                        'object with a numeric "score"'
                    ),
                    out,
                )
        return outcome, reason, out

    def _relay_for(self, job: str, token: str, path: Path, jd: JobDir) -> None:
        assert self.relay is not None
        try:
            self.relay.add(job, token, path)
        except OSError as e:
            # the job runs; its own `piloop` calls fail, saying the relay does not answer, and its log says why
            why = e.strerror or str(e)
            log.warning("event=relay.unavailable job=%s path=%s error=%s", job, path, why)
            line = f"piloop: this job's relay is not available: {path}: {why}; piloop commands will fail\n"
            try:
                with open(jd.output_log, "ab") as f:
                    f.write(line.encode(errors="replace"))
            except OSError as e2:
                log.warning("event=relay.unsaid job=%s error=%s", job, e2)

    # -- ends --------------------------------------------------------------------------------
    def detach(self, budget: float) -> None:
        """Stop heartbeating and claiming; send the reports that are ready; leave the shims running."""
        if self.heartbeat is not None:
            self.heartbeat.stop.set()
        end = clock.now() + budget
        for h in self.snapshot():
            if clock.now() > end:
                break
            if h.report is None and h.jd.exit_json.exists():
                self._build_report(h)
            if h.report is not None:
                self._send(h)
        if self.heartbeat is not None:
            self.heartbeat.join(timeout=max(0.1, end - clock.now()))

    def stop_all(self, why: str, wait: float) -> None:
        """Stop every job (its shim kills its process group) and wait for them to end."""
        if self.heartbeat is not None:
            self.heartbeat.stop.set()
        held = self.snapshot()
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
