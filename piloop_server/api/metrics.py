"""`GET /metrics` on the API's listeners, for an operator (the token-free listener is serve.py's)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST

from piloop_server.api.deps import ViewerDep

router = APIRouter(include_in_schema=False)


@router.get("/metrics", response_class=Response)
def metrics(request: Request, caller: ViewerDep) -> Response:
    # sync: the scrape reads Redis, in a thread off the event loop
    return Response(request.app.state.metrics.text(), media_type=CONTENT_TYPE_LATEST)
