"""Annotated dependencies for the routers."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from piloop_server.auth import Caller, identify_async, require_act, require_operator, require_worker
from piloop_server.runtime import Runtime


async def _runtime(request: Request) -> Runtime:
    return request.app.state.runtime


# async: FastAPI would run a sync dependency in a thread of its own
async def _worker(request: Request) -> Caller:
    return require_worker(await identify_async(request))


async def _actor(request: Request) -> Caller:
    return require_act(await identify_async(request))


async def _operator(request: Request) -> Caller:
    return require_operator(await identify_async(request), f"{request.method} {request.url.path}")


RuntimeDep = Annotated[Runtime, Depends(_runtime)]
WorkerDep = Annotated[Caller, Depends(_worker)]
ActorDep = Annotated[Caller, Depends(_actor)]
OperatorDep = Annotated[Caller, Depends(_operator)]
