"""A job's start: its dir and deadline, its inputs and campaign checkout, its cgroup, its relay, its environment,
and the request to the shim host that forks its shim. A job this worker cannot start is given back (released).
"""

from __future__ import annotations

import base64
import contextlib
import errno
import logging
import os
import sys
import tarfile
import time
from collections.abc import Callable
from pathlib import Path, PurePosixPath

from piloop_common import envnames
from piloop_common.cas import Store
from piloop_common.errors import PiloopError
from piloop_common.protocol.campaign import BundleRequest, BundleResponse
from piloop_common.protocol.worker import PROTOCOL, Assignment, ReleaseRequest
from piloop_common.sdk.client import ApiClient
from piloop_common.sdk.taskcode import CodeCache
from piloop_worker import clock
from piloop_worker.cgroups import Cgroups
from piloop_worker.context import WorkerContext
from piloop_worker.fencing import fence_deadline
from piloop_worker.held import Held
from piloop_worker.holdings import Holdings
from piloop_worker.jobdir import JobDir
from piloop_worker.jobrecord import JobRecord
from piloop_worker.lease import HeldLease
from piloop_worker.logs import LogShipper
from piloop_worker.relay import Relay
from piloop_worker.repos import Repos
from piloop_worker.shimhost import ShimHost
from piloop_worker.shimproto import CgroupGrant, ExitRecord, ShimRequest
from piloop_worker.sparedirs import SpareDirs

log = logging.getLogger("piloop.worker")

SHIM_START_SECONDS = 10.0  # a shim that has not taken its dir's lock by then never will

# where `piloop` is: the worker's own interpreter's bin dir (a venv's), whatever PATH started the worker
BIN_DIR = os.path.dirname(sys.executable)


def job_path(spec_env: dict[str, str]) -> str:
    """A job's PATH: the worker's bin dir first, so the job's `piloop` is the worker's, then the spec's PATH, else
    the worker's own."""
    rest = spec_env.get("PATH", os.environ.get("PATH", os.defpath))
    if rest == BIN_DIR or rest.startswith(BIN_DIR + os.pathsep):
        return rest
    return f"{BIN_DIR}{os.pathsep}{rest}" if rest else BIN_DIR


def _safe_name(name: str) -> bool:
    p = PurePosixPath(name)
    return bool(name) and not p.is_absolute() and ".." not in p.parts and name not in (".",)


