"""The names Redis holds, read for the start-up check (piloop_server.tokens.check_stored_names)."""

from __future__ import annotations

import redis

from piloop_server.state.keys import Keys
from piloop_server.state.tokens import TokensState


class NamesState:
    """The names of tokens and workers Redis holds."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.r = client
        self.k = keys

    def stored(self) -> list[tuple[str, str]]:
        """Every (kind, name) Redis holds: each token's name and each registered worker's."""
        workers = sorted(n.decode() if isinstance(n, bytes) else n for n in self.r.smembers(self.k.workers()))
        return [*(("token", n) for n in TokensState(self.r, self.k).names()), *(("worker", n) for n in workers)]
