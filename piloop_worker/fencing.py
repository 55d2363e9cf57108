"""Fencing: the deadline by which a job must stop unless a renewal moves it, the server's word on each job applied
to its dir, and a job whose shim died buried (its processes killed, the job recorded lost).

The shim enforces the deadline itself (`shim.py`), so a job stops in time even when the worker is dead; what is here
is the worker's side: it writes the deadline each renewal acknowledged, and asks a shim to stop.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from collections.abc import Iterable
from pathlib import Path

import psutil

from piloop_common.protocol.worker import LeaseStatus, Timing
from piloop_worker.cgroups import Cgroups, JobCgroup
from piloop_worker.held import Held
from piloop_worker.holdings import Holdings
from piloop_worker.jobdir import JobDir
from piloop_worker.shimproto import ExitRecord, ShimRecord, StopReason

log = logging.getLogger("piloop.worker")


def fence_deadline(sent: float, timing: Timing) -> float:
    """When a job must stop if nothing renews it: two heartbeats before its lease expires (the design's rule),
    or earlier still where the kill grace would not fit in those two heartbeats, so it is dead before the lease
    ends whatever the config. `sent` is the time (`clock.now`) the renewing call was sent (the safe side)."""
    margin = max(2 * timing.renew_seconds, timing.kill_grace_seconds + 0.2)
    return sent + timing.toleration_seconds - margin


def apply_statuses(held: Iterable[Held], statuses: dict[str, LeaseStatus], deadline: float, worker: str) -> None:
    """Act on the server's word about each job named to it: move its deadline to `deadline`, or stop it. A job the
    server did not name is lost."""
    for h in held:
        st = statuses.get(h.job, LeaseStatus.LOST)
        try:
            if st is LeaseStatus.OK:
                if h.jd.root.exists():
                    h.jd.write_deadline(deadline)
            elif st is LeaseStatus.CANCEL:
                h.jd.request_stop(StopReason.CANCELLED)
            else:
                if not h.jd.exit_json.exists():
                    log.warning("event=job.lost job=%s token=%s worker=%s", *h.lease, worker)
                h.jd.request_stop(StopReason.LOST)
        except FileNotFoundError:
            pass  # reported and removed meanwhile
        except OSError as e:
            # a full disk: this job's deadline stays where it was (its shim fences it there, the safe side),
            # and the other jobs still get theirs
            log.warning("event=job.deadline_unwritten job=%s worker=%s error=%s", h.job, worker, e)


def apply_answer(
    holdings: Holdings, statuses: dict[str, LeaseStatus], sent: float, held: list[Held], timing: Timing, worker: str
) -> None:
    """Act on the server's word about each job of `held` (named in a call sent at `sent`) that is still held: renew
    its deadline, or stop it. A job reported while the word was on its way is no longer the server's (it answers
    `lost`), and its dir may be a spare by now, or a later job's: under the lock that reporting takes to give the dir
    away, it is left alone."""
    deadline = fence_deadline(sent, timing)
    holdings.while_held(held, lambda still: apply_statuses(still, statuses, deadline, worker))


def cgroup_of(cgroups: Cgroups, shim: ShimRecord | None) -> JobCgroup | None:
    """The cgroup a job ran in, as its shim wrote it down in `shim.json`."""
    path = shim.cgroup if shim is not None else None
    return JobCgroup(Path(path), cgroups.version) if path and cgroups.available else None


def bury(jd: JobDir, cgroups: Cgroups) -> None:
    """The shim died without an exit record: kill what it left, and record the job lost."""
    shim = jd.shim_record()
    if shim is not None and shim.pgid:
        with contextlib.suppress(psutil.Error, OSError):
            p = psutil.Process(shim.pgid)
            if abs(p.create_time() - shim.started) < 5:  # not a later group that has its id
                os.killpg(shim.pgid, signal.SIGKILL)
    if (cg := cgroup_of(cgroups, shim)) is not None:
        cg.kill_all()  # what left the job's process group
    jd.write_exit(ExitRecord(lost=True, reason="the job's shim died before the job ended"))
