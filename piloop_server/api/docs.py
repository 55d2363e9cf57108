"""`/openapi.json` and `/docs` for an operator, under `[plugins.network] api_docs = "token"`."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse

from piloop_server.api.deps import ViewerDep

router = APIRouter(include_in_schema=False)


@router.get("/openapi.json")
async def openapi(request: Request, caller: ViewerDep) -> dict[str, Any]:
    schema: dict[str, Any] = request.app.openapi()
    return schema


@router.get("/docs", response_class=HTMLResponse)
async def docs(request: Request, caller: ViewerDep) -> HTMLResponse:
    return get_swagger_ui_html(openapi_url="/openapi.json", title=f"{request.app.title} API")
