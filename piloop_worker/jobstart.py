"""A job's start: a free slot and its deadline, its inputs and campaign checkout, its cgroup, its relay, its
environment, and the `start` to the slot's supervisor (`slots.SlotHandle.start`). A job this worker cannot start is
given back (released).
"""

from __future__ import annotations

import base64
import contextlib
import logging
import os
import sys
import tarfile
import time
from collections.abc import Callable
from pathlib import Path, PurePosixPath

from piloop_common import envnames
from piloop_common.cas import Store
from piloop_common.errors import PiloopError, Unavailable
from piloop_common.protocol.campaign import BundleRequest, BundleResponse
from piloop_common.protocol.worker import PIPE_INPUTS, PROTOCOL, Assignment, ReleaseRequest
from piloop_common.sdk.client import ApiClient
from piloop_common.sdk.taskcode import CodeCache
from piloop_worker.cgroups import Cgroups
from piloop_worker.context import WorkerContext
from piloop_worker.fencing import fence_deadline
from piloop_worker.held import Held
from piloop_worker.holdings import Holdings
from piloop_worker.jobfiles import JobFiles
from piloop_worker.jobrecord import JobRecord
from piloop_worker.jobuser import JobUser
from piloop_worker.lease import HeldLease
from piloop_worker.logs import LogShipper
from piloop_worker.records import CgroupGrant, ExitRecord
from piloop_worker.relay import Relay
from piloop_worker.repos import Repos
from piloop_worker.slots import SlotRequest
from piloop_worker.slots.wire import Ended
from piloop_worker.slotset import Slots

log = logging.getLogger("piloop.worker")

