"""Jobs: submit, list, show, cancel."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response

from piloop_common.protocol.operator import JobView, SubmitRequest, SubmitResponse
from piloop_common.protocol.worker import SKIPPED_HEADER, JobState
from piloop_server import jobs
from piloop_server.api import shown, wakeup
from piloop_server.api.deps import OperatorDep, RuntimeDep, ViewerDep

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

MOST_LISTED = 5000


@router.post("", response_model=SubmitResponse)
def submit(body: SubmitRequest, rt: RuntimeDep, caller: OperatorDep, request: Request) -> SubmitResponse:
    job = jobs.submit(rt, body, caller.signed)
    wakeup.notify(request.app)
    return SubmitResponse(job=job)


@router.get("", response_model=list[JobView], response_class=Response)
def listing(
    rt: RuntimeDep,
    caller: ViewerDep,
    state: JobState | None = None,
    pool: str | None = None,
    limit: Annotated[int, Query(ge=1, le=MOST_LISTED)] = 200,
) -> Response:
    """The newest jobs; `x-piloop-skipped` counts the records skipped as unreadable (logged), the rest listed."""
    views, skipped = jobs.listing(rt, state, pool, limit)
    body = "[" + ",".join(shown.job(caller, v).model_dump_json() for v in views) + "]"
    return Response(body, media_type="application/json", headers={SKIPPED_HEADER: str(skipped)})


@router.get("/{job_id}", response_model=JobView)
def show(job_id: str, rt: RuntimeDep, caller: ViewerDep) -> JobView:
    v = jobs.view(rt, job_id)
    v.waiting = jobs.waiting(rt, v)  # here only: it reads every worker, which a listing of jobs would do per job
    return shown.job(caller, v)


@router.post("/{job_id}/cancel")
def cancel(job_id: str, rt: RuntimeDep, caller: OperatorDep) -> dict[str, str]:
    return {"state": rt.leases.cancel(jobs.check_id(job_id), caller.signed)}
