"""A campaign as Redis keeps it: one hash per campaign, its field names written here once."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from piloop_server.state.records.codec import text as _s


def _i(v: Any) -> int:
    s = _s(v)
    return int(s) if s.lstrip("-").isdigit() else 0


@dataclass(frozen=True)
class Campaign:
    name: str
    state: str  # active | paused
    repo: str  # what it was cloned from
    base: str  # the commit agents start from until a run is scored
    branch: str  # the repo's HEAD branch
    bundle: str  # CAS address of the bundle of its branches at create
    bundle_bytes: int
    agent_cmd: str
    eval_cmd: str
    agents: int  # the target of live agents
    agent_pool: str
    eval_pool: str
    workspace: str  # CAS address of the shared workspace's manifest
    workspace_files: int
    agent_spec: str  # JSON: the JobSpec every agent starts from
    eval_spec: str  # JSON: the JobSpec every evaluation starts from
    created: int  # ms
    by: str

    def to_hash(self) -> dict[str, str | int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_hash(cls, h: dict[Any, Any]) -> Campaign | None:
        """The record of an HGETALL reply; None for an empty one (no such campaign)."""
        if not h:
            return None
        got = {_s(k): v for k, v in h.items()}
        out: dict[str, Any] = {}
        for f in fields(cls):
            raw = got.get(f.name)
            out[f.name] = _i(raw) if f.type == "int" else _s(raw)
        return cls(**out)
