"""What crosses between Python and a Redis reply: one decoding of a reply's value, one typing of a hash's fields."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from redis.typing import EncodableT


def text(v: Any) -> str:
    """A reply's value as text: bytes decoded, nothing (a missing field) as ""."""
    return v.decode() if isinstance(v, bytes) else ("" if v is None else str(v))


def fields(values: Mapping[str, str | int | float]) -> dict[EncodableT, EncodableT]:
    """`values` as redis-py types HSET's and XADD's mapping (its key type is an invariant union; ours is str)."""
    return cast(dict[EncodableT, EncodableT], values)
