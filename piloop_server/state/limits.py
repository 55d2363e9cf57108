"""The limits in Redis: the `limits` hash, key (`executor.pools.serve.evaluations`) -> record."""

from __future__ import annotations

import redis

from piloop_server.state.keys import Keys
from piloop_server.state.records.limit import Limit


def every(client: redis.Redis, keys: Keys) -> dict[str, Limit]:
    """Every stored limit, as stored: whether it still fits the schema is the caller's to say."""
    out: dict[str, Limit] = {}
    for k, v in client.hgetall(keys.limits()).items():
        out[k.decode() if isinstance(k, bytes) else k] = Limit.from_redis(v)
    return out


def put(client: redis.Redis, keys: Keys, key: str, limit: Limit) -> None:
    client.hset(keys.limits(), key, limit.to_redis())


def remove(client: redis.Redis, keys: Keys, key: str) -> bool:
    """Drop a limit: False when none was stored."""
    return bool(client.hdel(keys.limits(), key))
