"""A job's own `piloop` calls, forwarded by its worker's relay while the job's lease is live.

The worker authenticates as itself (its token, or the daemon's socket) and names the job and the lease's
token in two headers. Every call is checked against the lease in the same Lua script that acts on it: a
token that no longer holds the lease, a lease held by another worker, or a cancelled job answers 409
`lease_lost` and changes nothing.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request

from piloop_common.errors import BadRequest, Forbidden
from piloop_common.protocol import (
    RELAY_JOB_HEADER, RELAY_TOKEN_HEADER, JobView, ProgressNote, SubmitRequest, SubmitResponse,
)
from piloop_server import jobs
from piloop_server.api import wakeup
from piloop_server.api.deps import RuntimeDep, WorkerDep
from piloop_server.runtime import Runtime
from piloop_server.state.relay import Caller, RelayState

router = APIRouter(prefix="/v1/relay", tags=["relay"])


def relay_state(request: Request) -> RelayState:
    app = request.app
    state = getattr(app.state, "relay_state", None)
    if state is None:  # one per app, so the scripts' SHAs are loaded once
        rt: Runtime = app.state.runtime
        state = app.state.relay_state = RelayState(rt.redis, rt.keys)
    return state


def _caller(request: Request, worker: WorkerDep) -> Caller:
    job, token = request.headers.get(RELAY_JOB_HEADER), request.headers.get(RELAY_TOKEN_HEADER)
    if not job or not token:
        raise BadRequest(f"a relayed call names its job and lease: {RELAY_JOB_HEADER}, {RELAY_TOKEN_HEADER}")
    return Caller(job, token, worker.name)


StateDep = Annotated[RelayState, Depends(relay_state)]
CallerDep = Annotated[Caller, Depends(_caller)]


@router.get("/job", response_model=JobView)
def own_job(rt: RuntimeDep, state: StateDep, caller: CallerDep) -> JobView:
    """The job's own view (`piloop job show` inside it)."""
    state.check(caller)
    return jobs.view(rt, caller.job)


@router.post("/progress")
def progress(body: ProgressNote, state: StateDep, caller: CallerDep) -> dict:
    """A short note appended to the job, shown by `piloop job show`."""
    return {"notes": state.progress(caller, body.note.strip() or body.note)}


@router.post("/submit", response_model=SubmitResponse)
def submit(body: SubmitRequest, rt: RuntimeDep, state: StateDep, caller: CallerDep, request: Request) -> SubmitResponse:
    """An agent queues an evaluation in its own campaign, signed `worker:<name>/job:<id>`."""
    live = state.check(caller)
    if live.kind != "agent":
        raise Forbidden("only an agent may submit jobs from inside itself (an evaluation that queues "
                        "evaluations could loop forever)")
    if body.kind != "evaluation":
        raise Forbidden("an agent may submit evaluations only")
    campaign = body.campaign or live.campaign
    if campaign != live.campaign:
        raise Forbidden(f"an agent submits only in its own campaign ({live.campaign or 'none'}), not {campaign}")
    if body.pool not in rt.executor.pools:
        raise BadRequest(f"--pool {body.pool}: no such pool (pools: {', '.join(sorted(rt.executor.pools))})")
    given = set(live.spec.get("secrets") or [])
    extra = sorted(set(body.spec.secrets) - given)
    if extra:
        raise Forbidden(f"--secret: a job passes on only the secrets it was given, not {', '.join(extra)}")
    addrs = list(body.spec.inputs.values())
    missing = sorted(set(addrs) - rt.store.has_many(addrs)) if addrs else []
    if missing:
        raise BadRequest(f"--input: the CAS lacks {', '.join(missing)}")
    job_id = jobs.new_id()
    state.submit(caller, job_id, body.kind, body.pool, body.spec.model_dump(mode="json"), campaign=campaign,
                 image=body.image)
    wakeup.notify(request.app)
    return SubmitResponse(job=job_id)
