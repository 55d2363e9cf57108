"""The CAS garbage collector's reads of Redis: every blob address the namespace holds, and the lock of its sweep.

The mark does not know which record names which blob: it SCANs every key under the namespace's prefix (jobs, their
logs, campaigns and their bundle caches, reports, rq's task records under `rq_prefix()`, the events stream) and
reads each value by its type, collecting whatever spells `sha256:<64 hex>`. A record added later is covered without
a change here. rq keeps a task's arguments zlib-compressed: such a value is read inflated too.
"""

from __future__ import annotations

import re
import secrets
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import redis

from piloop_server.state.keys import Keys

ADDRESS = re.compile(rb"sha256:[0-9a-f]{64}")
# a workspace manifest's address, in JSON (a job's spec or result) or as the campaign record's field
_WORKSPACE_JSON = re.compile(rb'"workspace"\s*:\s*"(sha256:[0-9a-f]{64})"')
_WORKSPACE_FIELD = b"workspace"
SCAN_COUNT = 1000  # keys a SCAN call asks for, and how many are read in one pipeline
PAGE = 1000  # entries of a list or stream read a call
ZLIB = (b"\x78\x01", b"\x78\x5e", b"\x78\x9c", b"\x78\xda")  # the zlib headers, for rq's compressed task data


@dataclass
class Marked:
    """What one mark found: every address named, the ones that are workspace manifests, and how many keys it read."""

    addresses: set[str] = field(default_factory=set)
    manifests: set[str] = field(default_factory=set)
    keys: int = 0

    def add(self, value: bytes | str) -> None:
        if isinstance(value, str):
            value = value.encode()
        self.addresses.update(m.decode() for m in ADDRESS.findall(value))
        if b'"workspace"' in value:
            self.manifests.update(m.decode() for m in _WORKSPACE_JSON.findall(value))
        if value[:2] in ZLIB:
            try:
                inflated = zlib.decompress(value)
            except zlib.error:
                return
            self.add(inflated)

    def update(self, other: Marked) -> None:
        self.addresses |= other.addresses
        self.manifests |= other.manifests
        self.keys += other.keys


class ReferencesState:
    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.r = client
        self.k = keys

    def last_gc_ms(self) -> int | None:
        """When the last garbage collection ended (epoch ms), or None if none has."""
        raw = self.r.get(self.k.cas_gc_last())
        return int(raw) if raw is not None and _text(raw).isdigit() else None

    def gc_ended(self) -> None:
        self.r.set(self.k.cas_gc_last(), str(int(time.time() * 1000)))

    def mark(self, between: Callable[[], None] | None = None) -> Marked:
        """Every blob address that any key of the namespace holds (keys that exist for the whole SCAN are all read;
        one made meanwhile may or may not be: the collector marks twice, around its listing). `between` is called
        after each batch of keys (the collector renews its lock there)."""
        out = Marked()
        for batch in _batches(self.r.scan_iter(match=_glob(self.k.prefix()) + "*", count=SCAN_COUNT), SCAN_COUNT):
            self._read(batch, out)
            if between is not None:
                between()
        return out

    def _read(self, keys: list[bytes], out: Marked) -> None:
        pipe = self.r.pipeline(transaction=False)
        for key in keys:
            pipe.type(key)
        types = [_text(t) for t in pipe.execute()]
        pipe = self.r.pipeline(transaction=False)
        plain: list[tuple[bytes, str]] = []
        for key, kind in zip(keys, types, strict=True):
            if kind == "string":
                pipe.get(key)
            elif kind == "hash":
                pipe.hgetall(key)
            else:
                continue
            plain.append((key, kind))
        for (_, kind), value in zip(plain, pipe.execute(), strict=True):
            if kind == "string" and isinstance(value, bytes):
                out.add(value)
            elif kind == "hash" and isinstance(value, dict):
                for name, v in value.items():
                    out.add(v)
                    if name == _WORKSPACE_FIELD and isinstance(v, bytes) and ADDRESS.fullmatch(v):
                        out.manifests.add(v.decode())
        for key, kind in zip(keys, types, strict=True):
            for value in self._members(key, kind):
                out.add(value)
        out.keys += len(keys)

    def _members(self, key: bytes, kind: str) -> Iterator[bytes | str]:
        """The values of a list, set, sorted set or stream, a page at a time."""
        if kind == "list":
            start = 0
            while page := self.r.lrange(key, start, start + PAGE - 1):
                yield from page
                start += PAGE
        elif kind == "set":
            yield from self.r.sscan_iter(key, count=PAGE)
        elif kind == "zset":
            yield from (member for member, _ in self.r.zscan_iter(key, count=PAGE))
        elif kind == "stream":
            after = "-"
            while entries := self.r.xrange(key, min=after, max="+", count=PAGE):
                for entry_id, fields in entries:
                    yield from (fields or {}).values()
                    after = "(" + _text(entry_id or b"")
                if len(entries) < PAGE:
                    return


class GcLock:
    """The one sweep at a time: SET NX with a TTL, renewed while the sweep runs, removed only by its holder."""

    def __init__(self, client: redis.Redis, keys: Keys, ttl_seconds: float) -> None:
        self.r = client
        self.key = keys.cas_gc_lock()
        self.ttl_ms = max(1, int(ttl_seconds * 1000))
        self.token = secrets.token_hex(16)

    def acquire(self) -> bool:
        """True when this sweep now holds the lock; False when another does."""
        return bool(self.r.set(self.key, self.token, nx=True, px=self.ttl_ms))

    def renew(self) -> bool:
        """Push the TTL back while this sweep holds the lock; False when it lapsed (another may hold it now)."""
        with self.r.pipeline(transaction=True) as pipe:
            try:
                pipe.watch(self.key)
                if pipe.get(self.key) != self.token.encode():
                    return False
                pipe.multi()
                pipe.pexpire(self.key, self.ttl_ms)
                pipe.execute()
                return True
            except redis.WatchError:
                return False

    def release(self) -> None:
        """Remove the lock if this sweep still holds it."""
        with self.r.pipeline(transaction=True) as pipe:
            try:
                pipe.watch(self.key)
                if pipe.get(self.key) == self.token.encode():
                    pipe.multi()
                    pipe.delete(self.key)
                    pipe.execute()
            except redis.WatchError:
                pass

    def holder(self) -> bool:
        return bool(self.r.get(self.key) == self.token.encode())


def _batches(it: Iterable[bytes], n: int) -> Iterator[list[bytes]]:
    batch: list[bytes] = []
    for item in it:
        batch.append(item)
        if len(batch) == n:
            yield batch
            batch = []
    if batch:
        yield batch


def _glob(text: str) -> str:
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)


def _text(v: bytes | str) -> str:
    return v.decode() if isinstance(v, bytes) else v
