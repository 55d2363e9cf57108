"""A secret's record: the value of its name in the `secrets` hash, as JSON whose keys are this class's fields.

It holds the sealed value (AES-GCM nonce and ciphertext, base64), which key sealed it, who set it and when: never
the value itself (piloop_server/secrets.py seals and opens).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from typing import Any


@dataclass(frozen=True)
class SecretRecord:
    name: str
    created_ms: int
    updated_ms: int
    by: str
    key_id: str  # a hash prefix of the key that sealed it
    nonce: str  # base64 of the 96-bit nonce, new at each seal
    sealed: str  # base64 of the ciphertext and its tag; the name is its associated data

    def to_redis(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_redis(cls, raw: bytes | str) -> SecretRecord:
        data: dict[str, Any] = json.loads(raw)
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})
