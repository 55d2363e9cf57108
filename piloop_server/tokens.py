"""Worker tokens: `plt_` + 32 random bytes, shown once, kept as a SHA-256 hash.

The server keeps the tokens it verified in memory (`TokenStore(cache_seconds=…)`): a worker's heartbeat then costs
no Redis read for its token. Every half of `cache_seconds` the cache is confirmed: one GET of the tokens' version
(a counter each create and revoke bumps, in the same transaction) says whether any token changed since the records
were last read back; only then (and every READ_BACK_SECONDS) are they all read back (one HMGET for all of them).
A token not confirmed within `cache_seconds` is checked in Redis again: a token revoked or replaced by any piloop is
refused within `cache_seconds`; one revoked through this server at once; an expired one at once; one changed by
hand in Redis within READ_BACK_SECONDS.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import secrets
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import redis

from piloop_common.errors import Conflict, NotFound, Refused
from piloop_server.state.keys import Keys

PREFIX = "plt_"
CACHE_SECONDS = 2.0  # the server's bound: a token revoked elsewhere is refused within this
IDLE_SECONDS = 60.0  # a cached token unused this long is forgotten (a heartbeat comes every renew_seconds)
READ_BATCH = 1000  # token records per HMGET when the cache is confirmed
# every cached record is read back this often even when the version says nothing changed: a hand edit in Redis
# that does not bump the version is seen within this
READ_BACK_SECONDS = 60.0

log = logging.getLogger("piloop.tokens")


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _live(rec: TokenRecord) -> TokenRecord:
    if rec.expires_ms is not None and rec.expires_ms < time.time() * 1000:
        raise Refused(f"token {rec.name} expired")
    return rec


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


@dataclass
class _Verified:
    rec: TokenRecord
    raw: bytes  # the record as Redis held it: what each confirmation compares
    seen: float  # monotonic: when the read that found it live was sent
    used: float
    version: bytes | None  # the tokens' version read just before that read (None: none yet, so read it back)


class TokenStore:
    def __init__(self, client: redis.Redis, keys: Keys, cache_seconds: float = 0.0) -> None:
        self.r = client
        self.k = keys
        self.cache_seconds = cache_seconds
        self._cache: dict[str, _Verified] = {}  # token hash -> its live record
        self._lock = threading.Lock()
        self._confirming: threading.Thread | None = None
        self._forgotten = 0  # bumped by each revoke here: a check whose read began before one caches nothing
        self._read_back = time.monotonic()  # when every cached record was last read back

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
        pipe.incr(self.k.tokens_version())
        pipe.execute()
        if old is not None:
            self._forget(old.hash)
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
        pipe = self.r.pipeline(transaction=True)
        pipe.hset(self.k.tokens(), name, json.dumps(asdict(rec)))
        pipe.incr(self.k.tokens_version())
        pipe.execute()
        self._forget(rec.hash)
        return rec

    def cached(self, token: str) -> TokenRecord | None:
        """The record of a token verified within `cache_seconds`, without reading Redis; None when not cached."""
        v = self._cache.get(hash_token(token)) if self.cache_seconds and token.startswith(PREFIX) else None
        if v is None:
            return None
        now = time.monotonic()
        if now - v.seen >= self.cache_seconds:
            return None
        v.used = now
        return v.rec

    def known(self, token: str) -> TokenRecord | None:
        """`check` without reading Redis: the record of a token verified within `cache_seconds`, None when it must
        be read (Refused as `check` when it is no token or has expired)."""
        if not token.startswith(PREFIX):
            raise Refused("this is not a piloop token (they start with plt_)")
        rec = self.cached(token)
        return None if rec is None else _live(rec)

    def check(self, token: str) -> TokenRecord:
        """The record of a live token, or Refused saying why it is not one."""
        rec = self.known(token)
        if rec is not None:
            return rec
        h = hash_token(token)
        sent, forgotten = time.monotonic(), self._forgotten
        pipe = self.r.pipeline(transaction=False)
        pipe.get(self.k.tokens_version())  # before the record: a write after it shows as a new version
        pipe.hget(self.k.token_hashes(), h)
        version, name = pipe.execute()
        raw = self.r.hget(self.k.tokens(), name) if name else None
        rec = TokenRecord(**json.loads(raw)) if raw else None
        # compare in constant time even though the lookup was by hash: the record is the truth
        if rec is None or not hmac.compare_digest(rec.hash, h):
            raise Refused("the server does not know this token")
        if rec.revoked:
            raise Refused(f"token {rec.name} was revoked")
        if self.cache_seconds:
            self._remember(h, _Verified(rec, raw, sent, time.monotonic(), version), forgotten)  # type: ignore[arg-type]
        return _live(rec)

    def _remember(self, h: str, verified: _Verified, forgotten: int) -> None:
        with self._lock:
            if forgotten != self._forgotten:
                return
            self._cache[h] = verified
            if self._confirming is None or not self._confirming.is_alive():
                self._confirming = threading.Thread(target=self._confirm_forever, name="token-cache", daemon=True)
                self._confirming.start()

    def _forget(self, h: str) -> None:
        with self._lock:
            self._forgotten += 1
            self._cache.pop(h, None)

    def _confirm_forever(self) -> None:
        while True:
            time.sleep(self.cache_seconds / 2)
            try:
                self.confirm()
            except redis.RedisError as e:
                # the cached tokens age out meanwhile: calls then read Redis themselves, and fail as they would
                log.warning("event=tokens.confirm_failed error=%s", e)

    def confirm(self) -> None:
        """Confirm every cached token: one whose record was read at the tokens' version Redis still holds is live for
        another `cache_seconds` as it is (no token was written since); the others are read back, and live on if
        unchanged, else (revoked, replaced) are dropped. Tokens unused for IDLE_SECONDS are forgotten."""
        now = time.monotonic()
        with self._lock:
            for h in [h for h, v in self._cache.items() if now - v.used > IDLE_SECONDS]:
                del self._cache[h]
            items = list(self._cache.items())
        sent = time.monotonic()
        version = self.r.get(self.k.tokens_version())
        if version is None:
            # no token written since the key came in (an older server's tokens): start it, so later confirmations
            # read one key, not every record; a write anywhere moves it as ever (INCR), before or after this
            self.r.set(self.k.tokens_version(), 0, nx=True)
        current = version is not None and sent - self._read_back < READ_BACK_SECONDS
        if not current:
            self._read_back = sent
        stale = []
        with self._lock:
            for h, v in items:
                if current and v.version == version:
                    v.seen = sent  # with 1,000 workers, one GET a second where reading back parsed every record
                else:
                    stale.append((h, v))
        for i in range(0, len(stale), READ_BATCH):
            batch = stale[i:i + READ_BATCH]
            sent = time.monotonic()
            raws = self.r.hmget(self.k.tokens(), [v.rec.name for _, v in batch])
            with self._lock:
                for (h, v), raw in zip(batch, raws):
                    if raw == v.raw:
                        v.seen, v.version = sent, version  # the version was read before this read
                    elif self._cache.get(h) is v:
                        del self._cache[h]


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
