"""A token's record: the value of its name in the `tokens` hash, as JSON whose keys are this class's fields."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace
from typing import Any


@dataclass(frozen=True)
class Token:
    name: str
    hash: str  # sha256 of the token: the token itself is shown once and never kept
    created_ms: int
    by: str
    pool: str | None = None
    expires_ms: int | None = None
    revoked: bool = False
    rename: bool = False  # the worker may name itself (x-piloop-worker)
    role: str | None = None  # viewer | operator | admin (auth.Role): a person's or a program's; None: a worker's

    def to_redis(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_redis(cls, raw: bytes | str) -> Token:
        data: dict[str, Any] = json.loads(raw)
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})

    def revoked_now(self) -> Token:
        return replace(self, revoked=True)
