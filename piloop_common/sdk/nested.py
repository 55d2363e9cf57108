"""The Python client inside a job: its calls become the job's relayed ones (`PILOOP_RELAY`), so a task's
`other.delay()` queues a child job through its worker's relay, with no operator rights (piloop_server/api/nested.py).

`Client.from_env()` inside a job (PILOOP_RELAY set, no server given) uses `NestedClient`: submits, shows, log
chunks and cancels of its own children, and blobs put or read, each mapped to its `/v1/relay/...` route; any other
call is refused here, saying what a job may do.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import httpx

from piloop_common.errors import Forbidden, Unavailable
from piloop_common.sdk.client import ApiClient

RELAY_ENV = "PILOOP_RELAY"
JOB_ENV = "PILOOP_JOB"
_JOB = re.compile(r"^/v1/jobs/([^/]+)(/cancel|/log/\d+)?$")
_BLOB = re.compile(r"^/v1/cas/blobs/([^/]+)$")


def relay_path() -> Path | None:
    """The job's relay socket, inside a job; else None."""
    p = os.environ.get(RELAY_ENV)
    return Path(p) if p else None


def route(method: str, path: str) -> tuple[str, str]:
    """The relayed call for an operator call the Python client makes, or Forbidden saying what a job may do."""
    if method == "POST" and path == "/v1/jobs":
        return "POST", "/v1/relay/jobs"
    if m := _JOB.match(path):
        if m[1] == os.environ.get(JOB_ENV) and not m[2] and method == "GET":
            return "GET", "/v1/relay/job"  # the job itself
        return method, f"/v1/relay/jobs/{m[1]}{m[2] or ''}"
    if (m := _BLOB.match(path)) and method in ("PUT", "GET"):
        return ("POST" if method == "PUT" else "GET"), f"/v1/relay/blobs/{m[1]}"  # the relay forwards GET and POST
    if path.startswith("/v1/relay/"):
        return method, path
    raise Forbidden(
        f"inside a job ({RELAY_ENV} is set) the Python client may submit, show, wait for and cancel the job's own "
        f"children, and put and read their blobs, in the job's own pool: not {method} {path}"
    )


class NestedClient(ApiClient):
    """An API client on the job's relay socket whose operator calls are mapped to the job's relayed ones."""

    def __init__(self, socket: Path, timeout: float = 30.0) -> None:
        super().__init__(socket=socket, timeout=timeout)
        self.where = f"the worker's relay at {socket}"

    def _send(
        self,
        method: str,
        path: str,
        *,
        content: bytes | None,
        headers: dict[str, str] | None,
        params: dict[str, Any] | None = None,
        timeout: float | None,
    ) -> httpx.Response:
        method, path = route(method, path)
        try:
            return super()._send(method, path, content=content, headers=headers, params=params, timeout=timeout)
        except Unavailable as e:
            raise Unavailable(
                f"the worker's relay at {self.socket} does not answer (the worker is gone, and the job's lease with "
                f"it): {e.message}"
            ) from e
