"""The names Redis holds, read for the start-up check (piloop_server.tokens.check_stored_names)."""

from __future__ import annotations

import redis

from piloop_server.state import tokens
from piloop_server.state.keys import Keys


def stored(client: redis.Redis, keys: Keys) -> list[tuple[str, str]]:
    """Every (kind, name) Redis holds: each token's name and each registered worker's."""
    workers = sorted(n.decode() if isinstance(n, bytes) else n for n in client.smembers(keys.workers()))
    return [*(("token", n) for n in tokens.names(client, keys)), *(("worker", n) for n in workers)]
