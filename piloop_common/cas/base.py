"""The `Store` interface: every provider implements a few primitives, this class does the rest.

Public methods parse addresses first (so a bad one is refused before any I/O) and verify every
read against its address; providers only move bytes.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from piloop_common.cas.address import address_of, hash_file, parse_address
from piloop_common.cas.spool import Readable, spool
from piloop_common.errors import BlobMissing, Corrupt, StoreError
from piloop_common.files import temp_beside


@dataclass
class Blob:
    """An open blob: its size and its bytes in chunks, not yet verified."""

    size: int
    chunks: Iterator[bytes]


@dataclass(frozen=True)
class Listed:
    """A stored blob as a listing gives it: its address, size, and when it was last written (epoch seconds)."""

    address: str
    size: int
    modified: float


class Store(ABC):
    """A content-addressed store of blobs, keyed `sha256:<hex>`."""

    #: Names the backend in messages (a directory, a bucket URL, a server URL).
    where: str = "?"
    #: Where unknown-hash data is spooled before it is stored (None: the system temp dir).
    spool_dir: Path | None = None

    def _spool(self) -> Path:
        """The spool directory of a store that keeps one on disk (local, cached)."""
        if self.spool_dir is None:
            raise TypeError(f"{type(self).__name__} keeps no spool directory")
        self.spool_dir.mkdir(parents=True, exist_ok=True)
        return self.spool_dir

    # -- primitives each provider implements ------------------------------------------------

    @abstractmethod
    def _store(self, address: str, path: Path, owned: bool) -> None:
        """Keep the file at `path`, which hashes to `address`; `owned` means it may be moved away."""

    @abstractmethod
    def _open(self, address: str) -> AbstractContextManager[Blob]:
        """The blob's bytes; `BlobMissing` if absent (raised on enter, before any byte)."""

    @abstractmethod
    def _has_many(self, addresses: list[str]) -> set[str]: ...

    @abstractmethod
    def _size(self, address: str) -> int: ...

    @abstractmethod
    def identity(self) -> str:
        """The store's random id, from its identity object (created once, on first use)."""

    def close(self) -> None:
        """Release clients and pools."""

    def hold_when_away(self) -> bool:
        """From now on keep a put that the remote does not answer, for `flush` to send (`cached`); whether this store
        can. Only for a caller that flushes before naming a blob to anyone (the worker)."""
        return False

    def flush(self) -> int:
        """Put what this store kept while its remote did not answer (`cached`); how many blobs. None elsewhere."""
        return 0

    # -- the garbage collector's side (piloop_server/cas_gc.py): providers that can be swept override these

    def _list(self, after: str | None) -> Iterator[Listed]:
        """Every blob, by address in order, from the first one after `after`."""
        raise StoreError(f"the {type(self).__name__} at {self.where} cannot list its blobs")

    def _delete(self, addresses: list[str], before: float) -> list[str]:
        """Remove these blobs (not one rewritten since `before`, where the backend tells it cheaply)."""
        raise StoreError(f"the {type(self).__name__} at {self.where} cannot delete blobs")

    def _touch(self, addresses: list[str]) -> set[str]:
        """Which of `addresses` the store holds, each one's last-put time set to now (what a put of it does)."""
        raise StoreError(f"the {type(self).__name__} at {self.where} cannot refresh blobs")

    # -- the interface ----------------------------------------------------------------------

    def put_stream(self, fileobj: Readable, expect: str | None = None) -> str:
        """Store everything left in `fileobj`; with `expect`, refuse (`Corrupt`) data that hashes otherwise."""
        if expect is not None:
            expect = parse_address(expect)
        with spool(fileobj, self.spool_dir) as spooled:
            if expect is not None and spooled.address != expect:
                raise Corrupt(
                    f"the data hashes to {spooled.address}, not {expect}", address=expect, actual=spooled.address
                )
            self._store(spooled.address, spooled.path, owned=True)
            return spooled.address

    def put_bytes(self, data: bytes) -> str:
        return self.put_stream(io.BytesIO(data))

    def put_file(self, path: str | os.PathLike[str]) -> str:
        """Store a file without copying it first: hash it, then hand the file itself to the backend."""
        address = hash_file(path)
        self._store(address, Path(path), owned=False)
        return address

    def open(self, address: str) -> AbstractContextManager[Blob]:
        """The raw, unverified bytes (for relaying them: the final reader verifies)."""
        return self._open(parse_address(address))

    def get_to(self, address: str, fileobj: BinaryIO) -> int:
        """Write the blob to `fileobj` as it arrives; `Corrupt` at the end if it does not hash to `address`.

        The caller's file may then hold bad bytes: use `get_file` to get all or nothing.
        """
        address = parse_address(address)
        digest = hashlib.sha256()
        written = 0
        with self._open(address) as blob:
            for chunk in blob.chunks:
                digest.update(chunk)
                fileobj.write(chunk)
                written += len(chunk)
        if (actual := address_of(digest)) != address:
            raise Corrupt(
                f"blob {address} in {self.where} is corrupt: its bytes hash to {actual}", address=address, actual=actual
            )
        return written

    def get_file(self, address: str, path: str | os.PathLike[str], durable: bool = True, in_place: bool = False) -> int:
        """Write the blob to `path` atomically: a temp file beside it, renamed only once verified; `durable`: fsynced
        first (a job's inputs need not be: a machine that crashes reruns the job, which fetches them again).
        `in_place`: straight to `path`, removed on a failure (a job's input: nothing reads it before the job starts,
        and a job whose input failed never does), sparing a file made and renamed on the disk."""
        if in_place:
            try:
                with open(path, "wb") as out:
                    return self.get_to(address, out)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(path)
                raise
        fd, name = temp_beside(path)
        try:
            with os.fdopen(fd, "wb") as out:
                size = self.get_to(address, out)
                out.flush()
                if durable:
                    os.fsync(out.fileno())
            os.replace(name, path)
            return size
        except BaseException:
            try:
                os.unlink(name)
            except FileNotFoundError:
                pass
            raise

    def get_bytes(self, address: str) -> bytes:
        buf = io.BytesIO()
        self.get_to(address, buf)
        return buf.getvalue()

    def has_many(self, addresses: Iterable[str]) -> set[str]:
        """Which of `addresses` the store holds, asked in one batch."""
        parsed = list(dict.fromkeys(parse_address(a) for a in addresses))
        return self._has_many(parsed) if parsed else set()

    def touch_many(self, addresses: Iterable[str]) -> set[str]:
        """Which of `addresses` the store holds, each one's grace restarted as a put of it would (`cas serve`'s
        answer to an `http` client that skips uploading what the server has)."""
        parsed = list(dict.fromkeys(parse_address(a) for a in addresses))
        return self._touch(parsed) if parsed else set()

    def has(self, address: str) -> bool:
        return bool(self.has_many([address]))

    def size(self, address: str) -> int:
        return self._size(parse_address(address))

    def sizes(self, addresses: Iterable[str]) -> dict[str, int]:
        """The sizes of those of `addresses` the store holds (one it lacks is left out): one lookup each (a stat for
        `local`, a HEAD for `s3` and `http`)."""
        out = {}
        for a in dict.fromkeys(parse_address(a) for a in addresses):
            try:
                out[a] = self._size(a)
            except BlobMissing:
                continue
        return out

    def blobs(self, after: str | None = None) -> Iterator[Listed]:
        """Every blob the store holds, by address in order, from the first one after `after`."""
        return self._list(parse_address(after) if after is not None else None)

    def delete_blobs(self, addresses: Iterable[str], before: float) -> list[str]:
        """Remove these blobs; the addresses removed (one already gone counts). `before` (epoch seconds): a blob
        written or put again since then is kept, where the backend can tell at the moment it deletes (`local`)."""
        parsed = list(dict.fromkeys(parse_address(a) for a in addresses))
        return self._delete(parsed, before) if parsed else []

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
