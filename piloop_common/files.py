"""Small files through the os alone: pathlib's `write_text` costs ~55 us a call here (its text layer) where
`os.write` costs ~13, and `tempfile.mkstemp` ~77 where a random name opened with `O_EXCL` costs ~26; a job's start
and end make a dozen such writes."""

from __future__ import annotations

import os


def write_all(fd: int, data: bytes | str) -> None:
    view = memoryview(data.encode() if isinstance(data, str) else data)
    while view:
        view = view[os.write(fd, view) :]


def write_file(path: str | os.PathLike[str], data: bytes | str, flags: int = os.O_TRUNC, mode: int = 0o600) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | flags, mode)
    try:
        write_all(fd, data)
    finally:
        os.close(fd)


def read_file(path: str | os.PathLike[str]) -> str:
    fd = os.open(path, os.O_RDONLY)
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks).decode()


def temp_beside(path: str | os.PathLike[str]) -> tuple[int, str]:
    """A new file beside `path`, to be renamed over it: its descriptor and name (`.<name>.<24 hex>`, made with
    `O_EXCL`, mode 0600, as `tempfile.mkstemp` makes one)."""
    path = os.fspath(path)
    name = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{os.urandom(12).hex()}")
    return os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), name
