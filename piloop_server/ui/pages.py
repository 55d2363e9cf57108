"""The page's routes: its shell for every view (the script draws each from the /v1 routes), the login by link or
token, the logout, and the static files. The data come only from the /v1 routes, so their role checks hold."""

from __future__ import annotations

import html
import time
from functools import cache
from importlib.resources import files
from urllib.parse import parse_qs

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles

from piloop_common.errors import BadRequest, PiloopError, Unauthorized
from piloop_server.auth import Caller, Role, identify, require_role
from piloop_server.state.records.uisession import UiSession
from piloop_server.ui import sessions

router = APIRouter(prefix="/ui", include_in_schema=False)
MOST_FORM_BYTES = 4096
# the page runs only its own files, and no other site may frame it (a click on its buttons through a frame)
NO_STORE = {
    "cache-control": "no-store",
    "content-security-policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; form-action 'self'",
    "x-frame-options": "DENY",
}
VIEWS = ("", "jobs", "campaigns", "events", "inbox")


def static_files() -> StaticFiles:
    return StaticFiles(packages=[("piloop_server.ui", "static")])


@cache
def _text(name: str) -> str:
    return (files("piloop_server.ui") / "static" / name).read_text()


def _login_page(message: str = "", status: int = 200) -> HTMLResponse:
    note = f'<p class="error">{html.escape(message)}</p>' if message else ""
    return HTMLResponse(_text("login.html").replace("<!--message-->", note), status, headers=NO_STORE)


def _logged_in(request: Request, rec: UiSession) -> Response:
    rt = request.app.state.runtime
    sid = sessions.start(rt, rec)
    rt.events.add("ui.login", f"{rec.kind}:{rec.name}", via="token" if rec.token else "link")
    resp = RedirectResponse("/ui", 303, headers=NO_STORE)
    secure = request.url.scheme == "https"
    # no max-age: the browser forgets both at its exit, Redis the session after SESSION_SECONDS idle
    resp.set_cookie(sessions.SESSION_COOKIE, sid, httponly=True, samesite="strict", secure=secure, path="/")
    resp.set_cookie(sessions.CSRF_COOKIE, sessions.csrf_for(sid), samesite="strict", secure=secure, path="/")
    return resp


@router.get("/login")
def login_form(request: Request, once: str = "") -> Response:
    """The token form; with `once`, the link of `piloop ui`, used up here."""
    if not once:
        return _login_page()
    rec = sessions.redeem_once(request.app.state.runtime, once)
    if rec is None:
        return _login_page("This link was used already or has expired: run `piloop ui` for a new one.", 403)
    return _logged_in(request, rec)


@router.post("/login")
async def login_token(request: Request) -> Response:
    """A viewer's or operator's token posted by the form: the session is that token's, while it lives."""
    body = await request.body()
    if len(body) > MOST_FORM_BYTES:
        return _login_page("The form is too large.", 413)
    token = (parse_qs(body.decode("latin-1")).get("token") or [""])[0].strip()
    if not token:
        return _login_page("Paste a token (plt_…).", 400)
    # the token is identified exactly as a bearer call's: whatever roles auth.py knows apply to the session
    scope = {**request.scope, "headers": [(b"authorization", f"Bearer {token}".encode("latin-1"))]}
    try:
        caller: Caller = require_role(await _identify_in_thread(Request(scope)), Role.VIEWER, "the page's login")
    except BadRequest as e:
        return _login_page(e.message, 400)
    except PiloopError as e:
        return _login_page(f"{e.message}: a viewer's or operator's token logs in here, not a worker's.", 403)
    if caller.token is None:
        return _login_page("This network does not log in by token: use the link of `piloop ui`.", 403)
    rec = UiSession(caller.kind, caller.name, int(time.time() * 1000), caller.token.name, caller.token.hash)
    return _logged_in(request, rec)


async def _identify_in_thread(request: Request) -> Caller:
    from starlette.concurrency import run_in_threadpool

    return await run_in_threadpool(identify, request)


@router.post("/logout")
def logout(request: Request) -> Response:
    sid = sessions.cookie(request.headers, sessions.SESSION_COOKIE)
    if sid:
        sessions.end(request.app.state.runtime, sid)
    resp = RedirectResponse("/ui/login", 303, headers=NO_STORE)
    resp.delete_cookie(sessions.SESSION_COOKIE, path="/")
    resp.delete_cookie(sessions.CSRF_COOKIE, path="/")
    return resp


# last: the views' paths would match /ui/login too
@router.get("")
@router.get("/{view}")
@router.get("/{view}/{name}")
def page(request: Request, view: str = "", name: str = "") -> Response:
    """The shell of a view, for a caller the API would answer; else to the login page."""
    try:
        require_role(identify(request), Role.VIEWER, "the page")
    except Unauthorized:
        return RedirectResponse("/ui/login", 303, headers=NO_STORE)
    except PiloopError as e:
        return HTMLResponse(f"<h1>{html.escape(e.message)}</h1>", e.status, headers=NO_STORE)
    if view not in VIEWS or (name and view not in ("jobs", "campaigns")):
        return HTMLResponse("<h1>no such page</h1>", 404, headers=NO_STORE)
    return HTMLResponse(_text("shell.html"), headers=NO_STORE)
