"""`piloop` inside a job: its calls go through the worker's relay (`PILOOP_RELAY`) while the job's lease is live.

`piloop progress "note"` appends a note to the job; `piloop job submit REV` (a campaign's agent only) queues its
campaign's evaluation of that commit; `piloop job show` (its own id, or none) shows the job itself. Nothing else
reaches the server from inside a job: the relay forwards only `/v1/relay/...`, and the server checks the job's lease
on each call.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from piloop_common.sdk.client import ApiClient

RELAY_ENV = "PILOOP_RELAY"
SUBMIT_USAGE = (
    "inside a job, `piloop job submit REV` queues its campaign's evaluation of one commit (REV: a sha or "
    "a name git resolves here, like HEAD); the campaign sets the pool, command, image, env and secrets"
)
# `job submit`'s body fields and their flags: inside a job each must stay at its default (the campaign's to set)
_SET_BY_CAMPAIGN = {
    "kind": "--kind",
    "pool": "--pool",
    "campaign": "--campaign",
    "image": "--image",
    "env": "--env",
    "secrets": "--secret",
    "inputs": "--input",
    "timeout_seconds": "--timeout",
    "memory_mb": "--memory",
    "memory_max_mb": "--memory-max",
    "memory_growth": "--memory-growth",
    "max_attempts": "--max-attempts",
    "backoff_seconds": "--backoff",
    "after": "--after",
}
_DEFAULTS: dict[str, Any] = {
    "kind": "evaluation",
    "pool": "serve",
    "campaign": "",
    "image": "",
    "env": {},
    "secrets": [],
    "inputs": {},
    "timeout_seconds": None,
    "memory_mb": None,
}


def relayed_submit(body: dict[str, Any]) -> dict[str, Any]:
    """`job submit`'s body as the relay's: `{"commit": <sha>}`, REV resolved by git in the job's cwd (its
    worktree); a flag the campaign sets, or more than one REV, is refused naming it (nothing is sent)."""
    from piloop_common import gitrepo
    from piloop_common.errors import BadRequest

    spec = body.get("spec") or {}
    given = {**{k: v for k, v in body.items() if k != "spec"}, **{k: v for k, v in spec.items() if k != "argv"}}
    flags = sorted({flag for k, flag in _SET_BY_CAMPAIGN.items() if k in given and given[k] != _DEFAULTS.get(k)})
    if flags:
        raise BadRequest(f"{', '.join(flags)}: {SUBMIT_USAGE}")
    argv = spec.get("argv") or []
    if len(argv) != 1:
        raise BadRequest(f"{' '.join(argv)}: one REV, not a command: {SUBMIT_USAGE}")
    rev = argv[0]
    sha = gitrepo.git("rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}", check=False).strip()
    if not gitrepo.SHA.match(sha):
        if not re.fullmatch(r"[0-9a-f]{7,40}", rev):
            raise BadRequest(f"{rev}: not a commit git knows here ({Path.cwd()}); {SUBMIT_USAGE}")
        sha = rev  # a sha this clone lacks: the server looks for it in the campaign's repo
    return {"commit": sha}


def relay_path() -> Path | None:
    p = os.environ.get(RELAY_ENV)
    return Path(p) if p else None


def relay_client(path: Path, timeout: float = 30.0) -> ApiClient:
    """An API client whose operator calls become the job's relayed ones."""
    from piloop_common.errors import Forbidden, Unavailable
    from piloop_common.sdk.client import ApiClient

    class RelayClient(ApiClient):
        def call(
            self,
            method: str,
            path_: str,
            body: Any = None,
            params: Any = None,
            model: Any = None,
            timeout: float | None = None,
        ) -> Any:
            me = os.environ.get("PILOOP_JOB", "")
            if method == "POST" and path_ == "/v1/jobs":
                path_, body = "/v1/relay/submit", relayed_submit(body or {})
            elif method == "GET" and path_ in (f"/v1/jobs/{me}", "/v1/relay/job"):
                path_ = "/v1/relay/job"
            elif not path_.startswith("/v1/relay/"):
                raise Forbidden(
                    f"inside a job ({RELAY_ENV} is set) piloop can only submit its campaign's "
                    "evaluation of a commit (`piloop job submit REV`), show the job itself and note "
                    "progress"
                )
            try:
                return super().call(method, path_, body, params=params, model=model, timeout=timeout)
            except Unavailable as e:
                raise Unavailable(
                    f"the worker's relay at {path} does not answer (the worker is gone, and the job's "
                    f"lease with it): {e.message}"
                ) from e

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
