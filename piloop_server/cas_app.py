"""`create_cas_app`: the standalone CAS server that `piloop cas serve` runs.

Who may call it: any live piloop token (`plt_…`) of any kind — a worker's of any pool, a person's of any role —
reads every blob and writes new ones; nothing else does. Listing and deleting blobs (the garbage collector's side)
take a token named in `[plugins.network] cas_operators`; any other is refused 403. Tokens are checked in the daemon's
Redis: while it does not answer (the daemon and its embedded Redis stopped) every call is 503 naming the daemon. A put is capped (`[plugins.network] cas_max_put_mb`):
a bigger body is refused 413 by its `Content-Length` before a byte is read, or as it comes when it has none,
and nothing is stored. Other bodies (`POST /v1/cas/has`) are capped at `[plugins.network] max_body_mb`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import FastAPI, Header, Request
from fastapi.responses import JSONResponse
from starlette.types import Receive, Scope, Send

from piloop_common.cas.base import Store
from piloop_common.errors import Forbidden, PiloopError, TooLarge, Unauthorized, Unavailable
from piloop_server.api.cas import cas_router, sweep_router
from piloop_server.state.connection import UNREACHABLE

MIB = 1024 * 1024
DEFAULT_MAX_PUT_MB = 4096
DEFAULT_MAX_BODY_MB = 16


class BodyCap:
    """Refuse a body over its cap: a put's (`max_put`), any other's (`max_body`). By `Content-Length` before the
    app runs; without one, by counting as the body comes, so a put that passes the cap fails inside the store's
    `put_stream` (which then stores nothing) and answers 413. Never buffered: a blob streams into the store."""

    def __init__(self, app: Any, *, max_put: int, max_body: int) -> None:
        self.app, self.max_put, self.max_body = app, max_put, max_body

    def _refusal(self, method: str) -> TooLarge:
        if method == "PUT":
            return TooLarge(
                f"the blob is over {self.max_put // MIB} MiB, the cap of this CAS "
                "([plugins.network] cas_max_put_mb); nothing was stored",
                cap_bytes=self.max_put,
            )
        return TooLarge(
            f"the body is over {self.max_body // MIB} MiB ([plugins.network] max_body_mb)", cap_bytes=self.max_body
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        method = scope["method"]
        cap = self.max_put if method == "PUT" else self.max_body
        for name, value in scope["headers"]:
            if name == b"content-length" and (not value.isdigit() or int(value) > cap):
                e = self._refusal(method)
                await JSONResponse(e.to_payload(), status_code=e.status, headers={"connection": "close"})(
                    scope, receive, send
                )
                return
        seen = 0

        async def counted() -> Any:
            nonlocal seen
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > cap:
                    raise self._refusal(method)
            return msg

        await self.app(scope, counted, send)


def create_cas_app(
    store: Store,
    verify: Callable[[str], bool],
    *,
    max_put_mb: int = DEFAULT_MAX_PUT_MB,
    max_body_mb: int = DEFAULT_MAX_BODY_MB,
    operator: Callable[[str], bool] = lambda token: False,
) -> FastAPI:
    """Serve `store` at `/v1/cas`; `verify(token)` says whether a bearer token is accepted, `operator(token)` whether
    it may also list and delete blobs; a put over `max_put_mb` MiB, or another body over `max_body_mb`, is refused
    413."""

    def _asked(check: Callable[[str], bool], token: str) -> bool:
        try:
            return check(token)
        except UNREACHABLE as e:
            raise Unavailable(
                "this CAS checks tokens in the piloop daemon's Redis, which does not answer: the daemon (and its "
                "embedded Redis) is stopped or unreachable; start it (`piloop serve`), and the CAS answers again"
            ) from e

    def _token(authorization: str | None) -> str:
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise Unauthorized("a bearer token is required: send `Authorization: Bearer <token>`")
        if not _asked(verify, token.strip()):
            raise Unauthorized("the token is not valid (unknown, revoked or expired)")
        return token.strip()

    def bearer(authorization: Annotated[str | None, Header()] = None) -> None:
        _token(authorization)

    def operator_bearer(authorization: Annotated[str | None, Header()] = None) -> None:
        if not _asked(operator, _token(authorization)):
            raise Forbidden(
                "listing and deleting blobs is for operators: the token's name must be in "
                "[plugins.network] cas_operators of this `piloop cas serve`"
            )

    app = FastAPI(title="piloop CAS", docs_url=None, redoc_url=None)
    app.state.store = store
    app.include_router(cas_router(lambda: store, bearer))
    app.include_router(sweep_router(lambda: store, operator_bearer))
    app.add_middleware(BodyCap, max_put=max_put_mb * MIB, max_body=max_body_mb * MIB)

    @app.exception_handler(PiloopError)
    async def piloop_error(request: Request, exc: PiloopError) -> JSONResponse:
        headers = {"www-authenticate": "Bearer"} if exc.status == 401 else None
        return JSONResponse(exc.to_payload(), status_code=exc.status, headers=headers)

    return app
