"""Who is calling and what they may do: a human on the unix socket (admin), a worker with a token (or the socket's
header), a person or program with a role token, or a caller named by the proxy's claims on the proxy network
(`network/proxy.py`). Every route's check is one of the `require_*` functions here."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, cast

from fastapi import Request
from starlette.concurrency import run_in_threadpool

from piloop_common.errors import BadRequest, Forbidden, Refused, Unauthorized
from piloop_common.names import check_name
from piloop_common.protocol.worker import RELAY_JOB_HEADER, RELAY_TOKEN_HEADER
from piloop_server.network.proxy import WORKER_HEADER, identify_proxy
from piloop_server.state.records.token import Token
from piloop_server.ui import sessions as ui_sessions

if TYPE_CHECKING:
    from piloop_server.runtime import Runtime

SOCKET_SCOPE = "piloop.socket"
# the headers that say who calls and for which lease: each once, or the caller's answer would hang on which copy
# a proxy in front read and which one the server reads
CLAIM_HEADERS = ("authorization", WORKER_HEADER, RELAY_JOB_HEADER, RELAY_TOKEN_HEADER)


class Role(StrEnum):
    """What a person or program may do, each role all that the one below it may: viewer < operator < admin."""

    VIEWER = "viewer"  # reads: status, lists, shows, logs, events
    OPERATOR = "operator"  # also submits and cancels jobs, runs campaigns, acknowledges escalations
    ADMIN = "admin"  # also sets limits, tokens and secrets

    def reaches(self, need: Role) -> bool:
        return ROLE_ORDER.index(self) >= ROLE_ORDER.index(need)


ROLE_ORDER = (Role.VIEWER, Role.OPERATOR, Role.ADMIN)


@dataclass(frozen=True)
class Caller:
    kind: str  # human | service | token | worker
    name: str
    via_socket: bool
    token: Token | None = None
    role: Role | None = None  # None for a worker, which has no role: only the worker routes take it

    @property
    def signed(self) -> str:
        return f"{self.kind}:{self.name}"

    @property
    def shown(self) -> str:
        """The caller as a refusal names it: its token's name where it has one."""
        if self.token is not None:
            return f"token {self.token.name}"
        return "the unix socket" if self.via_socket and self.kind != "worker" else f"{self.kind}:{self.name}"


def identify(request: Request) -> Caller:
    # with `read`, a token not known here is read from Redis: a caller or an error, never None
    return cast(Caller, _identify(request.app.state.runtime, request.scope, request.headers, read=True))


def known(rt: Runtime, scope: Mapping[str, Any], headers: Mapping[str, str]) -> Caller | None:
    """`identify` from a request's scope and headers when it needs no Redis read (the socket, the proxy network, a
    token the server verified moments ago); None when it would read Redis."""
    return _identify(rt, scope, headers, read=False)


def _once(rt: Runtime, headers: Mapping[str, str]) -> None:
    """BadRequest when a claim header (the proxy network's claims too) comes more than once."""
    getlist = getattr(headers, "getlist", None)
    if getlist is None:  # a plain mapping holds each name once
        return
    net = rt.settings.plugins.network
    names = (*CLAIM_HEADERS, *(h.lower() for h in net.claims.values())) if net.provider == "proxy" else CLAIM_HEADERS
    for name in names:
        if (n := len(getlist(name))) > 1:
            raise BadRequest(f"the header {name} comes {n} times: a request names its caller and its lease once")


