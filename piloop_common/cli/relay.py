"""`piloop` inside a job: its calls go through the worker's relay (`PILOOP_RELAY`) while the job's lease is live.

`piloop progress "note"` appends a note to the job; `piloop job submit` queues an evaluation in the agent's
own campaign; `piloop job show` (its own id, or none) shows the job itself. Nothing else reaches the server
from inside a job: the relay forwards only `/v1/relay/...`, and the server checks the job's lease on each call.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click

RELAY_ENV = "PILOOP_RELAY"


def relay_path() -> Path | None:
    p = os.environ.get(RELAY_ENV)
    return Path(p) if p else None


def relay_client(path: Path, timeout: float = 30.0) -> Any:
    """An API client whose operator calls become the job's relayed ones."""
    from piloop_common.client import ApiClient
    from piloop_common.errors import Forbidden, Unavailable

    class RelayClient(ApiClient):
        def call(self, method: str, path_: str, body: Any = None, params: Any = None, model: Any = None,
                 timeout: float | None = None) -> Any:
            me = os.environ.get("PILOOP_JOB", "")
            if method == "POST" and path_ == "/v1/jobs":
                path_ = "/v1/relay/submit"
            elif method == "GET" and path_ in (f"/v1/jobs/{me}", "/v1/relay/job"):
                path_ = "/v1/relay/job"
            elif not path_.startswith("/v1/relay/"):
                raise Forbidden(f"inside a job ({RELAY_ENV} is set) piloop can only submit evaluations, show the "
                                "job itself and note progress")
            try:
                return super().call(method, path_, body, params=params, model=model, timeout=timeout)
            except Unavailable as e:
                raise Unavailable(f"the worker's relay at {path} does not answer (the worker is gone, and the job's "
                                  f"lease with it): {e.message}") from e

    return RelayClient(socket=path, timeout=timeout)


@click.command("progress")
@click.argument("note", nargs=-1, required=True)
@click.pass_obj
def progress(obj, note: tuple[str, ...]) -> None:
    """Inside a job: append a short note to it (shown by `piloop job show`)."""
    if relay_path() is None:
        raise click.UsageError(f"piloop progress runs inside a job: {RELAY_ENV} is not set")
    with obj.api() as api:
        api.call("POST", "/v1/relay/progress", {"note": " ".join(note)})
