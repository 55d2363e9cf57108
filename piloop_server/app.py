"""The FastAPI app: routers, and one mapping of piloop's errors to JSON answers."""

from __future__ import annotations

from typing import Any

import redis
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from piloop_common import __version__
from piloop_common.errors import PiloopError
from piloop_server.api import admin, jobs, worker
from piloop_server.auth import SOCKET_SCOPE
from piloop_server.runtime import Runtime


def create_app(rt: Runtime, daemon_info: dict[str, Any] | None = None) -> FastAPI:
    app = FastAPI(title="piloop", version=__version__, docs_url=None, redoc_url=None)
    app.state.runtime = rt
    app.state.daemon_info = daemon_info or {}
    for r in (worker.router, jobs.router, admin.router):
        app.include_router(r)
    max_body = rt.settings.plugins.network.max_body_mb * 1024 * 1024

    @app.middleware("http")
    async def limit_body(request: Request, call_next):
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > max_body):
            return JSONResponse({"error": "too_large", "message": f"the body is over {max_body} bytes"}, 413)
        return await call_next(request)

    @app.exception_handler(PiloopError)
    async def piloop_error(request: Request, exc: PiloopError) -> JSONResponse:
        return JSONResponse(exc.to_payload(), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def bad_body(request: Request, exc: RequestValidationError) -> JSONResponse:
        parts = []
        for err in exc.errors()[:5]:
            loc = ".".join(str(x) for x in err.get("loc", ()) if x != "body")
            parts.append(f"{loc or 'body'}: {err.get('msg')}")
        return JSONResponse({"error": "bad_request", "message": "; ".join(parts)}, status_code=400)

    @app.exception_handler(redis.exceptions.ConnectionError)
    @app.exception_handler(redis.exceptions.TimeoutError)
    async def redis_down(request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse({"error": "unavailable", "message": f"the server's Redis cannot be reached: {exc}"}, 503)

    return app


def via_socket(app: Any) -> Any:
    """The same app, marking each request as coming over the unix socket (whose callers are trusted)."""

    async def wrapped(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] in ("http", "websocket"):
            scope = {**scope, SOCKET_SCOPE: True}
        await app(scope, receive, send)

    return wrapped
