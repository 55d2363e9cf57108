"""A limit's record: the value of its key in the `limits` hash, as JSON whose keys are this class's fields."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from typing import Any


@dataclass(frozen=True)
class Limit:
    value: Any  # as JSON gives it back: checked against the schema each time it is applied
    reason: str
    by: str
    at_ms: int

    def to_redis(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_redis(cls, raw: bytes | str) -> Limit:
        data: dict[str, Any] = json.loads(raw)
        known: dict[str, Any] = {f.name: data.get(f.name) for f in fields(cls)}
        return cls(**known)
