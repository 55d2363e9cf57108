"""Annotated dependencies for the routers."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from piloop_server.auth import Caller, identify, require_act, require_worker
from piloop_server.runtime import Runtime


async def _runtime(request: Request) -> Runtime:
    return request.app.state.runtime


def _worker(request: Request) -> Caller:
    return require_worker(identify(request))


def _actor(request: Request) -> Caller:
    return require_act(identify(request))


RuntimeDep = Annotated[Runtime, Depends(_runtime)]
WorkerDep = Annotated[Caller, Depends(_worker)]
ActorDep = Annotated[Caller, Depends(_actor)]
