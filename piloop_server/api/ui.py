"""The web page's login link: what `piloop ui` asks for, over the unix socket only (its user is the page's)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from piloop_common.errors import Forbidden
from piloop_server.api.deps import AdminDep, RuntimeDep
from piloop_server.ui import sessions
from piloop_server.ui.link import base_url

router = APIRouter(prefix="/v1/ui", tags=["ui"])


@router.post("/link")
def link(request: Request, rt: RuntimeDep, caller: AdminDep) -> dict[str, Any]:
    """A one-time link that logs a browser in as the socket's user, good once within `expires_seconds`."""
    if not caller.via_socket:
        raise Forbidden("a login link is made over the unix socket (`piloop ui` on the server's machine)")
    base = base_url(rt.settings, request.app.state.daemon_info.get("listen", ""))
    once = sessions.mint_once(rt, caller.kind, caller.name)
    rt.events.add("ui.link", caller.signed)
    return {"url": f"{base}/ui/login?once={once}", "expires_seconds": sessions.ONCE_SECONDS}