def _identify(rt: Runtime, scope: Mapping[str, Any], headers: Mapping[str, str], *, read: bool) -> Caller | None:
    _once(rt, headers)
    if scope.get(SOCKET_SCOPE):
        # the socket is 0600: whoever reaches it is the daemon's user
        worker = headers.get("x-piloop-worker")
        if worker is not None:  # present but empty is a bad name, not the human's call
            # the daemon's own `serve` worker comes this way: the reserved names are its
            return Caller("worker", _worker_name(worker, reserved_ok=True), True)
        return Caller("human", rt.user, True, role=Role.ADMIN)
    if "authorization" not in headers and (sid := ui_sessions.cookie(headers, ui_sessions.SESSION_COOKIE)):
        return session_caller(rt, sid) if read else None
    net = rt.settings.plugins.network
    if net.provider == "proxy":
        # the proxy in front authenticated the caller and stamped its claims: they are the only check
        who = identify_proxy(headers, net)
        if who.kind == "worker":
            return Caller("worker", _worker_name(who.name), False)
        return Caller(who.kind, who.name, False, role=Role(who.role))
    auth = headers.get("authorization", "")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise Unauthorized(
            "a piloop token is needed: `Authorization: Bearer plt_…` (PILOOP_TOKEN or --token-file for the CLI, "
            "PILOOP_HTTPS_TOKEN on a worker)"
        )
    rec = rt.tokens.check(token.strip()) if read else rt.tokens.known(token.strip())
    if rec is None:
        return None
    if rec.role is not None:
        # a role token is a person's or a program's, never a worker's: an x-piloop-worker it sends is ignored
        return Caller("token", rec.name, False, rec, Role(rec.role))
    named = headers.get("x-piloop-worker")
    if named is not None and named != rec.name:
        if not rec.rename:
            raise Refused(f"token {rec.name} does not let a worker choose its name (`piloop token create --rename`)")
        return Caller("worker", _worker_name(named), False, rec)
    return Caller("worker", rec.name, False, rec)


def session_caller(rt: Runtime, sid: str) -> Caller:
    """The caller of the web page's session cookie (piloop_server/ui/): who the `piloop ui` link was made for, or the
    token that logged in, checked again now (a revoked or expired token ends its sessions)."""
    rec = ui_sessions.lookup(rt, sid)
    if rec is None:
        raise Unauthorized("the page's session ended: log in again (`piloop ui` prints a link)")
    if not rec.token:
        return Caller(rec.kind, rec.name, False, role=Role.ADMIN)  # the socket's user, who asked `piloop ui`
    tok = rt.tokens.get(rec.token)
    if tok is None or tok.revoked or tok.hash != rec.token_hash:
        ui_sessions.end(rt, sid)
        raise Unauthorized(f"token {rec.token} was revoked: the page's session ended")
    if tok.expires_ms is not None and tok.expires_ms < time.time() * 1000:
        raise Unauthorized(f"token {rec.token} expired: the page's session ended")
    if tok.role is None:  # a worker's token never logs in (the login refuses it); a record changed since is refused
        raise Unauthorized(f"token {rec.token} is a worker's: the page's session ended")
    return Caller("token", tok.name, False, tok, Role(tok.role))


def _worker_name(name: str, *, reserved_ok: bool = False) -> str:
    """The name a worker gave itself, or Refused (the worker exits saying why) when it is no name."""
    try:
        return check_name("worker", name, reserved_ok=reserved_ok)
    except BadRequest as e:
        raise Refused(e.message) from None


async def identify_async(request: Request) -> Caller:
    """`identify` on the event loop when it needs no Redis read (the socket, the proxy network, a token the server
    verified moments ago), else in a thread: a worker's call then takes one thread hop, its handler's."""
    caller = known(request.app.state.runtime, request.scope, request.headers)
    return caller if caller is not None else await run_in_threadpool(identify, request)


WORKER_ROUTES = "workers can only register, heartbeat, claim, report, release and log"


def require_worker(caller: Caller) -> Caller:
    # Refused, not Forbidden: a `piloop worker` started with a role token exits saying so (3), never retries
    if caller.kind != "worker":
        role = f" ({caller.role} role)" if caller.role else ""
        raise Refused(
            f"this route is for workers: {caller.shown}{role} is not a worker's (`piloop token create NAME` "
            "without --role makes one)"
        )
    return caller


def require_role(caller: Caller, need: Role, what: str) -> Caller:
    """`caller` when its role reaches `need`, else Forbidden naming the role `what` needs and who asked."""
    if caller.role is None:
        raise Forbidden(f"{what} needs the {need} role; {caller.shown} is a worker's, and {WORKER_ROUTES}")
    if not caller.role.reaches(need):
        raise Forbidden(f"{what} needs the {need} role; {caller.shown} has the {caller.role} role")
    return caller


def require_host_files(caller: Caller, flags: list[str]) -> Caller:
    """`caller` unless `flags` (each naming a path on the server's host) come from afar: the socket's user may have
    the server read its files (they are that user's), a remote caller of any role may not."""
    if flags and not caller.via_socket:
        raise Forbidden(
            f"{', '.join(flags)}: a path on the server's host is for the unix socket's user only, and {caller.shown} "
            "calls from afar; give the repo's URL (https://, ssh://, git@host:path) and no --workspace"
        )
    return caller
