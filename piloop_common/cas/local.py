"""The `local` provider: a directory, blobs under `blobs/ab/cd/<hex>`, written by atomic rename."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from piloop_common.cas import identity
from piloop_common.cas.address import CHUNK, hash_bytes, hex_of
from piloop_common.cas.base import Blob, Store
from piloop_common.errors import BlobMissing, StoreError

SMALL = 1 << 20  # a file up to this size is read whole and hashed before anything is written


class LocalStore(Store):
    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).expanduser()
        self.where = str(self.root)
        self._blobs = str(self.root / "blobs")
        # Temp files live inside the store so that the final rename never crosses filesystems.
        self.spool_dir = self.root / "tmp"
        self._id: str | None = None

    def path_of(self, address: str) -> Path:
        h = hex_of(address)
        return Path(f"{self._blobs}/{h[:2]}/{h[2:4]}/{h}")  # one parse, not four joins (twice a task)

    def _store(self, address: str, path: Path, owned: bool) -> None:
        final = self.path_of(address)
        if final.is_file():
            return
        try:
            final.parent.mkdir(parents=True, exist_ok=True)
            if owned:
                try:
                    _fsync_file(path)
                    os.replace(path, final)
                except OSError:  # another filesystem: copy instead
                    self._copy_in(path, final)
            else:
                self._copy_in(path, final)
            _fsync_dir(final.parent)
        except OSError as e:
            raise StoreError(f"cannot write blob {address} to {self.where}: {e}", address=address) from e

    def _copy_in(self, source: Path, final: Path) -> None:
        # A concurrent writer of the same blob renames over ours: same bytes, so either wins.
        fd, name = tempfile.mkstemp(prefix=".copy-", dir=self._spool())
        try:
            with os.fdopen(fd, "wb") as out, open(source, "rb") as src:
                shutil.copyfileobj(src, out, CHUNK)
                out.flush()
                os.fsync(out.fileno())
            os.replace(name, final)
        finally:
            Path(name).unlink(missing_ok=True)

    def put_file(self, path: str | os.PathLike[str]) -> str:
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size <= SMALL:
                return self.put_bytes(f.read())
            # one pass (hash while copying) beats hashing a large file and then copying it
            return self.put_stream(f)

    def put_bytes(self, data: bytes) -> str:
        # hashed first: a blob the store has costs one stat, not a temp file written and removed again
        address = hash_bytes(data)
        if self.path_of(address).is_file():
            return address
        try:
            fd, name = tempfile.mkstemp(prefix=".spool-", dir=self._spool())
            with os.fdopen(fd, "wb") as out:
                out.write(data)
        except OSError as e:
            raise StoreError(f"cannot write blob {address} to {self.where}: {e}", address=address) from e
        try:
            self._store(address, Path(name), owned=True)
        finally:
            Path(name).unlink(missing_ok=True)
        return address

    @contextmanager
    def _open(self, address: str) -> Iterator[Blob]:
        try:
            f = open(self.path_of(address), "rb")
        except FileNotFoundError:
            raise BlobMissing(f"blob {address} is not in {self.where}", address=address) from None
        except OSError as e:
            raise StoreError(f"cannot read blob {address} from {self.where}: {e}", address=address) from e
        with f:
            yield Blob(os.fstat(f.fileno()).st_size, iter(lambda: f.read(CHUNK), b""))

    def _has_many(self, addresses: list[str]) -> set[str]:
        return {a for a in addresses if self.path_of(a).is_file()}

    def _size(self, address: str) -> int:
        try:
            return self.path_of(address).stat().st_size
        except FileNotFoundError:
            raise BlobMissing(f"blob {address} is not in {self.where}", address=address) from None

    def discard(self, address: str) -> None:
        """Remove a blob (the cache's eviction; a plain store never deletes)."""
        self.path_of(address).unlink(missing_ok=True)

    def identity(self) -> str:
        if self._id is None:
            self._id = identity.id_from(self._identity_bytes(), self.where)
        return self._id

    def _identity_bytes(self) -> bytes:
        final = self.root / identity.NAME
        try:
            return final.read_bytes()
        except FileNotFoundError:
            pass
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            fd, name = tempfile.mkstemp(prefix=".identity-", dir=self.root)
            try:
                with os.fdopen(fd, "wb") as out:
                    out.write(identity.new_document())
                    out.flush()
                    os.fsync(out.fileno())
                # link() fails if the name exists: the first of two racing processes wins, whole.
                os.link(name, final)
                _fsync_dir(self.root)
            except FileExistsError:
                pass
            finally:
                Path(name).unlink(missing_ok=True)
            return final.read_bytes()
        except OSError as e:
            raise StoreError(f"cannot create the identity object in {self.where}: {e}") from e


def _fsync_file(path: Path) -> None:
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
