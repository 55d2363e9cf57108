"""The `local` provider: a directory, blobs under `blobs/ab/cd/<hex>`, written by atomic rename.

A put of a blob already there touches its mtime: the garbage collector's grace counts from the last put, and its
delete moves a blob aside before it removes it, so a put either touched it first (and it is put back) or finds it
gone (and writes it again).
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from piloop_common.cas import identity
from piloop_common.cas.address import CHUNK, hash_bytes, hex_of
from piloop_common.cas.base import Blob, Listed, Store
from piloop_common.errors import BlobMissing, StoreError

SMALL = 1 << 20  # a file up to this size is read whole and hashed before anything is written
_HEX = re.compile(r"[0-9a-f]{64}")


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
        if _refresh(final):
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
        # hashed first: a blob the store has costs one utime (its grace restarts), not a temp file written and removed
        address = hash_bytes(data)
        if _refresh(self.path_of(address)):
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

    def _touch(self, addresses: list[str]) -> set[str]:
        return {a for a in addresses if _refresh(self.path_of(a))}

    def _size(self, address: str) -> int:
        try:
            return self.path_of(address).stat().st_size
        except FileNotFoundError:
            raise BlobMissing(f"blob {address} is not in {self.where}", address=address) from None

    def _list(self, after: str | None) -> Iterator[Listed]:
        start = hex_of(after) if after else ""
        for a in _names(self._blobs, dirs=True):
            if a < start[:2]:
                continue
            for b in _names(f"{self._blobs}/{a}", dirs=True):
                if a + b < start[:4]:
                    continue
                for name in _names(f"{self._blobs}/{a}/{b}", dirs=False):
                    if name <= start or not _HEX.fullmatch(name):
                        continue
                    try:
                        st = os.stat(f"{self._blobs}/{a}/{b}/{name}")
                    except FileNotFoundError:  # removed meanwhile
                        continue
                    yield Listed(f"sha256:{name}", st.st_size, st.st_mtime)

    def _delete(self, addresses: list[str], before: float) -> list[str]:
        removed = []
        aside = self._spool()
        for address in addresses:
            final = self.path_of(address)
            held = aside / f".gc-{hex_of(address)}-{secrets.token_hex(4)}"
            try:
                os.rename(final, held)
            except FileNotFoundError:
                removed.append(address)
                continue
            except OSError as e:
                raise StoreError(f"cannot remove blob {address} from {self.where}: {e}", address=address) from e
            try:
                if os.stat(held).st_mtime >= before:
                    os.replace(held, final)  # put again since it was listed: it stays
                    continue
                os.unlink(held)
            except OSError as e:
                raise StoreError(f"cannot remove blob {address} from {self.where}: {e}", address=address) from e
            removed.append(address)
        return removed

    def discard(self, address: str) -> None:
        """Remove a blob at once (the cache's eviction; a store's own blobs go through `delete_blobs`)."""
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


def _refresh(path: Path) -> bool:
    """Whether the blob is there, its mtime touched so that the garbage collector's grace starts again."""
    try:
        os.utime(path)
        return True
    except FileNotFoundError:
        return False
    except OSError:  # a store this user may read but not touch: there, but not refreshed
        return path.is_file()


def _names(path: str, *, dirs: bool) -> list[str]:
    try:
        with os.scandir(path) as it:
            return sorted(e.name for e in it if e.is_dir() == dirs)
    except FileNotFoundError:
        return []


def _fsync_file(path: Path) -> None:
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
