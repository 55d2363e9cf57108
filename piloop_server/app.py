"""The FastAPI app: routers, and one mapping of piloop's errors to JSON answers."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.telemetry import TelemetryConfig
from starlette.exceptions import HTTPException
from starlette.types import Receive, Scope, Send

from piloop_common import __version__
from piloop_common.errors import PiloopError
from piloop_server.api import (
    admin,
    blobs,
    campaigns,
    docs,
    joblog,
    jobs,
    metrics,
    nested,
    relay,
    schedules,
    secrets,
    ui,
    worker,
)
from piloop_server.api.answers import error_answer, replaying
from piloop_server.auth import SOCKET_SCOPE
from piloop_server.metrics import Metrics
from piloop_server.runtime import Runtime
from piloop_server.state.connection import UNREACHABLE
from piloop_server.ui import pages as ui_pages
from piloop_server.ui.csrf import CsrfCheck

# FastAPI's OpenTelemetry hooks look up the global providers on every request (~3 % of the server's CPU in a
# drain); piloop exports none of it (its metrics are Prometheus', metrics/)
NO_TELEMETRY: TelemetryConfig = {"tracing": False, "metrics": False, "logs": False}


def create_app(rt: Runtime, daemon_info: dict[str, Any] | None = None) -> FastAPI:
    # the schema and its page are routes of ours (api/docs.py), behind the operator's check, or absent
    app = FastAPI(
        title="piloop", version=__version__, docs_url=None, redoc_url=None, openapi_url=None, telemetry=NO_TELEMETRY
    )
    app.state.runtime = rt
    app.state.daemon_info = daemon_info or {}
    app.state.metrics = Metrics(rt)
    for r in (
        worker.router,
        jobs.router,
        joblog.router,
        blobs.router,
        admin.router,
        secrets.router,
        relay.router,
        nested.router,
        schedules.router,
        campaigns.router,
        campaigns.worker_router,
        metrics.router,
        ui.router,
    ):
        app.include_router(r)
    app.mount("/ui/static", ui_pages.static_files(), name="ui-static")  # before the page's views, which match it too
    app.include_router(ui_pages.router)
    if rt.settings.plugins.network.api_docs == "token":
        app.include_router(docs.router)
    app.add_middleware(BodyLimit, max_body=rt.settings.plugins.network.max_body_mb * 1024 * 1024)
    app.add_middleware(CsrfCheck)
    app.add_middleware(relay.RelayMarkerGuard)

    @app.exception_handler(PiloopError)
    async def piloop_error(request: Request, exc: PiloopError) -> JSONResponse:
        return error_answer(exc)

    @app.exception_handler(RequestValidationError)
    async def bad_body(request: Request, exc: RequestValidationError) -> JSONResponse:
        parts = []
        for err in exc.errors()[:5]:
            loc = ".".join(str(x) for x in err.get("loc", ()) if x != "body")
            parts.append(f"{loc or 'body'}: {err.get('msg')}")
        return JSONResponse({"error": "bad_request", "message": "; ".join(parts)}, status_code=400)

    @app.exception_handler(HTTPException)
    async def no_route(request: Request, exc: HTTPException) -> JSONResponse:
        # a path no route matches (`/v1/jobs/../x` once decoded), or a method it does not take: said as piloop says it
        code = "not_found" if exc.status_code == 404 else "bad_request"
        why = "no route" if exc.status_code == 404 else f"{exc.detail}:"
        return JSONResponse(
            {"error": code, "message": f"{why} {request.method} {request.url.path[:200]}"},
            status_code=exc.status_code,
            headers=exc.headers,
        )

    async def redis_down(request: Request, exc: Exception) -> JSONResponse:
        return error_answer(exc)

    for exc_type in UNREACHABLE:
        app.add_exception_handler(exc_type, redis_down)

    return app


class BodyLimit:
    """Refuse a body over the limit by its Content-Length, or as it comes when there is none (a chunked body:
    read whole, up to the limit, then handed on). Plain ASGI: BaseHTTPMiddleware costs ~1 ms a call."""

    def __init__(self, app: Any, max_body: int) -> None:
        self.app, self.max_body = app, max_body

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        resp = JSONResponse({"error": "too_large", "message": f"the body is over {self.max_body} bytes"}, 413)
        await resp(scope, receive, send)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope["headers"]:
            if name == b"content-length":
                if not value.isdigit() or int(value) > self.max_body:
                    await self._refuse(scope, receive, send)
                    return
                await self.app(scope, receive, send)
                return
        chunks: list[bytes] = []
        size = 0
        while True:
            msg = await receive()
            if msg["type"] != "http.request":
                return  # the client went away
            size += len(msg.get("body", b""))
            if size > self.max_body:
                await self._refuse(scope, receive, send)
                return
            chunks.append(msg.get("body", b""))
            if not msg.get("more_body"):
                break
        await self.app(scope, replaying(b"".join(chunks), receive), send)


def via_socket(app: Any) -> Any:
    """The same app, marking each request as coming over the unix socket (whose callers are trusted)."""

    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            scope = {**scope, SOCKET_SCOPE: True}
        await app(scope, receive, send)

    return wrapped
