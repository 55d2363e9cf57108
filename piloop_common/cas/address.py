"""Content addresses: `sha256:<64 lowercase hex>`, checked before any I/O touches a path or a key."""

from __future__ import annotations

import hashlib
import os
import re
from typing import BinaryIO

from piloop_common.errors import BadAddress

PREFIX = "sha256:"
CHUNK = 1 << 20  # 1 MiB: big enough for throughput, small enough that no blob is ever held whole

# fullmatch, not match: `$` would accept a trailing newline.
_ADDRESS = re.compile(r"sha256:[0-9a-f]{64}")


def parse_address(value: object) -> str:
    """The address itself, or `BadAddress` for anything that is not exactly `sha256:<64 lowercase hex>`."""
    if not isinstance(value, str) or not _ADDRESS.fullmatch(value):
        shown = repr(value)[:80]
        raise BadAddress(f"not a CAS address: {shown} (expected sha256:<64 lowercase hex>)", address=shown)
    return value


def hex_of(address: str) -> str:
    """The 64 hex digits of a valid address (parsed first, so callers may build paths from it)."""
    return parse_address(address)[len(PREFIX) :]


def address_of(digest: hashlib._Hash) -> str:
    return PREFIX + digest.hexdigest()


def hash_bytes(data: bytes) -> str:
    return address_of(hashlib.sha256(data))


def hash_stream(fileobj: BinaryIO) -> str:
    """The address of everything left in `fileobj`, read in chunks."""
    digest = hashlib.sha256()
    while chunk := fileobj.read(CHUNK):
        digest.update(chunk)
    return address_of(digest)


def hash_file(path: str | os.PathLike[str]) -> str:
    with open(path, "rb") as f:
        return hash_stream(f)