class Starter:
    """The worker's job starts: each job a claim leased, in its dir under `workdir`, handed to the shim host."""

    def __init__(
        self,
        ctx: WorkerContext,
        *,
        api: ApiClient,
        holdings: Holdings,
        store: Store,
        repos: Repos,
        cgroups: Cgroups,
        host: ShimHost,
        relay: Relay,
        workdir: Path,
        spare: SpareDirs | None,
        home: Path,
        image: str,
        register: Callable[[], None],
    ) -> None:
        self.ctx, self.api, self.holdings = ctx, api, holdings
        self.store, self.repos, self.cgroups, self.host, self.relay = store, repos, cgroups, host, relay
        self.workdir, self.spare, self.home, self.image = workdir, spare, home, image
        self.register = register  # registers again holding what the worker holds

    def start(self, a: Assignment, sent: float, room: int) -> None:
        """Start `a`, leased by a claim sent at `sent` when this worker could grant `room` MiB (less the grants of
        the jobs that claim started before this one)."""
        timed = self.ctx.timed
        if a.image and a.image != self.image:
            log.info("event=job.released job=%s reason=image wants=%s have=%s", a.job, a.image, self.image or "-")
            if self._release(a, "image"):
                # the server matched the job to an image we do not have: its record of ours is wrong, so
                # register again (it filters claims by that record) rather than be handed the job again
                with contextlib.suppress(PiloopError, OSError):
                    self.register()
            return
        lease = HeldLease(a.job, a.token)
        jd = JobDir.for_lease(self.workdir, lease.job, lease.token)
        relay_at = self.relay.path_for(jd.root)
        record = JobRecord.from_assignment(a, relay_at, time.time())
        try:
            # the claim renewed nothing yet: the lease's clock started at most when the claim was sent
            jd.create(record, fence_deadline(sent, timed), self.spare)
        except OSError as e:
            # a full --dir: nothing ran, so give the job back (not an attempt)
            jd.remove()
            why = "disk_full" if e.errno in (errno.ENOSPC, errno.EDQUOT) else "dir"
            log.warning("event=job.released job=%s reason=%s worker=%s error=%s", a.job, why, self.ctx.name, e)
            self._release(a, f"{why}: {e.strerror}")
            return
        h = Held(lease, a.kind, jd, LogShipper(jd), record=record)
        self.holdings.add(h)
        self.relay.add_or_say(lease, relay_at, jd.output_log)
        log.info("event=job.started job=%s token=%s kind=%s worker=%s", *lease, a.kind, self.ctx.name)
        stage = "inputs"
        try:
            for name, addr in a.spec.inputs.items():
                if not _safe_name(name):
                    raise ValueError(f"input name {name!r} is not a relative path inside the job's dir")
                dest = jd.inputs / name
                dest.parent.mkdir(parents=True, exist_ok=True)
                self.store.get_file(addr, dest, durable=False, in_place=True)
            for name, data in a.spec.inline_inputs.items():  # carried in the claim's answer: no CAS
                if not _safe_name(name):
                    raise ValueError(f"input name {name!r} is not a relative path inside the job's dir")
                dest = jd.inputs / name
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(base64.b64decode(data))
            stage = "code"
            code = self._code(a.spec.code) if a.spec.code else None
            stage = "repo"
            camp_env = self._prepare_campaign(a, jd) if a.spec.campaign is not None else {}
        except (PiloopError, OSError, ValueError, tarfile.TarError) as e:
            msg = getattr(e, "message", None) or str(e)
            jd.write_exit(ExitRecord(reason=f"{stage}: {msg}"))
            return
        cgroup = None
        self.holdings.grant(a.job, a.memory_mb or 0)
        if self.cgroups.available:
            # its grant is its limit; a job without one is limited to the worker's room
            limit = a.memory_mb or max(room, 1)
            try:
                h.cgroup = cg = self.cgroups.take(limit)
                cgroup = CgroupGrant(str(cg.path), cg.version, limit, timed.memory_held_seconds)
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
            "PILOOP_LEASE_TOKEN": lease.token,
            "PILOOP_JOB_DIR": str(jd.root),
            "PILOOP_RELAY": str(relay_at),
            "PILOOP_HOME": str(self.home),
            **camp_env,
            "PATH": job_path(a.spec.env),
        }
        if code is not None:  # first on the path: the task imports its module from the code it was submitted with
            rest = a.spec.env.get("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
            env["PYTHONPATH"] = os.pathsep.join(p for p in (str(code), rest) if p)
        h.shim_due = clock.now() + SHIM_START_SECONDS
        warm = self.host.warm_tasks if a.spec.runner == "task" else None
        self.host.run_job(
            ShimRequest(
                dir=str(jd.root),
                argv=a.spec.argv,
                env=env,
                kill_grace=timed.kill_grace_seconds,
                timeout=a.spec.timeout_seconds,
                cgroup=cgroup,
                task=a.spec.argv[0] if a.spec.runner == "task" else None,
                code=str(code) if code is not None else None,
                worker=self.ctx.name or "",
                warm_max_tasks=warm[0] if warm else 0,
                warm_max_rss_mb=warm[1] if warm else 0,
            )
        )

    def _code(self, address: str) -> Path:
        """The dir of a shipped code snapshot, fetched from the CAS and unpacked once per address under --dir."""

        def fetch(addr: str, dest: Path) -> None:
            self.store.get_file(addr, dest, durable=False)

        return CodeCache(self.workdir / "code").get(address, fetch)

    def _release(self, a: Assignment, reason: str) -> bool:
        """Give `a` back to the server unrun (not an attempt); whether the server heard it."""
        try:
            self.api.call(
                "POST",
                "/v1/worker/release",
                ReleaseRequest(protocol=PROTOCOL, job=a.job, token=a.token, reason=reason),
                timeout=self.ctx.timed.request_timeout_seconds,
            )
        except (PiloopError, OSError):
            return False  # its lease expires and it runs elsewhere, as if this worker had died
        return True

    def _prepare_campaign(self, a: Assignment, jd: JobDir) -> dict[str, str]:
        """A campaign job's clone (its cwd) and, for an agent, its workspace copy; the env that says where."""
        camp = a.spec.campaign
        assert camp is not None

        def newer(have: list[str]) -> BundleResponse:
            return self.api.call(
                "POST",
                "/v1/worker/bundle",
                BundleRequest(protocol=PROTOCOL, job=a.job, token=a.token, have=have),
                model=BundleResponse,
                timeout=self.ctx.timed.request_timeout_seconds * 3,
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
