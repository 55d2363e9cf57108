"""The one CSRF check. A write that a session cookie authenticates must carry the session's CSRF value in a header
(a double submit: the page's script reads it from its cookie, which another site's page cannot). On the proxy
network a browser is authenticated by the proxy (its own cookie), with no session of ours: there a write that a
browser sends (one with `Origin`, `Sec-Fetch-Site` or a cookie) must say it comes from this server's own page
(`Sec-Fetch-Site: same-origin`, or an `Origin` that is this server's: its Host, or `[plugins.network] url`), or
carry the session's CSRF value. Plain ASGI, like app.BodyLimit; a call over the socket, a GET, or a non-browser
call on the token network (a bearer token, no cookie) passes untouched."""

from __future__ import annotations

import hmac
from typing import Any
from urllib.parse import urlsplit

from fastapi.responses import JSONResponse

from piloop_server.auth import SOCKET_SCOPE
from piloop_server.ui.sessions import CSRF_HEADER, SESSION_COOKIE, cookie, csrf_for

SAFE = frozenset({"GET", "HEAD", "OPTIONS"})
# the login form authenticates by what it posts, not by a cookie it may carry from an ended session
EXEMPT = frozenset({"/ui/login"})
READ = (b"cookie", b"authorization", CSRF_HEADER.encode(), b"origin", b"sec-fetch-site", b"host")


class CsrfCheck:
    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] in SAFE or scope.get(SOCKET_SCOPE) or scope["path"] in EXEMPT:
            await self.app(scope, receive, send)
            return
        why = self._refused(scope)
        if why is None:
            await self.app(scope, receive, send)
            return
        await JSONResponse({"error": "forbidden", "message": why}, 403)(scope, receive, send)

    @staticmethod
    def _headers(scope: dict[str, Any]) -> dict[str, str]:
        headers: dict[str, str] = {}
        for name, value in scope["headers"]:
            if name in READ:
                key = name.decode()
                # several Cookie headers are joined as one; the others count as given when given at all
                headers[key] = (
                    f"{headers[key]}; {value.decode('latin-1')}" if key in headers else value.decode("latin-1")
                )
        return headers

    @classmethod
    def _refused(cls, scope: dict[str, Any]) -> str | None:
        """Why this write is refused, or None."""
        headers = cls._headers(scope)
        sid = cookie(headers, SESSION_COOKIE)
        csrf_ok = bool(sid) and hmac.compare_digest(headers.get(CSRF_HEADER, "").encode(), csrf_for(sid or "").encode())
        if _proxy_network(scope) and _from_a_browser(headers):
            if csrf_ok or _same_origin(headers, scope):
                return None
            return (
                "a write from a browser needs this server's own page: Sec-Fetch-Site: same-origin, an Origin that is "
                f"this server's, or the page's CSRF header ({CSRF_HEADER})"
            )
        if "authorization" in headers or not sid or csrf_ok:
            return None  # a bearer token (no browser sends one on its own), no session, or the session's own page
        return f"a write from the page needs its CSRF header ({CSRF_HEADER})"


def _proxy_network(scope: dict[str, Any]) -> bool:
    app = scope.get("app")
    rt = getattr(getattr(app, "state", None), "runtime", None)
    return rt is not None and rt.settings.plugins.network.provider == "proxy"


def _from_a_browser(headers: dict[str, str]) -> bool:
    return any(h in headers for h in ("origin", "sec-fetch-site", "cookie"))


def _same_origin(headers: dict[str, str], scope: dict[str, Any]) -> bool:
    site = headers.get("sec-fetch-site", "").strip().lower()
    if site == "same-origin":
        return True
    if site not in ("", "none"):  # cross-site or same-site (another host of the domain): not this page
        return False
    origin = headers.get("origin", "").strip()
    if not origin or origin == "null":
        return False
    got = urlsplit(origin)
    rt = scope["app"].state.runtime
    url = rt.settings.plugins.network.url
    ours = {headers.get("host", "").lower()}
    if url:
        ours.add(urlsplit(url).netloc.lower())
    return bool(got.netloc) and got.netloc.lower() in ours
