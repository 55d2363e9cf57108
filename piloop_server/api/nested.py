"""Nested work: a job's own child jobs, through its worker's relay (`Client.from_env()` inside a job).

A job submits, shows, waits for and cancels the jobs it queued, and puts and reads the blobs they take and give,
with no operator rights: the worker names the job and its lease (api/relay.py), and each call is checked against
that lease. A child goes to the caller's own pool and campaign only (a request naming another pool is refused,
naming both), takes none of the caller's secrets but those the caller has, and is cancelled with its parent.
A blob is read only where it is an output or a log chunk of one of the caller's children, or an input of its own.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from piloop_common.cas.address import hash_bytes, parse_address
from piloop_common.errors import BadRequest, Forbidden, NotFound
from piloop_common.protocol.operator import JobView, SubmitRequest, SubmitResponse
from piloop_server import jobs
from piloop_server.api import wakeup
from piloop_server.api.deps import RuntimeDep
from piloop_server.api.relay import CallerDep, StateDep
from piloop_server.runtime import Runtime
from piloop_server.state.relay import RelayCaller

router = APIRouter(prefix="/v1/relay", tags=["relay"])
BLOB_MOST = 1024 * 1024  # what the relay forwards in one call


def _child(rt: Runtime, caller: RelayCaller, job_id: str) -> JobView:
    """The caller's child `job_id`; a job that does not exist and one that is not the caller's child get one answer,
    so a job cannot tell whether another job exists."""
    not_yours = NotFound(f"job {job_id} is not one job {caller.job} queued: a job reads and cancels its own children")
    if rt.jobs.field_of([jobs.check_id(job_id)], "parent") != [caller.job]:
        raise not_yours
    try:
        return jobs.view(rt, job_id)
    except NotFound:  # removed between the two reads
        raise not_yours from None


@router.post("/jobs", response_model=SubmitResponse)
def submit(body: SubmitRequest, rt: RuntimeDep, state: StateDep, caller: CallerDep, request: Request) -> SubmitResponse:
    """Queue a child job in the caller's own pool and campaign."""
    live = state.check(caller)
    if body.pool != live.pool:
        raise Forbidden(
            f"job {caller.job} runs in pool {live.pool}: the jobs it queues go to its own pool, not {body.pool}"
        )
    if body.kind != "evaluation":
        raise Forbidden(f"job {caller.job} may queue evaluations (tasks, commands), not {body.kind}s")
    if body.campaign not in ("", live.campaign):
        raise Forbidden(f"job {caller.job}'s children count for its own campaign {live.campaign or '(none)'} only")
    extra = sorted(set(body.spec.secrets) - set(live.spec.get("secrets") or []))
    if extra:
        raise Forbidden(f"job {caller.job} may give its children its own secrets only, not {', '.join(extra)}")
    req = body.model_copy(update={"campaign": live.campaign, "image": ""})
    jobs.check_submit(rt, req)
    job_id = jobs.new_id()
    rt.nested.submit(caller, job_id, req.kind, req.pool, req.spec.model_dump(mode="json"))
    wakeup.notify(request.app)
    return SubmitResponse(job=job_id)


@router.get("/jobs/{job_id}", response_model=JobView)
def show(job_id: str, rt: RuntimeDep, state: StateDep, caller: CallerDep) -> JobView:
    state.check(caller)
    return _child(rt, caller, job_id)


@router.post("/jobs/{job_id}/cancel")
def cancel(job_id: str, rt: RuntimeDep, state: StateDep, caller: CallerDep) -> dict[str, str]:
    v = _child(rt, caller, job_id)
    return {"state": rt.nested.cancel(caller, v.id, v.pool, v.kind)}


@router.get("/jobs/{job_id}/log/{n}")
def log_chunk(job_id: str, n: int, rt: RuntimeDep, state: StateDep, caller: CallerDep) -> Response:
    state.check(caller)
    chunks = _child(rt, caller, job_id).log
    if not 0 <= n < len(chunks):
        raise NotFound(f"job {job_id} has {len(chunks)} log chunk(s) so far: no chunk {n}", chunks=len(chunks))
    return Response(rt.store.get_bytes(chunks[n]), media_type="application/octet-stream")


@router.post("/blobs/{address}", status_code=201)
async def put_blob(
    address: str, rt: RuntimeDep, caller: CallerDep, state: StateDep, request: Request
) -> dict[str, str]:
    """Put a blob (a child's arguments) in the server's CAS, up to what the relay forwards."""
    address = parse_address(address)
    data = await request.body()
    if len(data) > BLOB_MOST:
        raise BadRequest(f"a blob put through the relay is at most {BLOB_MOST} bytes")
    if hash_bytes(data) != address:
        raise BadRequest(f"the body does not hash to {address}", address=address)
    state.check(caller)
    rt.store.put_bytes(data)
    return {"address": address}


@router.get("/blobs/{address}")
def get_blob(address: str, rt: RuntimeDep, state: StateDep, caller: CallerDep) -> Response:
    """A blob one of the caller's children took or gave (an input, an output), or one of the caller's own inputs
    (a child's log chunks are read by `log_chunk`)."""
    address = parse_address(address)
    live = state.check(caller)
    named = set((live.spec.get("inputs") or {}).values())
    kids = [j for j in rt.jobs.get_many(rt.nested.children(caller.job)) if j is not None and j.parent == caller.job]
    for j in kids:
        named |= set((j.result_dict().get("outputs") or {}).values()) | set(j.spec_dict().get("inputs", {}).values())
    if address not in named:
        raise Forbidden(f"{address}: a job reads the blobs of its own children and its own inputs only")
    return Response(rt.store.get_bytes(address), media_type="application/octet-stream")
