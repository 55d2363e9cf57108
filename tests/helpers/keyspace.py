"""A namespace's Redis keys and their values, to compare before and after a refused call."""

from __future__ import annotations

from typing import Any

import redis

from piloop_server.state.keys import Keys
from tests.helpers.redis import wait_for


def _value(r: redis.Redis, key: bytes) -> Any:
    kind = r.type(key).decode()
    if kind == "string":
        return r.get(key)
    if kind == "hash":
        return r.hgetall(key)
    if kind == "set":
        return sorted(r.smembers(key))
    if kind == "zset":
        return r.zrange(key, 0, -1, withscores=True)
    if kind == "list":
        return r.lrange(key, 0, -1)
    if kind == "stream":
        return r.xlen(key)
    return kind  # gone between SCAN and the read: shows as a change


def keyspace(r: redis.Redis, keys: Keys, skip: tuple[str, ...] = ()) -> dict[bytes, Any]:
    """Every key under the namespace with its value, but those whose name begins with one of `skip` (after the
    namespace's prefix): the parts a running daemon rewrites by itself (its pass's clock, its own worker's beats,
    rq's heartbeats)."""
    prefix = keys.prefix()
    out: dict[bytes, Any] = {}
    for key in r.scan_iter(match=prefix.replace("[", "\\[") + "*", count=1000):
        if not any(key.decode().startswith(prefix + s) for s in skip):
            out[key] = _value(r, key)
    return out


DAEMON_CHURN = ("daemon", "worker:serve", "rq:")


def settled(r: redis.Redis, keys: Keys, skip: tuple[str, ...] = DAEMON_CHURN, timeout: float = 20) -> dict[bytes, Any]:
    """`keyspace` once the daemon's own worker `serve` registered and two reads 0.3 s apart agree (a daemon that
    just started still writes for a moment)."""
    wait_for(lambda: r.sismember(keys.workers(), "serve"), timeout, what="the serve worker registered")
    last: list[dict[bytes, Any]] = [keyspace(r, keys, skip)]

    def same() -> dict[bytes, Any] | None:
        now = keyspace(r, keys, skip)
        agree, last[0] = now == last[0], now
        return now if agree else None

    return wait_for(same, timeout, interval=0.3, what="the namespace's keys to settle")
