"""A worker as Redis keeps it: one hash per worker (written by register.lua, heartbeat.lua, claim.lua and
drain.lua), its field names written here once."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from typing import Any

from piloop_server.state.records.codec import text as _s


def _i(v: Any) -> int:
    s = _s(v)
    return int(s) if s.lstrip("-").isdigit() else 0


@dataclass(frozen=True)
class WorkerRecord:
    name: str
    pool: str = ""
    image: str = ""
    cas: str = ""  # the identity of the CAS it reads and writes
    sample: str = ""  # JSON: its last host sample (and its admission verdict)
    protocol: str = ""
    info: str = ""  # JSON: host, pid, version
    registered: int = 0  # ms
    seen: int = 0  # ms: its last heartbeat
    reason: str = ""  # why its last claim got no lease
    draining: bool = False  # '1': it takes no more jobs
    room_mb: int | None = None  # the memory it said it has room for, at its last claim
    owner: str = ""  # the identity of the token its name is bound to (register.lua): `token:<name>`, socket, proxy
    # beside the hash: whether its alive key is there, and the jobs it holds leases on, by kind
    alive: bool = False
    leases: dict[str, list[str]] = field(default_factory=dict)

    @classmethod
    def from_hash(
        cls, h: dict[Any, Any], alive: bool = False, leases: dict[str, list[str]] | None = None
    ) -> WorkerRecord | None:
        """The record of an HGETALL reply; None for an empty one (no such worker)."""
        if not h:
            return None
        got = {_s(k): v for k, v in h.items()}
        out: dict[str, Any] = {}
        for f in fields(cls):
            if f.name not in FIELDS:
                continue
            raw = got.get(FIELDS[f.name])
            if f.name == "draining":
                out[f.name] = _s(raw) == "1"
            elif f.name == "room_mb":
                out[f.name] = _i(raw) if _s(raw) else None
            elif f.type == "int":
                out[f.name] = _i(raw)
            else:
                out[f.name] = _s(raw)
        return cls(**out, alive=alive, leases=leases or {})

    def sample_dict(self) -> dict[str, Any] | None:
        try:
            got = json.loads(self.sample) if self.sample else None
        except ValueError:
            return None
        return got if isinstance(got, dict) else None


BESIDE = ("alive", "leases")  # read from keys beside the hash, not stored in it
# attribute -> the hash field it is stored under: each field of `WorkerRecord` not beside it, under its own name
FIELDS: dict[str, str] = {f.name: f.name for f in fields(WorkerRecord) if f.name not in BESIDE}
