"""Campaigns: create, list, show, pause, resume, remove; and a worker's fetch of what is newer in a repo."""

from __future__ import annotations

from fastapi import APIRouter, Request

from piloop_common.errors import BadRequest, Refused
from piloop_common.protocol.campaign import BundleRequest, BundleResponse, CampaignCreate, CampaignView
from piloop_common.protocol.worker import PROTOCOL
from piloop_server import campaign_admin, campaign_repo
from piloop_server.api import wakeup
from piloop_server.api.deps import OperatorDep, RuntimeDep, ViewerDep, WorkerDep
from piloop_server.api.relay import relay_state
from piloop_server.api.worker_door import owner as worker_owner
from piloop_server.auth import require_host_files
from piloop_server.state.relay import RelayCaller

router = APIRouter(prefix="/v1/campaigns", tags=["campaigns"])
worker_router = APIRouter(prefix="/v1/worker", tags=["worker"])


@router.post("", response_model=CampaignView)
def create(body: CampaignCreate, rt: RuntimeDep, caller: OperatorDep, request: Request) -> CampaignView:
    require_host_files(caller, campaign_admin.host_paths(body))
    out = campaign_admin.create(rt, body, caller.signed)
    wakeup.notify(request.app)
    return out


@router.get("", response_model=list[CampaignView])
def listing(rt: RuntimeDep, caller: ViewerDep) -> list[CampaignView]:
    return [campaign_admin.view(rt, n, runs=False) for n in campaign_admin.names(rt)]


@router.get("/{name}", response_model=CampaignView)
def show(name: str, rt: RuntimeDep, caller: ViewerDep) -> CampaignView:
    return campaign_admin.view(rt, name)


@router.post("/{name}/pause", response_model=CampaignView)
def pause(name: str, rt: RuntimeDep, caller: OperatorDep) -> CampaignView:
    return campaign_admin.set_state(rt, name, "paused", caller.signed)


@router.post("/{name}/resume", response_model=CampaignView)
def resume(name: str, rt: RuntimeDep, caller: OperatorDep) -> CampaignView:
    return campaign_admin.set_state(rt, name, "active", caller.signed)


@router.delete("/{name}")
def remove(name: str, rt: RuntimeDep, caller: OperatorDep, force: bool = False) -> dict[str, list[str]]:
    return {"cancelled": campaign_admin.remove(rt, name, caller.signed, force)}


@worker_router.post("/bundle", response_model=BundleResponse)
def bundle(body: BundleRequest, rt: RuntimeDep, caller: WorkerDep, request: Request) -> BundleResponse:
    """What is newer in the repo of the campaign of a job this worker holds, than the commits it names."""
    if body.protocol != PROTOCOL:
        raise Refused(f"the server speaks piloop protocol {PROTOCOL}, this worker {body.protocol}")
    live = relay_state(request).check(
        RelayCaller(body.job, body.token, caller.name, worker_owner(caller))
    )  # the lease must be live: else LeaseLost
    if not live.campaign:
        raise BadRequest(f"job {body.job} is not a campaign's")
    return campaign_repo.newer_bundle(rt, live.campaign, body.have)
