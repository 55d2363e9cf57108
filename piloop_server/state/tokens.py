"""The tokens in Redis: `tokens` (name -> record) and `tokens:by_hash` (sha256 of the token -> name).

Writes that read first (create, purge) run under WATCH, so a token created between the read and the write is
never overwritten or purged.
"""

from __future__ import annotations

import redis

from piloop_server.state.keys import Keys
from piloop_server.state.records.codec import text as _s
from piloop_server.state.records.token import Token


class TokensState:
    """The tokens' records and their hash index."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.r = client
        self.k = keys

    def get(self, name: str) -> Token | None:
        raw = self.r.hget(self.k.tokens(), name)
        return Token.from_redis(raw) if raw else None

    def every(self) -> list[Token]:
        """Every token record, by name."""
        return sorted((Token.from_redis(v) for v in self.r.hvals(self.k.tokens())), key=lambda t: t.name)

    def names(self) -> list[str]:
        """Every token's name as Redis holds it (records unread: a start-up check of the names only)."""
        return sorted(_s(n) for n in self.r.hkeys(self.k.tokens()))

    def by_hash(self, token_hash: str) -> Token | None:
        """The record whose token hashes to `token_hash`, if any (two reads: the index, then the record)."""
        name = self.r.hget(self.k.token_hashes(), token_hash)
        return self.get(_s(name)) if name else None

    def create(self, token: Token) -> Token | None:
        """Write `token` unless a live token has its name; the record found under the name before (None: none).
        A revoked token of the same name is replaced (its hash no longer indexed); a live one is left as it is."""
        found: list[Token | None] = []

        def write(pipe: redis.client.Pipeline) -> None:
            found.clear()
            raw = pipe.hget(self.k.tokens(), token.name)
            old = Token.from_redis(raw) if raw else None
            found.append(old)
            if old is not None and not old.revoked:
                return
            pipe.multi()
            if old is not None:
                pipe.hdel(self.k.token_hashes(), old.hash)
            pipe.hset(self.k.tokens(), token.name, token.to_redis())
            pipe.hset(self.k.token_hashes(), token.hash, token.name)

        self.r.transaction(write, self.k.tokens())
        return found[0]

    def revoke(self, name: str) -> Token | None:
        """Mark the token revoked (its hash stays indexed, so its worker hears why); None when there is none."""
        done: list[Token | None] = []

        def write(pipe: redis.client.Pipeline) -> None:
            done.clear()
            raw = pipe.hget(self.k.tokens(), name)
            rec = Token.from_redis(raw).revoked_now() if raw else None
            done.append(rec)
            if rec is not None:
                pipe.multi()
                pipe.hset(self.k.tokens(), name, rec.to_redis())

        self.r.transaction(write, self.k.tokens())
        return done[0]

    def purge_revoked(self) -> list[Token]:
        """Remove every revoked token's record and hash: the records removed."""
        gone: list[Token] = []

        def write(pipe: redis.client.Pipeline) -> None:
            gone.clear()
            gone.extend(t for t in (Token.from_redis(v) for v in pipe.hvals(self.k.tokens())) if t.revoked)
            if not gone:
                return
            pipe.multi()
            pipe.hdel(self.k.tokens(), *(t.name for t in gone))
            pipe.hdel(self.k.token_hashes(), *(t.hash for t in gone))

        self.r.transaction(write, self.k.tokens())
        return sorted(gone, key=lambda t: t.name)
