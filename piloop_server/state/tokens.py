"""The tokens in Redis: `tokens` (name -> record) and `tokens:by_hash` (sha256 of the token -> name).

Writes that read first (create, purge) run under WATCH, so a token created between the read and the write is
never overwritten or purged.
"""

from __future__ import annotations

import redis

from piloop_server.state.keys import Keys
from piloop_server.state.records.codec import text as _s
from piloop_server.state.records.token import Token


def get(client: redis.Redis, keys: Keys, name: str) -> Token | None:
    raw = client.hget(keys.tokens(), name)
    return Token.from_redis(raw) if raw else None


def every(client: redis.Redis, keys: Keys) -> list[Token]:
    """Every token record, by name."""
    return sorted((Token.from_redis(v) for v in client.hvals(keys.tokens())), key=lambda t: t.name)


def names(client: redis.Redis, keys: Keys) -> list[str]:
    """Every token's name as Redis holds it (records unread: a start-up check of the names only)."""
    return sorted(_s(n) for n in client.hkeys(keys.tokens()))


def by_hash(client: redis.Redis, keys: Keys, token_hash: str) -> Token | None:
    """The record whose token hashes to `token_hash`, if any (two reads: the index, then the record)."""
    name = client.hget(keys.token_hashes(), token_hash)
    return get(client, keys, _s(name)) if name else None


def create(client: redis.Redis, keys: Keys, token: Token) -> Token | None:
    """Write `token` unless a live token has its name; the record found under the name before (None: none).
    A revoked token of the same name is replaced (its hash no longer indexed); a live one is left as it is."""
    found: list[Token | None] = []

    def write(pipe: redis.client.Pipeline) -> None:
        found.clear()
        raw = pipe.hget(keys.tokens(), token.name)
        old = Token.from_redis(raw) if raw else None
        found.append(old)
        if old is not None and not old.revoked:
            return
        pipe.multi()
        if old is not None:
            pipe.hdel(keys.token_hashes(), old.hash)
        pipe.hset(keys.tokens(), token.name, token.to_redis())
        pipe.hset(keys.token_hashes(), token.hash, token.name)

    client.transaction(write, keys.tokens())
    return found[0]


def revoke(client: redis.Redis, keys: Keys, name: str) -> Token | None:
    """Mark the token revoked (its hash stays indexed, so its worker hears why); None when there is none."""
    done: list[Token | None] = []

    def write(pipe: redis.client.Pipeline) -> None:
        done.clear()
        raw = pipe.hget(keys.tokens(), name)
        rec = Token.from_redis(raw).revoked_now() if raw else None
        done.append(rec)
        if rec is not None:
            pipe.multi()
            pipe.hset(keys.tokens(), name, rec.to_redis())

    client.transaction(write, keys.tokens())
    return done[0]


def purge_revoked(client: redis.Redis, keys: Keys) -> list[Token]:
    """Remove every revoked token's record and hash: the records removed."""
    gone: list[Token] = []

    def write(pipe: redis.client.Pipeline) -> None:
        gone.clear()
        gone.extend(t for t in (Token.from_redis(v) for v in pipe.hvals(keys.tokens())) if t.revoked)
        if not gone:
            return
        pipe.multi()
        pipe.hdel(keys.tokens(), *(t.name for t in gone))
        pipe.hdel(keys.token_hashes(), *(t.hash for t in gone))

    client.transaction(write, keys.tokens())
    return sorted(gone, key=lambda t: t.name)
