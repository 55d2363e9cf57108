"""Claims and reports: what a worker's lease calls do, between the routes (`api/worker.py`, which parse and answer)
and the lease scripts (`state/leases.py`).

A claim leases jobs of each kind the worker's pool has slots for, and reads each one's spec for its `Assignment`. A
report is checked (its worker's token, the blobs it names), turned into the `JobResult` its job keeps and the
`Report` the scripts are told, and run; several reports of one call run in one batch."""

from __future__ import annotations

import logging
import time
from typing import Any

from piloop_common.errors import NotFound, PiloopError, Refused
from piloop_common.protocol.operator import JobResult, JobUsage
from piloop_common.protocol.report import ReportAnswer, ReportRequest, ReportResponse, ReportsRequest
from piloop_common.protocol.worker import Assignment, ClaimRequest, ClaimResponse, HostSample, JobSpec, Timing
from piloop_server import pools
from piloop_server.api import worker_door as door
from piloop_server.auth import Caller
from piloop_server.runtime import Runtime
from piloop_server.state.records.lease import KINDS, Lease, Report

logger = logging.getLogger("piloop.worker_api")


def timing(rt: Runtime, pool_name: str) -> Timing:
    """The timings a worker of `pool_name` runs its leases under."""
    ex = rt.executor
    pool = ex.pools[pool_name]  # door.check refused an unknown pool
    return Timing(
        renew_seconds=ex.renew_seconds,
        grace_seconds=ex.grace_seconds,
        toleration_seconds=ex.toleration_seconds,
        request_timeout_seconds=ex.request_timeout_seconds,
        kill_grace_seconds=ex.kill_grace_seconds,
        memory_pressure_max=ex.memory_pressure_max,
        memory_reserve_mb=pool.memory_reserve_mb,
        memory_held_seconds=pool.memory_held_seconds,
        log_max_bytes=rt.leases.caps.log_bytes,
        result_max_bytes=rt.leases.caps.result_bytes,
    )


# -- claims ------------------------------------------------------------------------------


def claim(body: ClaimRequest, rt: Runtime, caller: Caller) -> ClaimResponse:
    """Lease the jobs the worker has room for, each kind in one script; why none, when none."""
    name = caller.name
    rec = rt.workers.get(name)
    if rec is None or not rec.pool:
        raise NotFound(f"worker {name} is not registered: register again")
    door.check_claimer(caller, rec)
    pool_name, image = rec.pool, rec.image
    pool = rt.executor.pools.get(pool_name)
    if pool is None:
        raise Refused(f"pool {pool_name} is gone from the server's config")
    sample = rec.sample_dict()
    hs = HostSample.model_validate({k: v for k, v in sample.items() if k != "admission"}) if sample else None
    reason = pools.host_reason(pool, hs, (sample or {}).get("admission", ""))
    leases: list[Lease] = []
    if not reason:
        per_kind: dict[str, str] = {}
        for kind in KINDS:
            n = pools.slots(pool, kind)
            # cut to the slots before the claim builds a token for each (claim.lua cuts to the free ones, atomically)
            want = min(body.want.get(kind, 0), n)
            if n <= 0 or want <= 0:
                per_kind[kind] = "slots"
                continue
            c = rt.leases.claim(
                name, pool_name, kind, slots=n, image=image, most=want, room_mb=body.room_mb, default_mb=pool.memory_mb
            )
            leases += c.leases
            per_kind[kind] = c.reason or ("slots" if len(c.leases) >= want else "nothing")
        reason = "" if leases else pools.combine_reasons(per_kind)
    if reason != rec.reason:  # a worker claiming again and again mostly has the same: no write
        rt.workers.set_reason(name, reason)
    given = timing(rt, pool_name) if leases else None
    return ClaimResponse(leases=assignments(rt, leases), reason=reason, timing=given)


def assignments(rt: Runtime, leases: list[Lease]) -> list[Assignment]:
    """What each lease's worker needs of its job, read in one round trip."""
    if not leases:
        return []
    out = []
    for lease, job in zip(leases, rt.jobs.get_many([lease.job for lease in leases]), strict=True):
        if job is None:
            continue  # removed since the claim (it cannot be: a leased job is kept); nothing to run
        try:
            spec = JobSpec.model_validate_json(job.spec)
        except ValueError as e:
            # a record an older version let in: never the worker's to run, nor a 500 for its claim; it ends cancelled
            logger.warning("event=record.skipped record=job job=%s error=%s", lease.job, str(e).splitlines()[0][:200])
            rt.leases.cancel(lease.job, "service:server")
            rt.leases.release(lease.job, lease.token, job.worker, "its record cannot be read", owner=job.owner)
            continue
        secrets = rt.secrets.values(spec.secrets) if spec.secrets and getattr(rt, "secrets", None) else {}
        out.append(
            Assignment(
                job=lease.job,
                token=lease.token,
                kind=job.kind,
                pool=job.pool,
                campaign=job.campaign,
                image=job.image,
                spec=spec,
                secrets=secrets,
                memory_mb=job.granted_mb or None,
            )
        )
    return out