ARGS_INPUTS = ("args.json", "args.pickle")
DISK_FULL_PAUSE_HEARTBEATS = 10  # a worker whose dir is full claims nothing for this many heartbeats

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
    """The worker's job starts: each job a claim leased, on a free slot of `slots`, started by its supervisor."""

    def __init__(
        self,
        ctx: WorkerContext,
        *,
        api: ApiClient,
        holdings: Holdings,
        slots: Slots,
        store: Store,
        repos: Repos,
        cgroups: Cgroups,
        relay: Relay,
        workdir: Path,
        home: Path,
        image: str,
        user: JobUser | None,
        warm_tasks: tuple[int, int] | None,
        register: Callable[[], None],
        pause_claims: Callable[[float], None],
    ) -> None:
        self.ctx, self.api, self.holdings, self.slots = ctx, api, holdings, slots
        self.store, self.repos, self.cgroups, self.relay = store, repos, cgroups, relay
        self.workdir, self.home, self.image = workdir, home, image
        self.user, self.warm_tasks = user, warm_tasks
        self.register = register  # registers again holding what the worker holds
        self.pause_claims = pause_claims  # claims nothing for so many seconds

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
        n = self.slots.free(self.holdings.busy_slots())
        files = self.slots.files(n)
        try:
            files.prepare()
            if files.full():
                raise OSError(28, "No space left on device", str(files.root))
            handle = self.slots.handle(n)
        except (OSError, Unavailable) as e:
            # a full --dir, or a slot whose supervisor does not start: nothing ran, so give the job back (no attempt)
            full = isinstance(e, OSError) and e.errno in (28, 122)  # ENOSPC, EDQUOT
            why = "disk_full" if full else "slot"
            msg = (e.strerror or str(e)) if isinstance(e, OSError) else e.message
            log.warning("event=job.released job=%s reason=%s worker=%s error=%s", a.job, why, self.ctx.name, msg)
            self._release(a, f"{why}: {msg}")
            if full:
                self.pause_claims(DISK_FULL_PAUSE_HEARTBEATS * timed.renew_seconds)
            return
        lease = HeldLease(a.job, a.token)
        relay_at = self.relay.path_for(files.root)
        record = JobRecord.from_assignment(a, relay_at, time.time())
        generation = self.slots.next_generation()
        shipper = LogShipper(files.slot.output_log, files.root / "log.json")
        h = Held(lease, a.kind, n, generation, shipper, record=record)
        self.holdings.add(h)
        log.info("event=job.started job=%s token=%s kind=%s worker=%s slot=%d", *lease, a.kind, self.ctx.name, n)
        task = a.spec.runner == "task"
        stage = "inputs"
        args: dict[str, bytes | str | None] = {}
        try:
            args = self._inputs(a, files, task)
            stage = "code"
            code = self._code(a.spec.code) if a.spec.code else None
            stage = "repo"
            camp_env = self._prepare_campaign(a, files, record) if a.spec.campaign is not None else {}
        except (PiloopError, OSError, ValueError, tarfile.TarError) as e:
            msg = getattr(e, "message", None) or str(e)
            h.ended = Ended(generation, ExitRecord(reason=f"{stage}: {msg}"))  # reported at the loop's next look
            return
        cgroup = None
        self.holdings.grant(a.job, a.memory_mb or 0)
        if self.cgroups.available:
            # its grant is its limit; a job without one is limited to the worker's room
            limit = a.memory_mb or max(room, 1)
            try:
                try:
                    cg = self.cgroups.slot(n, limit)
                except OSError:  # v1 could not reclaim the slot's group down to a lower limit: one of its own
                    cg = self.cgroups.take(limit)
                h.cgroup = cg
                cgroup = CgroupGrant(str(cg.path), cg.version, limit, timed.memory_held_seconds)
            except OSError as e:
                log.warning("event=job.no_cgroup job=%s error=%s", a.job, e)
        # what the job adds to the supervisor's environment (the worker's, less its credentials); never a secret
        # that would shadow it (the server refuses those too)
        secrets, refused = envnames.injectable(a.secrets)
        for name in refused:
            log.error("event=secret.refused job=%s name=%s: %s", a.job, name[:80], envnames.problem(name))
        env = {
            **a.spec.env,
            **secrets,
            "PILOOP_JOB": a.job,
            "PILOOP_LEASE_TOKEN": lease.token,
            "PILOOP_JOB_DIR": str(files.root),
            "PILOOP_RELAY": str(relay_at),
            "PILOOP_HOME": str(self.home),
            **camp_env,
            "PATH": job_path(a.spec.env),
        }
        if code is not None:  # first on the path: the task imports its module from the code it was submitted with
            rest = a.spec.env.get("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
            env["PYTHONPATH"] = os.pathsep.join(p for p in (str(code), rest) if p)
        self.relay.add_or_say(lease, relay_at, files.slot.output_log)
        warm = self.warm_tasks if task and self.user is None else None
        request = SlotRequest(
            argv=a.spec.argv,
            env=env,
            cwd=str(files.repo) if a.spec.campaign is not None else None,
            kill_grace=timed.kill_grace_seconds,
            timeout=a.spec.timeout_seconds,
            cgroup=cgroup,
            task=a.spec.argv[0] if task else None,
            code=str(code) if code is not None else None,
            user=self.user.wire() if self.user is not None else None,
            worker=self.ctx.name or "",
            warm_max_tasks=warm[0] if warm else 0,
            warm_max_rss_mb=warm[1] if warm else 0,
            serializer=str(args.get("serializer") or "json"),
            args=_bytes(args.get("args")),
            parent=_bytes(args.get("parent")),
            args_file=_text(args.get("args_file")),
            parent_file=_text(args.get("parent_file")),
            parent_serializer=str(args.get("parent_serializer") or ""),
        )
        # the claim renewed nothing yet: the lease's clock started at most when the claim was sent
        handle.start(generation, lease.job, lease.token, fence_deadline(sent, timed), request, record.to_start())
        self.slots.assign(n, generation, lease.job, lease.token)  # a restarted worker finds it if both die

    def _inputs(self, a: Assignment, files: JobFiles, task: bool) -> dict[str, bytes | str | None]:
        """A job's inputs: a task's arguments (and a chain link's parent's value) inline, or fetched to a file when
        the CAS has them; every other input to `inputs/`. What a task's request carries of them."""
        out: dict[str, bytes | str | None] = {}
        for name, data in a.spec.inline_inputs.items():  # carried in the claim's answer: no CAS
            if not _safe_name(name):
                raise ValueError(f"input name {name!r} is not a relative path inside the job's dir")
            raw = base64.b64decode(data)
            if task and name in (*ARGS_INPUTS, *PIPE_INPUTS):
                out["args" if name in ARGS_INPUTS else "parent"] = raw
                out["serializer" if name in ARGS_INPUTS else "parent_serializer"] = name.rpartition(".")[2]
                continue
            dest = files.inputs / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(raw)
        for name, addr in a.spec.inputs.items():
            if not _safe_name(name):
                raise ValueError(f"input name {name!r} is not a relative path inside the job's dir")
            dest = files.inputs / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            self.store.get_file(addr, dest, durable=False, in_place=True)
            if task and name in (*ARGS_INPUTS, *PIPE_INPUTS):
                out["args_file" if name in ARGS_INPUTS else "parent_file"] = str(dest)
                out["serializer" if name in ARGS_INPUTS else "parent_serializer"] = name.rpartition(".")[2]
        if task and "args" not in out and "args_file" not in out:
            raise ValueError("a task needs the input args.json or args.pickle; it has neither")
        return out

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

    def _prepare_campaign(self, a: Assignment, files: JobFiles, record: JobRecord) -> dict[str, str]:
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

        fetched = record.fetched_bytes = self.repos.checkout(camp, files.repo, newer)
        env = {"PILOOP_CAMPAIGN": camp.repo.campaign, "PILOOP_BASE_COMMIT": camp.repo.commit}
        if camp.collect:
            self.repos.give_workspace(camp, files.workspace)
            env |= {"PILOOP_WORKSPACE": str(files.workspace), "PILOOP_RUN_BRANCH": camp.repo.branch}
        log.info(
            "event=job.repo job=%s campaign=%s commit=%s fetched_bytes=%d",
            a.job,
            camp.repo.campaign,
            camp.repo.commit[:12],
            fetched,
        )
        return env


def _bytes(v: bytes | str | None) -> bytes | None:
    return v if isinstance(v, bytes) else None


def _text(v: bytes | str | None) -> str | None:
    return v if isinstance(v, str) else None
