"""The worker's routes: register, heartbeat, claim, release, report, log. Every mutation names its token."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from piloop_common.errors import NotFound, PiloopError, Refused
from piloop_common.protocol.report import (
    LogAnswer,
    LogAppend,
    ReportAnswer,
    ReportRequest,
    ReportResponse,
    ReportsRequest,
    ReportsResponse,
)
from piloop_common.protocol.worker import (
    Assignment,
    ClaimRequest,
    ClaimResponse,
    HeartbeatResponse,
    HostSample,
    JobSpec,
    RegisterRequest,
    RegisterResponse,
    ReleaseRequest,
    Timing,
    WorkerHello,
)
from piloop_server import pools
from piloop_server.api import wakeup
from piloop_server.api import worker_door as door
from piloop_server.api.deps import RuntimeDep, WorkerDep
from piloop_server.auth import Caller
from piloop_server.metrics import Metrics
from piloop_server.runtime import Runtime
from piloop_server.state.records.lease import KINDS, Lease, Report

router = APIRouter(prefix="/v1/worker", tags=["worker"])
logger = logging.getLogger("piloop.worker_api")
EMPTY = b"{}"


def _json(answer: BaseModel | None = None) -> Response:
    """The answer as its model writes it: built valid, so FastAPI's second validation and encoding (in a thread, for
    a sync route) are skipped. `response_model` still gives the schema."""
    return Response(answer.model_dump_json() if answer is not None else EMPTY, media_type="application/json")


def _timing(rt: Runtime, pool_name: str) -> Timing:
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


def _sample(hello: WorkerHello) -> dict[str, Any]:
    return {**hello.sample.model_dump(), "admission": hello.admission}


@router.post("/register", response_model=RegisterResponse)
def register(body: RegisterRequest, rt: RuntimeDep, caller: WorkerDep) -> Response:
    door.check(rt, caller, body)
    door.own_name(rt, caller)
    door.check_sizes(rt, body)
    name = caller.name
    info = {
        **body.info,
        "token": caller.token.name if caller.token else "",
        "via": "socket" if caller.via_socket else "tcp",
    }
    tok = caller.token
    rt.leases.register(
        name,
        body.pool,
        body.image,
        body.cas_id,
        _sample(body),
        protocol=body.protocol,
        by=f"worker:{name}",
        info=info,
        owner=door.owner(caller),
        names_of=tok.name if tok is not None and tok.rename else "",
        names_most=rt.settings.plugins.state.worker_names_max,
    )
    held = [Lease(j.job, j.token) for j in body.jobs]
    _, statuses = rt.leases.heartbeat(name, _sample(body), held, door.owner(caller))
    return _json(RegisterResponse(worker=name, timing=_timing(rt, body.pool), jobs=statuses))


@router.post("/heartbeat", response_model=HeartbeatResponse)
def heartbeat(body: WorkerHello, rt: RuntimeDep, caller: WorkerDep, request: Request) -> Response:
    with _metrics(request).timed("heartbeat"):
        return _json(_beat(body, rt, caller))


def _metrics(request: Request) -> Metrics:
    metrics: Metrics = request.app.state.metrics  # set by create_app
    return metrics


def _beat(body: WorkerHello, rt: Runtime, caller: Caller) -> HeartbeatResponse:
    door.check(rt, caller, body)
    held = [Lease(j.job, j.token) for j in body.jobs]
    _, statuses = rt.leases.heartbeat(caller.name, _sample(body), held, door.owner(caller))
    return HeartbeatResponse(jobs=statuses, timing=_timing(rt, body.pool))


@router.post("/claim", response_model=ClaimResponse)
async def claim(body: ClaimRequest, rt: RuntimeDep, caller: WorkerDep, request: Request) -> Response:
    """Lease jobs; with nothing queued and `wait_seconds`, wait for a submit (a long poll) and look again."""
    door.check(rt, caller, body)
    door.check_want(rt, body)
    wake = wakeup.of(request.app)
    end = time.monotonic() + body.wait_seconds
    while True:
        # a worker that gave up on this call (its timeout passed, or the server was paused with the call in its
        # backlog) never hears of a lease taken for it: the job would wait for that lease to expire, counted lost
        if await request.is_disconnected():
            return _json(ClaimResponse(reason="nothing"))
        event = wake.current()  # before looking: a job queued meanwhile sets it
        resp = await _claim_for(body, rt, caller, request)
        left = end - time.monotonic()
        if resp.leases or resp.reason != "nothing" or left <= 0 or wake.closing:
            return _json(resp)
        try:
            await asyncio.wait_for(event.wait(), left)
            if wake.closing:
                return _json(ClaimResponse(reason="nothing"))
        except TimeoutError:
            if await request.is_disconnected():
                return _json(ClaimResponse(reason="nothing"))
            return _json(await _claim_for(body, rt, caller, request))


async def _claim_for(body: ClaimRequest, rt: Runtime, caller: Caller, request: Request) -> ClaimResponse:
    """`_claim`, and the leases given back at once should the caller be gone by then. The check before a claim can
    miss a caller that gave up: with its token known without a thread hop, the handler may run before the event loop
    has read the connection's end (a server resumed after a pause, its backlog stale); the claim's own hop lets it."""
    m = _metrics(request)
    with m.timed("claim"):
        resp = await run_in_threadpool(_claim, body, rt, caller)
    if resp.leases and await request.is_disconnected():
        await run_in_threadpool(_give_back, rt, caller, resp.leases)
        wakeup.notify(request.app)
        return ClaimResponse(reason="nothing")
    for a in resp.leases:
        m.leases_granted.labels(m.pool(a.pool), a.kind).inc()
    return resp


def _give_back(rt: Runtime, caller: Caller, leases: list[Assignment]) -> None:
    for a in leases:
        rt.leases.release(
            a.job, a.token, caller.name, "the worker was gone before it heard of the lease", owner=door.owner(caller)
        )


def _claim(body: ClaimRequest, rt: Runtime, caller: Caller) -> ClaimResponse:
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
    timing = _timing(rt, pool_name) if leases else None
    return ClaimResponse(leases=_assignments(rt, leases), reason=reason, timing=timing)


def _assignments(rt: Runtime, leases: list[Lease]) -> list[Assignment]:
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


@router.post("/release", response_model=dict)
def release(body: ReleaseRequest, rt: RuntimeDep, caller: WorkerDep, request: Request) -> Response:
    door.check(rt, caller, body)
    rt.leases.release(body.job, body.token, caller.name, body.reason, owner=door.owner(caller))
    wakeup.notify(request.app)
    return _json()


@router.post("/report", response_model=ReportResponse)
def report(body: ReportRequest, rt: RuntimeDep, caller: WorkerDep, request: Request) -> Response:
    door.check(rt, caller, body)
    m = _metrics(request)
    with m.timed("report"):
        resp = _report(body, rt, caller, _present(rt, [body]))
    m.report(body.outcome, resp.answer)
    m.fetched_bytes.inc(body.fetched_bytes)
    if resp.state == "queued":
        wakeup.notify(request.app)
    return _json(resp)


@router.post("/reports", response_model=ReportsResponse)
async def reports(body: ReportsRequest, rt: RuntimeDep, caller: WorkerDep, request: Request) -> Response:
    """Several reports in one call, each answered on its own: one refused (a bad report) leaves the others be; then
    the claim the call carries, if any, into the slots they freed (one round trip a round for a busy worker)."""
    door.check(rt, caller, body)
    m = _metrics(request)
    with m.timed("report"):
        answers, wake = await run_in_threadpool(_reports, body, rt, caller)
    for one, a in zip(body.reports, answers, strict=True):
        m.report(one.outcome, a.answer or "")
        m.fetched_bytes.inc(one.fetched_bytes)
    if wake:
        wakeup.notify(request.app)
    got = None
    if body.claim is not None:
        try:
            door.check(rt, caller, body.claim)
            door.check_want(rt, body.claim)
            got = await _claim_for(body.claim.model_copy(update={"wait_seconds": 0}), rt, caller, request)
        except Refused:
            raise  # the worker's, as for a claim alone
        except PiloopError:
            pass  # the reports stand (`claim: null`); the worker's own claim next hears what is wrong
    return _json(ReportsResponse(answers=answers, claim=got))


def _reports(body: ReportsRequest, rt: Runtime, caller: Caller) -> tuple[list[ReportAnswer], bool]:
    """Each report checked, then all of them run in one batch (`LeasesState.report_many`): two round trips to Redis for
    the call, not two a report."""
    present = _present(rt, body.reports)
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
        batch.append(_as_report(one, caller, present))
        at.append(i)
    wake = False
    for i, got in zip(at, rt.leases.report_many(batch, _memory_caps(rt), rt.store.sizes) if batch else [], strict=True):
        if isinstance(got, PiloopError):
            answers[i] = ReportAnswer(error=got.code, message=got.message)
            continue
        resp = ReportResponse.model_validate(got)
        wake = wake or resp.state == "queued"
        answers[i] = ReportAnswer(answer=resp.answer, state=resp.state)
    given = [a for a in answers if a is not None]
    assert len(given) == len(answers), "every report has its answer, in order"
    return given, wake


def _named(body: ReportRequest) -> list[str]:
    return [*body.log, *body.outputs.values(), *(a for a in (body.metrics, body.bundle, body.workspace) if a)]


def _present(rt: Runtime, bodies: list[ReportRequest]) -> set[str]:
    """Which of the blobs these reports name the CAS has: one lookup for all of them."""
    named = sorted({a for b in bodies for a in _named(b)})
    # Not merged with report_many's `sizes`: has_many is one batched call (an S3 listing, one http POST) where sizes
    # is a HEAD an address, and sizes asks only the few a cap needs (log chunks unsized at their append, a result).
    return set(rt.store.has_many(named)) if named else set()


def _memory_caps(rt: Runtime) -> dict[str, int | None]:
    return {p: c.memory_max_mb for p, c in rt.executor.pools.items()}


def _as_report(body: ReportRequest, caller: Caller, present: set[str]) -> Report:
    """What `report.lua` is told of a report: its outcome, and the result the job keeps."""
    named = _named(body)
    outcome, reason = body.outcome, body.reason
    if outcome == "lost":
        # the worker lost the run (its shim died, the server had said the lease was lost, it was refused): lost for
        # its kind like a fenced run (an evaluation queued again, an agent worker_lost), never the job's end; only
        # the server's own verdict below (its CAS lacks the blobs) ends a job `lost`
        outcome = "fenced"
    if named:
        missing = sorted(set(named) - present)
        if missing:
            # the job's results cannot be read back: it is lost, with the blobs it names
            outcome, reason = "lost", f"the CAS lacks {len(missing)} blob(s) the report names: {', '.join(missing[:5])}"
    result = {
        "exit_code": body.exit_code,
        "signal": body.signal,
        "oom": body.oom,
        "usage": body.usage.model_dump(),
        "log": body.log,
        "outputs": body.outputs,
        "metrics": body.metrics,
        "duration_seconds": body.duration_seconds,
        "outcome": body.outcome,
        "at_ms": int(time.time() * 1000),
        "fetched_bytes": body.fetched_bytes,
    }
    if body.head:
        result |= {"head": body.head, "bundle": body.bundle, "workspace": body.workspace}
    if body.score is not None:
        result["score"] = body.score
    if body.error:
        result["error"] = body.error
    return Report(
        body.report_id,
        body.job,
        body.token,
        caller.name,
        outcome,
        result,
        reason,
        body.oom,
        tuple(body.error),
        door.owner(caller),
    )


def _report(body: ReportRequest, rt: Runtime, caller: Caller, present: set[str]) -> ReportResponse:
    r = _as_report(body, caller, present)
    answer = rt.leases.report(
        r.report_id,
        r.job,
        r.token,
        r.worker,
        r.outcome,
        r.result,
        r.reason,
        oom=r.oom,
        memory_caps=_memory_caps(rt),
        sizes=rt.store.sizes,
        owner=r.owner,
    )
    return ReportResponse.model_validate(answer)


@router.post("/log", response_model=LogAnswer)
def log(body: LogAppend, rt: RuntimeDep, caller: WorkerDep) -> Response:
    door.check(rt, caller, body)
    dropped = rt.leases.append_log(body.job, body.token, caller.name, body.chunks, rt.store.sizes, door.owner(caller))
    return _json(LogAnswer(dropped=dropped))
