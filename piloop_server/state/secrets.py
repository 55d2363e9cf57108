"""The secrets' records in Redis: one hash, name -> `SecretRecord` (sealed values only; the crypto is in
piloop_server/secrets.py)."""

from __future__ import annotations

from collections.abc import Callable

import redis

from piloop_common.errors import Conflict
from piloop_server.state.keys import Keys
from piloop_server.state.records.codec import text as _s
from piloop_server.state.records.secret import SecretRecord

RESEAL_TRIES = 20  # a `secret set` between the read and the write makes the re-seal start again


class SecretsState:
    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.r = client
        self.k = keys

    def put(self, rec: SecretRecord) -> None:
        self.r.hset(self.k.secrets(), rec.name, rec.to_redis())

    def get(self, name: str) -> SecretRecord | None:
        raw = self.r.hget(self.k.secrets(), name)
        return SecretRecord.from_redis(raw) if raw else None

    def get_many(self, names: list[str]) -> list[SecretRecord | None]:
        """The records of `names`, in order; None for a name that has none."""
        if not names:
            return []
        raws = self.r.hmget(self.k.secrets(), names)
        return [SecretRecord.from_redis(raw) if raw else None for raw in raws]

    def names(self) -> set[str]:
        return {_s(n) for n in self.r.hkeys(self.k.secrets())}

    def all(self) -> list[SecretRecord]:
        return sorted(
            (SecretRecord.from_redis(raw) for raw in self.r.hvals(self.k.secrets())), key=lambda rec: rec.name
        )

    def remove(self, name: str) -> bool:
        """Whether there was a record to remove."""
        return bool(self.r.hdel(self.k.secrets(), name))

    def reseal_all(self, reseal: Callable[[SecretRecord], SecretRecord | None]) -> tuple[int, int]:
        """Replace every record by `reseal(record)` (None: leave it as it is) in one transaction, so that a crash
        leaves all of them as they were or all of them resealed; how many were replaced and how many left."""
        key = self.k.secrets()
        for _ in range(RESEAL_TRIES):
            with self.r.pipeline(transaction=True) as pipe:
                try:
                    pipe.watch(key)
                    recs = [SecretRecord.from_redis(raw) for raw in pipe.hvals(key)]
                    new = [reseal(rec) for rec in recs]
                    pipe.multi()
                    done = [n for n in new if n is not None]
                    if done:
                        pipe.hset(key, mapping={n.name: n.to_redis() for n in done})
                    pipe.execute()
                    return len(done), len(recs) - len(done)
                except redis.WatchError:
                    continue
        raise Conflict(f"the secrets changed under each of {RESEAL_TRIES} tries to reseal them; try again")
