"""Tokens: `plt_` + 32 random bytes, shown once, kept as a SHA-256 hash. A worker's names a worker (and may bind
it to a pool); a role token (`role`: viewer, operator or admin) is a person's or a program's, and never a worker's.

A token the server verified is trusted for `cache_seconds` without reading Redis again (a heartbeat then costs no
token read). So a token revoked by another server (or by hand in Redis) is refused within `cache_seconds`; one
revoked or replaced through this server at once; an expired one at once (expiry is checked on every call).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from piloop_common.errors import BadRequest, Conflict, NotFound, Refused
from piloop_common.names import check_name, problem
from piloop_server.state.connection import Client
from piloop_server.state.keys import Keys
from piloop_server.state.names import NamesState
from piloop_server.state.records.token import Token
from piloop_server.state.tokens import TokensState

PREFIX = "plt_"
CACHE_SECONDS = 2.0  # the server's bound: a token revoked elsewhere is refused within this
PRUNE_AT = 4096  # cached entries beyond which the stale ones are dropped (each live token has one at most)

TokenRecord = Token  # the name callers knew


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _live(rec: Token) -> Token:
    if rec.expires_ms is not None and rec.expires_ms < time.time() * 1000:
        raise Refused(f"token {rec.name} expired")
    return rec


class TokenStore:
    def __init__(self, client: Client, keys: Keys, cache_seconds: float = 0.0) -> None:
        self.r = client
        self.k = keys
        self.stored = TokensState(client, keys)
        self.cache_seconds = cache_seconds
        self._cache: dict[str, tuple[Token, float]] = {}  # token hash -> its live record, when its read was sent
        self._lock = threading.Lock()
        self._forgotten = 0  # bumped by each revoke here: a read begun before one caches nothing

    def create(
        self,
        name: str,
        *,
        by: str,
        pool: str | None = None,
        expires_seconds: float | None = None,
        rename: bool = False,
        role: str | None = None,
    ) -> str:
        """Make a token and return it: the only time anyone sees it."""
        check_name("token", name)
        if role is not None and (pool is not None or rename):
            raise BadRequest(f"token {name}: --role makes a person's token; --pool and --rename are for workers'")
        token = PREFIX + secrets.token_urlsafe(32)
        now = int(time.time() * 1000)
        rec = Token(
            name,
            hash_token(token),
            now,
            by,
            pool,
            now + int(expires_seconds * 1000) if expires_seconds else None,
            False,
            rename,
            role,
        )
        old = self.stored.create(rec)
        if old is not None and not old.revoked:
            raise Conflict(f"token {name} exists: revoke it first (`piloop token revoke {name}`)")
        if old is not None:
            self._forget(old.hash)
        return token

    def get(self, name: str) -> Token | None:
        return self.stored.get(name)

    def every(self) -> list[Token]:
        return self.stored.every()

    def revoke(self, name: str) -> Token:
        rec = self.stored.revoke(name)
        if rec is None:
            raise NotFound(f"no token named {name} (see `piloop token list`)")
        self._forget(rec.hash)
        return rec

    def purge(self) -> list[Token]:
        """Remove the revoked tokens' records: they are then unknown, as tokens never made."""
        gone = self.stored.purge_revoked()
        for rec in gone:
            self._forget(rec.hash)
        return gone

    def known(self, token: str) -> Token | None:
        """`check` without reading Redis: the record of a token verified within `cache_seconds`, None when it must
        be read (Refused as `check` when it is no token or has expired)."""
        if not token.startswith(PREFIX):
            raise Refused("this is not a piloop token (they start with plt_)")
        hit = self._cache.get(hash_token(token)) if self.cache_seconds else None
        if hit is None or time.monotonic() - hit[1] >= self.cache_seconds:
            return None
        return _live(hit[0])

    def check(self, token: str) -> Token:
        """The record of a live token, or Refused saying why it is not one."""
        rec = self.known(token)
        if rec is not None:
            return rec
        h = hash_token(token)
        sent, forgotten = time.monotonic(), self._forgotten
        rec = self.stored.by_hash(h)
        # compare in constant time even though the lookup was by hash: the record is the truth
        if rec is None or not hmac.compare_digest(rec.hash, h):
            raise Refused("the server does not know this token")
        if rec.revoked:
            raise Refused(f"token {rec.name} was revoked")
        if self.cache_seconds:
            self._remember(h, rec, sent, forgotten)
        return _live(rec)

    def _remember(self, h: str, rec: Token, sent: float, forgotten: int) -> None:
        with self._lock:
            if forgotten != self._forgotten:
                return  # a revoke here raced this read: its record may be the one from before
            if len(self._cache) >= PRUNE_AT:
                now = time.monotonic()
                self._cache = {k: v for k, v in self._cache.items() if now - v[1] < self.cache_seconds}
            self._cache[h] = (rec, sent)

    def _forget(self, h: str) -> None:
        with self._lock:
            self._forgotten += 1
            self._cache.pop(h, None)


def check_stored_names(client: Client, keys: Keys) -> None:
    """At start: Conflict naming the first token or worker name in Redis that the name rule refuses (one made
    before the rule), and how to remove it, since such a name may collide with another key."""
    for kind, name in NamesState(client, keys).stored():
        # the daemon's own worker `serve` registers over the socket: the reserved names are its
        why = problem(name, reserved_ok=kind == "worker")
        if why:
            where = (
                f"HDEL {keys.tokens()} <name> and its hash in {keys.token_hashes()}"
                if kind == "token"
                else f"SREM {keys.workers()} <name> and its keys"
            )
            raise Conflict(
                f"Redis holds the {kind} name {name[:80]!r}, which piloop now refuses ({why}): "
                f"remove it by hand ({where}), then start again"
            )


def open_namer(settings: Any, home: Path) -> Callable[[str], str | None]:
    """For `piloop cas serve`: the name of a live worker, operator or admin token, None for anything else."""
    from piloop_server.state.connection import connect

    store = TokenStore(connect(settings, home, start_embedded=False), Keys(settings.namespace))

    def name_of(token: str) -> str | None:
        try:
            rec = store.check(token)
        except Refused:
            return None
        # the CAS takes writes: a viewer, who may only read, is refused it
        return None if rec.role == "viewer" else rec.name

    return name_of
