"""Annotated dependencies for the routers: each route takes one of them, and so one check of `auth.py`.

`WorkerDep` lets workers only; `ViewerDep`, `OperatorDep` and `AdminDep` a caller whose role reaches theirs.
`route_roles(app)` reads them back off the app: the table of docs/security.md, "Roles", and its tests.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.routing import APIRoute

from piloop_server.auth import Caller, Role, identify_async, require_role, require_worker
from piloop_server.runtime import Runtime

WORKER = "worker"  # what `route_roles` says of a worker route
_NEEDS: dict[Callable[..., Any], str] = {}  # each check below and whom it lets through, for `route_roles`


async def _runtime(request: Request) -> Runtime:
    rt: Runtime = request.app.state.runtime  # set by create_app
    return rt


# async: FastAPI would run a sync dependency in a thread of its own
async def _worker(request: Request) -> Caller:
    return require_worker(await identify_async(request))


_NEEDS[_worker] = WORKER


def _needs(role: Role) -> Callable[[Request], Awaitable[Caller]]:
    async def check(request: Request) -> Caller:
        return require_role(await identify_async(request), role, f"{request.method} {request.url.path}")

    _NEEDS[check] = role
    return check


RuntimeDep = Annotated[Runtime, Depends(_runtime)]
WorkerDep = Annotated[Caller, Depends(_worker)]
ViewerDep = Annotated[Caller, Depends(_needs(Role.VIEWER))]
OperatorDep = Annotated[Caller, Depends(_needs(Role.OPERATOR))]
AdminDep = Annotated[Caller, Depends(_needs(Role.ADMIN))]


def route_roles(app: Any) -> dict[tuple[str, str], str]:
    """Each (method, path) of `app` and what it needs (a role, or `worker`); a route that checks nothing is absent."""
    out: dict[tuple[str, str], str] = {}
    for route in routes_of(app.routes):
        needs = sorted({str(n) for n in _checks(route.dependant)})
        if needs:
            assert len(needs) == 1, (route.path, needs)  # one check a route, never two that disagree
            out.update({(m, route.path): needs[0] for m in route.methods or () if m != "HEAD"})
    return out


def routes_of(routes: Any) -> Iterator[APIRoute]:
    for r in routes:
        if hasattr(r, "original_router"):  # FastAPI ≥ 0.16x keeps included routers as they are
            yield from routes_of(r.original_router.routes)
        elif isinstance(r, APIRoute):
            yield r


def _checks(dependant: Any) -> Iterator[str]:
    for d in dependant.dependencies:
        if (needs := _NEEDS.get(d.call)) is not None:
            yield needs
        yield from _checks(d)
