"""A page session's record: the value of its `ui:session` (or `ui:once`) key, as JSON whose keys are this class's
fields."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from typing import Any


@dataclass(frozen=True)
class UiSession:
    kind: str  # the caller's kind, as auth.Caller names it: human for a link of `piloop ui`
    name: str
    created_ms: int
    token: str = ""  # the token's name, for a session a token logged in: re-checked on each request
    token_hash: str = ""  # its hash then: a token made again under the same name does not inherit the session

    def to_redis(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_redis(cls, raw: bytes | str) -> UiSession:
        data: dict[str, Any] = json.loads(raw)
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})
