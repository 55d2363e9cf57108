"""Who is calling: a human on the unix socket, a worker with a token (or the socket's header), or a caller
named by the proxy's claims on the proxy network (`network/proxy.py`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from fastapi import Request
from starlette.concurrency import run_in_threadpool

from piloop_common.errors import Forbidden, Refused, Unauthorized
from piloop_server.network.proxy import identify_proxy
from piloop_server.tokens import TokenRecord

if TYPE_CHECKING:
    from piloop_server.runtime import Runtime

SOCKET_SCOPE = "piloop.socket"


@dataclass(frozen=True)
class Caller:
    kind: str  # human | service | worker
    name: str
    via_socket: bool
    token: TokenRecord | None = None

    @property
    def signed(self) -> str:
        return f"{self.kind}:{self.name}"


def identify(request: Request) -> Caller:
    # with `read`, a token not known here is read from Redis: a caller or an error, never None
    return cast(Caller, _identify(request.app.state.runtime, request.scope, request.headers, read=True))


def known(rt: Runtime, scope: Mapping[str, Any], headers: Mapping[str, str]) -> Caller | None:
    """`identify` from a request's scope and headers when it needs no Redis read (the socket, the proxy network, a
    token the server verified moments ago); None when it would read Redis."""
    return _identify(rt, scope, headers, read=False)


def _identify(rt: Runtime, scope: Mapping[str, Any], headers: Mapping[str, str], *, read: bool) -> Caller | None:
    if scope.get(SOCKET_SCOPE):
        # the socket is 0600: whoever reaches it is the daemon's user
        worker = headers.get("x-piloop-worker")
        if worker:
            return Caller("worker", worker, True)
        return Caller("human", rt.user, True)
    net = rt.settings.plugins.network
    if net.provider == "proxy":
        # the proxy in front authenticated the caller and stamped its claims: they are the only check
        who = identify_proxy(headers, net)
        return Caller(who.kind, who.name, False)
    auth = headers.get("authorization", "")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise Unauthorized("a piloop token is needed: `Authorization: Bearer plt_…` (PILOOP_HTTPS_TOKEN on a worker)")
    rec = rt.tokens.check(token.strip()) if read else rt.tokens.known(token.strip())
    if rec is None:
        return None
    named = headers.get("x-piloop-worker")
    if named and named != rec.name:
        if not rec.rename:
            raise Refused(f"token {rec.name} does not let a worker choose its name (`piloop token create --rename`)")
        return Caller("worker", named, False, rec)
    return Caller("worker", rec.name, False, rec)


async def identify_async(request: Request) -> Caller:
    """`identify` on the event loop when it needs no Redis read (the socket, the proxy network, a token the server
    verified moments ago), else in a thread: a worker's call then takes one thread hop, its handler's."""
    caller = known(request.app.state.runtime, request.scope, request.headers)
    return caller if caller is not None else await run_in_threadpool(identify, request)


def require_worker(caller: Caller) -> Caller:
    if caller.kind != "worker":
        raise Forbidden("this route is for workers")
    return caller


def require_act(caller: Caller) -> Caller:
    if caller.kind == "worker":
        raise Forbidden("workers can only register, heartbeat, claim, report, release and log")
    return caller
