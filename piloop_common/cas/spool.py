"""A spool: a stream copied to a temp file while it is hashed, so its address is known before it is stored.

Stores that must know an address before they write (a remote keyed by hash) spool unknown-hash
data first: one pass, chunked, so memory stays flat whatever the size.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from piloop_common.cas.address import CHUNK, address_of


class Readable(Protocol):
    """What a put reads from: an open binary file, or a request body read as one (the API's `_Body`)."""

    def read(self, size: int = -1, /) -> bytes: ...


@dataclass
class Spooled:
    address: str
    path: Path
    size: int


@contextmanager
def spool(fileobj: Readable, directory: Path | None = None) -> Iterator[Spooled]:
    """Copy `fileobj` to a temp file in `directory`, hashing it; the file is removed on exit unless moved away.

    Not fsynced: a store that keeps the file (local) syncs it before its rename; remote ones only read it.
    """
    if directory is not None:
        directory.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=".spool-", dir=directory)
    path = Path(name)
    try:
        digest = hashlib.sha256()
        size = 0
        with os.fdopen(fd, "wb") as out:
            while chunk := fileobj.read(CHUNK):
                digest.update(chunk)
                out.write(chunk)
                size += len(chunk)
        yield Spooled(address_of(digest), path, size)
    finally:
        path.unlink(missing_ok=True)
