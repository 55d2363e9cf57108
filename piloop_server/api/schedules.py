"""Periodic schedules: add, list, remove (`piloop schedule …`, `Client.schedule`)."""

from __future__ import annotations

from fastapi import APIRouter, Response

from piloop_common.protocol.schedule import ScheduleRequest, ScheduleView
from piloop_common.protocol.worker import SKIPPED_HEADER
from piloop_server import schedules
from piloop_server.api.deps import OperatorDep, RuntimeDep, ViewerDep

router = APIRouter(prefix="/v1/schedules", tags=["schedules"])


@router.post("", response_model=ScheduleView)
def add(body: ScheduleRequest, rt: RuntimeDep, caller: OperatorDep) -> ScheduleView:
    return schedules.add(rt, body, caller.signed)


@router.get("", response_model=list[ScheduleView])
def listing(rt: RuntimeDep, caller: ViewerDep, response: Response) -> list[ScheduleView]:
    views, skipped = schedules.listing(rt)
    response.headers[SKIPPED_HEADER] = str(skipped)  # records that cannot be read, skipped (and logged)
    return views


@router.delete("/{name}")
def remove(name: str, rt: RuntimeDep, caller: OperatorDep) -> dict[str, str]:
    schedules.remove(rt, name, caller.signed)
    return {"removed": name}
