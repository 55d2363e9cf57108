"""A job's own `piloop` calls, forwarded by its worker's relay while the job's lease is live.

The worker authenticates as itself (its token, or the daemon's socket) and names the job and the lease's
token in two headers. Every call is checked against the lease in the same Lua script that acts on it: a
token that no longer holds the lease, a lease held by another worker, or a cancelled job answers 409
`lease_lost` and changes nothing.

Every call a relay forwards carries its marker (`RELAY_MARKER_HEADER`); `RelayMarkerGuard` refuses the marker on any
route but these, so a relay that were tricked into forwarding elsewhere would still reach no worker or operator route.

A relayed submit trusts the lease, not the caller: the agent names a commit of its campaign's repo, and the
server queues that campaign's evaluation of it, built from the campaign record the lease's job points to.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request

from piloop_common.errors import BadRequest, Conflict, Forbidden, NotFound
from piloop_common.protocol.operator import JobView, ProgressNote, RelaySubmit, SubmitResponse
from piloop_common.protocol.worker import LEASE_TOKEN, RELAY_JOB_HEADER, RELAY_MARKER_HEADER, RELAY_TOKEN_HEADER
from piloop_server import campaign_repo, campaigns, jobs
from piloop_server.api import wakeup, worker_door
from piloop_server.api.answers import error_answer
from piloop_server.api.deps import RuntimeDep, WorkerDep
from piloop_server.runtime import Runtime
from piloop_server.state.relay import RelayCaller, RelayState

router = APIRouter(prefix="/v1/relay", tags=["relay"])
# a relay route's path as the router matches it: /v1/relay/ and segments that are none of "", ".", ".."
RELAY_PATH = re.compile(r"/v1/relay(?:/[A-Za-z0-9][A-Za-z0-9_.:-]*)+")
_MARKER = RELAY_MARKER_HEADER.encode()


class RelayMarkerGuard:
    """Refuse (403) a call that carries the relay's marker on any route but the relay's own. Plain ASGI, like
    app.BodyLimit: it runs before routing and authentication, on the path the router will match."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if (
            scope["type"] == "http"
            and not RELAY_PATH.fullmatch(scope["path"])
            and any(name == _MARKER for name, _ in scope["headers"])
        ):
            refused = Forbidden(
                f"{scope['path'][:200]!r} is not a relay route: a call a job's relay forwarded "
                f"({RELAY_MARKER_HEADER}) reaches /v1/relay/... only"
            )
            await error_answer(refused)(scope, receive, send)
            return
        await self.app(scope, receive, send)


def relay_state(request: Request) -> RelayState:
    rt: Runtime = request.app.state.runtime
    return rt.relay


def _caller(request: Request, worker: WorkerDep) -> RelayCaller:
    job, token = request.headers.get(RELAY_JOB_HEADER), request.headers.get(RELAY_TOKEN_HEADER)
    if not job or not token:
        raise BadRequest(f"a relayed call names its job and lease: {RELAY_JOB_HEADER}, {RELAY_TOKEN_HEADER}")
    if not re.fullmatch(LEASE_TOKEN, token):
        raise BadRequest(f"{RELAY_TOKEN_HEADER}: {token[:80]!r} is not a lease token")
    return RelayCaller(jobs.check_id(job), token, worker.name, owner=worker_door.owner(worker))


StateDep = Annotated[RelayState, Depends(relay_state)]
CallerDep = Annotated[RelayCaller, Depends(_caller)]


@router.get("/job", response_model=JobView)
def own_job(rt: RuntimeDep, state: StateDep, caller: CallerDep) -> JobView:
    """The job's own view (`piloop job show` inside it)."""
    state.check(caller)
    return jobs.view(rt, caller.job)


@router.post("/progress")
def progress(body: ProgressNote, state: StateDep, caller: CallerDep) -> dict[str, int]:
    """A short note appended to the job, shown by `piloop job show`."""
    return {"notes": state.progress(caller, body.note.strip() or body.note)}


@router.post("/submit", response_model=SubmitResponse)
def submit(body: RelaySubmit, rt: RuntimeDep, state: StateDep, caller: CallerDep, request: Request) -> SubmitResponse:
    """A campaign's agent queues its campaign's evaluation of one commit, signed `worker:<name>/job:<id>`.

    Everything but the commit comes from the campaign record: its eval pool, eval spec and bundle; the run is the
    agent's own. Asking twice for one commit answers the same job."""
    live = state.check(caller)
    if live.kind != "agent":
        raise Forbidden(
            f"job {caller.job} is an evaluation: only a campaign's agent may submit (an evaluation that "
            "queues evaluations could loop forever)"
        )
    if not live.campaign:
        raise Forbidden(
            f"job {caller.job} is an agent of no campaign: only a campaign's agent may submit, and only "
            "its campaign's evaluation of a commit"
        )
    name = live.campaign
    try:
        rec = campaigns.record(rt, name)
    except NotFound:
        raise Forbidden(
            f"job {caller.job}'s campaign {name} is not a campaign (removed, or a label given by hand): "
            "only a campaign's agent may submit"
        ) from None
    pool = rec.eval_pool
    if pool not in rt.executor.pools:
        raise Conflict(f"campaign {name}'s eval pool {pool} is not a pool of this server's config")
    commit = campaign_repo.repo_commit(rt, name, body.commit)
    spec = campaigns.evaluation_spec(rec, commit, run=caller.job)
    job_id = campaigns.relayed_eval_id(caller.job, commit)
    if state.submit_evaluation(caller, job_id, pool, spec.model_dump(mode="json", exclude_none=True), campaign=name):
        wakeup.notify(request.app)
    return SubmitResponse(job=job_id)
