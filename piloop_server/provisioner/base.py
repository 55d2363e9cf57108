"""The interface every platform implements: start, stop, list by tag."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from piloop_common.errors import PiloopError

# The environment a started worker gets beside its token: the server's id (so that two servers never stop each
# other's workers), its own name, and how long it outlives an unreachable server (see piloop_worker.heartbeat).
TAG_ENV = "PILOOP_PROVISIONER_TAG"
NAME_ENV = "PILOOP_PROVISIONED_NAME"
ORPHAN_ENV = "PILOOP_ORPHAN_EXIT_SECONDS"


class StartRefused(PiloopError):
    """The platform refused a start (a quota, no GPU): the pool backs off."""

    code = "start_refused"
    status = 503


class PlatformAuthError(PiloopError):
    """The platform refused our credentials: retrying never helps, so the pool stops and escalates."""

    code = "platform_auth"
    status = 503


@dataclass(frozen=True)
class Handle:
    """One started worker on its platform: the worker's name, its pool, and the platform's id for it."""

    name: str
    pool: str
    id: str


class Provider(Protocol):
    url: str  # the server's URL that its workers dial

    def start(self, name: str, token: str | None, env: dict[str, str]) -> Handle:
        """Start worker `name` with `token` (None on the proxy network: `env` holds the shared credential);
        StartRefused when the platform says no."""

    def stop(self, handle: Handle) -> None:
        """Stop it; one that is already gone is stopped."""

    def list(self, tag: str) -> list[Handle]:
        """Every worker on the platform tagged with `tag` (this server's id), whoever started it."""

    def unused_homes(self) -> dict[str, Path]:
        """What the server keeps on its own disk for started workers that no process of theirs uses, by worker
        name: their homes (local), or nothing (a platform whose workers keep theirs)."""