def give_back(rt: Runtime, caller: Caller, leases: list[Assignment]) -> None:
    """Release leases their worker never heard of (it was gone before the claim's answer)."""
    for a in leases:
        rt.leases.release(
            a.job, a.token, caller.name, "the worker was gone before it heard of the lease", owner=door.owner(caller)
        )


# -- reports -----------------------------------------------------------------------------


def report(body: ReportRequest, rt: Runtime, caller: Caller) -> ReportResponse:
    """One report, run: its answer, or the PiloopError that refused it."""
    got = rt.leases.report_many([as_report(body, caller, present(rt, [body]))], memory_caps(rt), rt.store.sizes)[0]
    if isinstance(got, PiloopError):
        raise got
    return ReportResponse.model_validate(got)


def reports(body: ReportsRequest, rt: Runtime, caller: Caller) -> tuple[list[ReportAnswer], bool]:
    """Each report checked, then all of them run in one batch (`LeasesState.report_many`): each one's answer, in
    order, and whether one queued its job again (a claim may take it)."""
    seen = present(rt, body.reports)
    answers: list[ReportAnswer | None] = [None] * len(body.reports)
    batch, at = [], []
    for i, one in enumerate(body.reports):
        try:
            door.check(rt, caller, one)
        except Refused:
            raise  # the worker's, not one report's
        except PiloopError as e:
            answers[i] = ReportAnswer(error=e.code, message=e.message)
            continue
        batch.append(as_report(one, caller, seen))
        at.append(i)
    wake = False
    for i, got in zip(at, rt.leases.report_many(batch, memory_caps(rt), rt.store.sizes) if batch else [], strict=True):
        if isinstance(got, PiloopError):
            answers[i] = ReportAnswer(error=got.code, message=got.message)
            continue
        resp = ReportResponse.model_validate(got)
        wake = wake or resp.state == "queued"
        answers[i] = ReportAnswer(answer=resp.answer, state=resp.state)
    given = [a for a in answers if a is not None]
    assert len(given) == len(answers), "every report has its answer, in order"
    return given, wake


def named(body: ReportRequest) -> list[str]:
    """The CAS addresses a report names."""
    return [*body.log, *body.outputs.values(), *(a for a in (body.metrics, body.bundle, body.workspace) if a)]


def present(rt: Runtime, bodies: list[ReportRequest]) -> set[str]:
    """Which of the blobs these reports name the CAS has: one lookup for all of them."""
    names = sorted({a for b in bodies for a in named(b)})
    # Not merged with report_many's `sizes`: has_many is one batched call (an S3 listing, one http POST) where sizes
    # is a HEAD an address, and sizes asks only the few a cap needs (log chunks unsized at their append, a result).
    return set(rt.store.has_many(names)) if names else set()


def memory_caps(rt: Runtime) -> dict[str, int | None]:
    return {p: c.memory_max_mb for p, c in rt.executor.pools.items()}


def result_of(body: ReportRequest) -> JobResult:
    """What the job keeps of a report: the keys every report gives, and those of agents, evaluations and tasks where
    the report has them (built unvalidated: `body` is)."""
    fields: dict[str, Any] = {
        "exit_code": body.exit_code,
        "signal": body.signal,
        "oom": body.oom,
        "usage": JobUsage.model_construct(peak_rss_bytes=body.usage.peak_rss_bytes, cpu_seconds=body.usage.cpu_seconds),
        "log": list(body.log),
        "outputs": dict(body.outputs),
        "metrics": body.metrics,
        "duration_seconds": body.duration_seconds,
        "outcome": body.outcome,
        "at_ms": int(time.time() * 1000),
        "fetched_bytes": body.fetched_bytes,
    }
    if body.head:
        fields |= {"head": body.head, "bundle": body.bundle, "workspace": body.workspace}
    if body.score is not None:
        fields["score"] = body.score
    if body.error:
        fields["error"] = list(body.error)
    if body.inline_outputs:
        fields["inline_outputs"] = dict(body.inline_outputs)
    # every field with a default factory given, the ones unset among them outside `_fields_set`: pydantic calls
    # inspect.signature on a factory each time it fills one in (~7 % of the server's CPU in a drain, py-spy)
    return JobResult.model_construct(set(fields), **{"error": [], "inline_outputs": {}, **fields})


def as_report(body: ReportRequest, caller: Caller, seen: set[str]) -> Report:
    """What `report.lua` is told of a report: its outcome, and the result the job keeps."""
    names = named(body)
    outcome, reason = body.outcome, body.reason
    if outcome == "lost":
        # the worker lost the run (its shim died, the server had said the lease was lost, it was refused): lost for
        # its kind like a fenced run (an evaluation queued again, an agent worker_lost), never the job's end; only
        # the server's own verdict below (its CAS lacks the blobs) ends a job `lost`
        outcome = "fenced"
    if names:
        missing = sorted(set(names) - seen)
        if missing:
            # the job's results cannot be read back: it is lost, with the blobs it names
            outcome, reason = "lost", f"the CAS lacks {len(missing)} blob(s) the report names: {', '.join(missing[:5])}"
    return Report(
        body.report_id,
        body.job,
        body.token,
        caller.name,
        outcome,
        result_of(body),
        reason,
        body.oom,
        tuple(body.error),
        door.owner(caller),
    )
