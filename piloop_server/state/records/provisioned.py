"""The provisioner's records: a started worker (`keys.provisioned(name)`) and a pool's start backoff
(`keys.provisioner(pool)`), each a Redis hash whose fields are this module's classes' fields."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any

from piloop_server.state.records.codec import text as _s

STATES = ("starting", "running", "draining", "stopping", "stopped")


def _int(v: Any) -> int:
    s = _s(v)
    return int(float(s)) if s else 0


@dataclass(frozen=True)
class Provisioned:
    """One worker the server started: its pool, its state and since when (Redis ms), and its platform handle."""

    name: str  # the key's, not a field of the hash
    pool: str = ""
    state: str = ""  # one of STATES
    since: int = 0
    idle_since: int = 0  # when it last held a lease (ms)
    why: str = ""  # why it is in its state
    handle: dict[str, str] | None = None  # the platform's handle (name, pool, id), once started
    lost: bool = False  # the platform's listing no longer has it
    stop_tried: int = 0  # when a stop was last asked of the platform (ms)

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls) if f.name != "name"]

    @classmethod
    def encode(cls, **values: Any) -> dict[str, str]:
        """Fields as the hash holds them; an unknown field is a programming error."""
        known = set(cls.field_names())
        out: dict[str, str] = {}
        for k, v in values.items():
            if k not in known:
                raise TypeError(f"Provisioned has no field {k!r}")
            if k == "handle":
                out[k] = json.dumps(v) if v else ""
            elif k == "lost":
                out[k] = "1" if v else ""
            else:
                out[k] = str(v)
        return out

    @classmethod
    def from_redis(cls, name: str, h: dict[Any, Any]) -> Provisioned:
        d = {_s(a): _s(b) for a, b in h.items()}
        return cls(
            name=name,
            pool=d.get("pool", ""),
            state=d.get("state", ""),
            since=_int(d.get("since")),
            idle_since=_int(d.get("idle_since")),
            why=d.get("why", ""),
            handle=json.loads(d["handle"]) if d.get("handle") else None,
            lost=bool(d.get("lost")),
            stop_tried=_int(d.get("stop_tried")),
        )


@dataclass(frozen=True)
class PoolBackoff:
    """A pool's start backoff: how long it waits after failed starts, until when (Redis ms), its refusals in a
    row, the last failure, and why it is halted (bad platform credentials) if it is."""

    delay: float = 0.0
    until: int = 0
    refusals: int = 0
    why: str = ""
    halted: str = ""

    @classmethod
    def encode(cls, **values: Any) -> dict[str, str]:
        """Fields as the hash holds them; an unknown field is a programming error."""
        known = {f.name for f in fields(cls)}
        for k in values:
            if k not in known:
                raise TypeError(f"PoolBackoff has no field {k!r}")
        return {k: str(v) for k, v in values.items()}

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    @classmethod
    def from_redis(cls, h: dict[Any, Any]) -> PoolBackoff:
        d = {_s(a): _s(b) for a, b in h.items()}
        return cls(
            delay=float(d.get("delay") or 0),
            until=_int(d.get("until")),
            refusals=_int(d.get("refusals")),
            why=d.get("why", ""),
            halted=d.get("halted", ""),
        )
