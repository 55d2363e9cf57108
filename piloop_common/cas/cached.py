"""The `cached` provider: a local LRU directory in front of any other store.

Writes go to the remote first and then to the cache (write-through), so a put that the remote
refused, or that did not reach it, fails and is never reported stored. A worker's store (`hold_when_away`)
keeps a put made while the remote does not answer (`Unavailable`: a `piloop cas serve` whose daemon is
stopped) in `pending/` instead, outside the LRU, and `flush` puts it to the remote: the worker flushes
before any call that names blobs (a report, a log append), so the server never hears of a blob its CAS
lacks, and a job that ends while both are away still has its report built and spooled. Reads fill the cache. Each read touches the
blob's mtime, and eviction removes the least recently touched blobs until the cache is under
its limit: the directory itself is the index, so processes sharing a cache agree on it.
"""

from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from piloop_common.cas.address import CHUNK
from piloop_common.cas.base import Blob, Listed, Store
from piloop_common.cas.local import LocalStore
from piloop_common.errors import Corrupt, Unavailable


class CachedStore(Store):
    def __init__(self, remote: Store, root: str | os.PathLike[str], max_bytes: int) -> None:
        self.remote = remote
        self.cache = LocalStore(root)
        self.pending = LocalStore(Path(root) / "pending")  # put while the remote was away: `flush` sends them
        self.holds = False
        self.max_bytes = max_bytes
        self.where = remote.where
        self.spool_dir = self.cache.spool_dir
        self._lock = threading.Lock()
        self._total: int | None = None  # this process's running estimate; rescanned when over the limit

    def close(self) -> None:
        self.remote.close()

    def identity(self) -> str:
        return self.remote.identity()

    def _store(self, address: str, path: Path, owned: bool) -> None:
        try:
            self.remote._store(address, path, owned=False)
        except Unavailable:
            if not self.holds:
                raise
            self.pending._store(address, path, owned)
            return
        self._admit(address, path, owned)

    def hold_when_away(self) -> bool:
        self.holds = True
        return True

    def flush(self) -> int:
        """Put every blob kept while the remote was away to it; how many. `Unavailable` while it still is."""
        sent = 0
        for path in self._pending_paths():
            address = f"sha256:{path.name}"
            self.remote._store(address, path, owned=False)
            self._admit(address, path, owned=False)
            self.pending.discard(address)
            sent += 1
        return sent

    def _pending_paths(self) -> list[Path]:
        return [
            Path(e) for shard in _subdirs(self.pending.root / "blobs") for sub in _subdirs(shard) for e in _files(sub)
        ]

    @contextmanager
    def _open(self, address: str) -> Iterator[Blob]:
        try:
            f: BinaryIO = open(self.pending.path_of(address), "rb")
        except FileNotFoundError:
            pass
        else:
            with f:
                yield Blob(os.fstat(f.fileno()).st_size, iter(lambda: f.read(CHUNK), b""))
            return
        try:
            f = open(self.cache.path_of(address), "rb")
            os.utime(f.fileno())  # the last access, for eviction
        except FileNotFoundError:
            f = self._fetch(address)
        # Once open, the bytes stay readable even if another process evicts the file.
        with f:
            yield Blob(os.fstat(f.fileno()).st_size, iter(lambda: f.read(CHUNK), b""))

    def get_to(self, address: str, fileobj: BinaryIO) -> int:
        try:
            return super().get_to(address, fileobj)
        except Corrupt:
            # A copy that rotted on this disk must not be served twice: the next read refetches it.
            self.cache.discard(address)
            raise

    def _fetch(self, address: str) -> BinaryIO:
        """Download a blob (verified by the remote's reader) into the cache, and open it."""
        fd, name = tempfile.mkstemp(prefix=".fetch-", dir=self._spool())
        os.close(fd)
        temp = Path(name)
        try:
            self.remote.get_file(address, temp)
            f = open(temp, "rb")
            self._admit(address, temp, owned=True)  # too big to keep: read once from the unlinked temp
            return f
        finally:
            temp.unlink(missing_ok=True)

    def _has_many(self, addresses: list[str]) -> set[str]:
        # The remote is the truth: a blob it lost is missing, whatever the cache still holds.
        return self.remote._has_many(addresses)

    def _touch(self, addresses: list[str]) -> set[str]:
        return self.remote._touch(addresses)  # the remote's grace is the one the collector reads

    def _list(self, after: str | None) -> Iterator[Listed]:
        return self.remote._list(after)

    def _delete(self, addresses: list[str], before: float) -> list[str]:
        # The garbage collector sweeps the remote; the cache keeps its own LRU and evicts by it.
        return self.remote._delete(addresses, before)

    def _size(self, address: str) -> int:
        for path in (self.pending.path_of(address), self.cache.path_of(address)):
            if path.is_file():
                return path.stat().st_size
        return self.remote._size(address)

    # -- the LRU ----------------------------------------------------------------------------

    def _admit(self, address: str, path: Path, owned: bool) -> bool:
        """Keep a blob in the cache if it fits the limit at all, then evict down to the limit."""
        size = path.stat().st_size
        if size > self.max_bytes:
            return False
        self.cache._store(address, path, owned)
        with self._lock:
            self._total = self._scan()[1] if self._total is None else self._total + size
            if self._total > self.max_bytes:
                self._evict()
        return True

    def _scan(self) -> tuple[list[tuple[float, int, str]], int]:
        entries = []
        for shard in _subdirs(self.cache.root / "blobs"):
            for sub in _subdirs(shard):
                with os.scandir(sub) as it:
                    for entry in it:
                        try:
                            st = entry.stat()
                        except FileNotFoundError:  # evicted by another process meanwhile
                            continue
                        entries.append((st.st_mtime, st.st_size, entry.path))
        return entries, sum(e[1] for e in entries)

    def _evict(self) -> None:
        entries, total = self._scan()
        entries.sort()
        for _, size, path in entries:
            if total <= self.max_bytes:
                break
            # A reader that has the file open keeps its bytes: unlink is safe under it.
            Path(path).unlink(missing_ok=True)
            total -= size
        self._total = total


def _subdirs(path: Path | str) -> list[str]:
    try:
        with os.scandir(path) as it:
            return [e.path for e in it if e.is_dir()]
    except FileNotFoundError:
        return []


def _files(path: str) -> list[str]:
    with os.scandir(path) as it:
        return [e.path for e in it if e.is_file() and not e.name.startswith(".")]
