"""The worker's routes: register, heartbeat, claim, release, report, log. Every mutation names its token."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from piloop_common.errors import PiloopError, Refused
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
    ClaimRequest,
    ClaimResponse,
    HeartbeatResponse,
    RegisterRequest,
    RegisterResponse,
    ReleaseRequest,
    WorkerHello,
)
from piloop_server import leasing
from piloop_server.api import wakeup
from piloop_server.api import worker_door as door
from piloop_server.api.deps import RuntimeDep, WorkerDep
from piloop_server.auth import Caller
from piloop_server.metrics import Metrics
from piloop_server.runtime import Runtime
from piloop_server.state.records.lease import Lease

router = APIRouter(prefix="/v1/worker", tags=["worker"])
logger = logging.getLogger("piloop.worker_api")
EMPTY = b"{}"


def _json(answer: BaseModel | None = None) -> Response:
    """The answer as its model writes it: built valid, so FastAPI's second validation and encoding (in a thread, for
    a sync route) are skipped. `response_model` still gives the schema."""
    return Response(answer.model_dump_json() if answer is not None else EMPTY, media_type="application/json")


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
    return _json(RegisterResponse(worker=name, timing=leasing.timing(rt, body.pool), jobs=statuses))


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
    return HeartbeatResponse(jobs=statuses, timing=leasing.timing(rt, body.pool))


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
    """`_claim` in a thread, then `_delivered`."""
    with _metrics(request).timed("claim"):
        resp = await run_in_threadpool(leasing.claim, body, rt, caller)
    return await _delivered(resp, rt, caller, request)


async def _delivered(resp: ClaimResponse, rt: Runtime, caller: Caller, request: Request) -> ClaimResponse:
    """The claim's answer, and its leases given back at once should the caller be gone by then. The check before a
    claim can miss a caller that gave up: with its token known without a thread hop, the handler may run before the
    event loop has read the connection's end (a server resumed after a pause, its backlog stale); the claim's own
    hop lets it."""
    if resp.leases and await request.is_disconnected():
        await run_in_threadpool(leasing.give_back, rt, caller, resp.leases)
        wakeup.notify(request.app)
        return ClaimResponse(reason="nothing")
    m = _metrics(request)
    for a in resp.leases:
        m.leases_granted.labels(m.pool(a.pool), a.kind).inc()
    return resp


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
        resp = leasing.report(body, rt, caller)
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
    answers, got = await run_in_threadpool(_reports_then_claim, body, rt, caller, request)
    if got is not None:
        got = await _delivered(got, rt, caller, request)
    return _json(ReportsResponse(answers=answers, claim=got))


def _reports_then_claim(
    body: ReportsRequest, rt: Runtime, caller: Caller, request: Request
) -> tuple[list[ReportAnswer], ClaimResponse | None]:
    """The reports, then the claim the call carries, in one thread hop rather than one each (each hop is a handoff
    of the GIL both ways between the loop and a pool thread)."""
    m = _metrics(request)
    with m.timed("report"):
        answers, wake = leasing.reports(body, rt, caller)
    for one, a in zip(body.reports, answers, strict=True):
        m.report(one.outcome, a.answer or "")
        m.fetched_bytes.inc(one.fetched_bytes)
    if wake:
        wakeup.notify(request.app)
    if body.claim is None:
        return answers, None
    try:
        door.check(rt, caller, body.claim)
        door.check_want(rt, body.claim)
        with m.timed("claim"):
            return answers, leasing.claim(body.claim.model_copy(update={"wait_seconds": 0}), rt, caller)
    except Refused:
        raise  # the worker's, as for a claim alone
    except PiloopError:
        return answers, None  # the reports stand (`claim: null`); the worker's own claim next hears what is wrong


@router.post("/log", response_model=LogAnswer)
def log(body: LogAppend, rt: RuntimeDep, caller: WorkerDep) -> Response:
    door.check(rt, caller, body)
    dropped = rt.leases.append_log(body.job, body.token, caller.name, body.chunks, rt.store.sizes, door.owner(caller))
    return _json(LogAnswer(dropped=dropped))
