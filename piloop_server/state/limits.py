"""The limits in Redis: the `limits` hash, key (`executor.pools.serve.evaluations`) -> record."""

from __future__ import annotations

import redis

from piloop_server.state.keys import Keys
from piloop_server.state.records.limit import Limit


class LimitsState:
    """The limits' records."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.r = client
        self.k = keys

    def every(self) -> dict[str, Limit]:
        """Every stored limit, as stored: whether it still fits the schema is the caller's to say."""
        out: dict[str, Limit] = {}
        for k, v in self.r.hgetall(self.k.limits()).items():
            out[k.decode() if isinstance(k, bytes) else k] = Limit.from_redis(v)
        return out

    def put(self, key: str, limit: Limit) -> None:
        self.r.hset(self.k.limits(), key, limit.to_redis())

    def remove(self, key: str) -> bool:
        """Drop a limit: False when none was stored."""
        return bool(self.r.hdel(self.k.limits(), key))
