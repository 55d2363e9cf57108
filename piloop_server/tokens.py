"""Worker tokens: `plt_` + 32 random bytes, shown once, kept as a SHA-256 hash."""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import redis

from piloop_common.errors import Conflict, NotFound, Refused
from piloop_server.state.keys import Keys

PREFIX = "plt_"


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass
class TokenRecord:
    name: str
    hash: str
    created_ms: int
    by: str
    pool: str | None = None
    expires_ms: int | None = None
    revoked: bool = False
    rename: bool = False


class TokenStore:
    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.r = client
        self.k = keys

    def create(self, name: str, *, by: str, pool: str | None = None, expires_seconds: float | None = None,
               rename: bool = False) -> str:
        """Make a token and return it: the only time anyone sees it."""
        token = PREFIX + secrets.token_urlsafe(32)
        now = int(time.time() * 1000)
        rec = TokenRecord(name, hash_token(token), now, by, pool,
                          now + int(expires_seconds * 1000) if expires_seconds else None, False, rename)
        old = self.get(name)
        if old is not None and not old.revoked:
            raise Conflict(f"token {name} exists: revoke it first (`piloop token revoke {name}`)")
        pipe = self.r.pipeline(transaction=True)
        if old is not None:
            pipe.hdel(self.k.token_hashes(), old.hash)
        pipe.hset(self.k.tokens(), name, json.dumps(asdict(rec)))
        pipe.hset(self.k.token_hashes(), rec.hash, name)
        pipe.execute()
        return token

    def get(self, name: str) -> TokenRecord | None:
        raw = self.r.hget(self.k.tokens(), name)
        return TokenRecord(**json.loads(raw)) if raw else None

    def list(self) -> list[TokenRecord]:
        return sorted((TokenRecord(**json.loads(v)) for v in self.r.hvals(self.k.tokens())), key=lambda t: t.name)

    def revoke(self, name: str) -> TokenRecord:
        rec = self.get(name)
        if rec is None:
            raise NotFound(f"no token named {name} (see `piloop token list`)")
        rec.revoked = True
        self.r.hset(self.k.tokens(), name, json.dumps(asdict(rec)))
        return rec

    def check(self, token: str) -> TokenRecord:
        """The record of a live token, or Refused saying why it is not one."""
        if not token.startswith(PREFIX):
            raise Refused("this is not a piloop token (they start with plt_)")
        h = hash_token(token)
        name = self.r.hget(self.k.token_hashes(), h)
        rec = self.get(name.decode()) if name else None
        # compare in constant time even though the lookup was by hash: the record is the truth
        if rec is None or not hmac.compare_digest(rec.hash, h):
            raise Refused("the server does not know this token")
        if rec.revoked:
            raise Refused(f"token {rec.name} was revoked")
        if rec.expires_ms is not None and rec.expires_ms < time.time() * 1000:
            raise Refused(f"token {rec.name} expired")
        return rec


def open_verifier(settings, home: Path) -> Callable[[str], bool]:
    """For `piloop cas serve`: accepts a bearer token when it is a live piloop token."""
    from piloop_server.redisconn import connect

    store = TokenStore(connect(settings, home, start_embedded=False), Keys(settings.namespace))

    def verify(token: str) -> bool:
        try:
            store.check(token)
            return True
        except Refused:
            return False

    return verify
