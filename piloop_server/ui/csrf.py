"""The one CSRF check: a write that a session cookie authenticates must carry the session's CSRF value in a header
(a double submit: the page's script reads it from its cookie, which another site's page cannot). Plain ASGI, like
app.BodyLimit; a call with a bearer token, over the socket, or without the cookie passes untouched."""

from __future__ import annotations

import hmac
from typing import Any

from fastapi.responses import JSONResponse

from piloop_server.auth import SOCKET_SCOPE
from piloop_server.ui.sessions import CSRF_HEADER, SESSION_COOKIE, cookie, csrf_for

SAFE = frozenset({"GET", "HEAD", "OPTIONS"})
# the login form authenticates by what it posts, not by a cookie it may carry from an ended session
EXEMPT = frozenset({"/ui/login"})


class CsrfCheck:
    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if (
            scope["type"] != "http"
            or scope["method"] in SAFE
            or scope.get(SOCKET_SCOPE)
            or scope["path"] in EXEMPT
            or not self._refused(scope)
        ):
            await self.app(scope, receive, send)
            return
        resp = JSONResponse(
            {"error": "forbidden", "message": f"a write from the page needs its CSRF header ({CSRF_HEADER})"}, 403
        )
        await resp(scope, receive, send)

    @staticmethod
    def _refused(scope: dict[str, Any]) -> bool:
        headers: dict[str, str] = {}
        for name, value in scope["headers"]:
            if name in (b"cookie", b"authorization", CSRF_HEADER.encode()):
                key = name.decode()
                # several Cookie headers are joined as one; the others count as given when given at all
                headers[key] = (
                    f"{headers[key]}; {value.decode('latin-1')}" if key in headers else value.decode("latin-1")
                )
        if "authorization" in headers:
            return False  # a bearer token: no browser sends one on its own
        sid = cookie(headers, SESSION_COOKIE)
        if not sid:
            return False
        return not hmac.compare_digest(headers.get(CSRF_HEADER, "").encode(), csrf_for(sid).encode())
