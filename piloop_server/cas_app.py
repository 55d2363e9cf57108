"""`create_cas_app`: the standalone CAS server that `piloop cas serve` runs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from fastapi import FastAPI, Header, Request
from fastapi.responses import JSONResponse

from piloop_common.cas.base import Store
from piloop_common.errors import PiloopError, Unauthorized
from piloop_server.api.cas import cas_router


def create_cas_app(store: Store, verify: Callable[[str], bool]) -> FastAPI:
    """Serve `store` at `/v1/cas`; `verify(token)` says whether a bearer token is accepted."""

    def bearer(authorization: Annotated[str | None, Header()] = None) -> None:
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise Unauthorized("a bearer token is required: send `Authorization: Bearer <token>`")
        if not verify(token.strip()):
            raise Unauthorized("the token is not valid (unknown, revoked or expired)")

    app = FastAPI(title="piloop CAS", docs_url=None, redoc_url=None)
    app.state.store = store
    app.include_router(cas_router(lambda: store, bearer))

    @app.exception_handler(PiloopError)
    async def piloop_error(request: Request, exc: PiloopError) -> JSONResponse:
        headers = {"www-authenticate": "Bearer"} if exc.status == 401 else None
        return JSONResponse(exc.to_payload(), status_code=exc.status, headers=headers)

    return app
