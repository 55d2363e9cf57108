"""Task code shipped by address: a code dir as one deterministic tar.gz blob in the CAS (`Client(code=DIR)`,
`piloop task push DIR`), and a worker's cache of the dirs it unpacked (`CodeCache`). A dir with an `__init__.py`
is a package and ships under its own name (`./mypkg` → `mypkg/…`); any other dir is a path entry (its modules and
packages at the top).

The same files give the same bytes, hence the same address: entries sorted, mtime 0, owner 0, mode 0644 (0755 for
an executable file) and a gzip header with no time or name. `__pycache__`, `.git` and `*.pyc` are left out, and so
are symlinks (the snapshot holds what the dir holds, nothing it points at). One blob, not a tree of blobs: the
spec names one address, which the CAS collector keeps while the job exists, and a worker fetches one file.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import os
import shutil
import tarfile
import time
from collections.abc import Callable
from pathlib import Path, PurePosixPath

from piloop_common.errors import BadRequest

SKIP_DIRS = {"__pycache__", ".git"}
SKIP_SUFFIXES = (".pyc",)
MAX_BYTES = 16 * 2**20  # the API's body limit (`[plugins.network] max_body_mb`'s default)
KEEP = 16  # code dirs a worker keeps unpacked ...
KEEP_SECONDS = 3600.0  # ... and one used this recently is never removed, even past KEEP


def _entries(root: Path) -> list[Path]:
    out: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not os.path.islink(os.path.join(dirpath, d)))
        for name in sorted(filenames):
            p = Path(dirpath) / name
            if not name.endswith(SKIP_SUFFIXES) and p.is_file() and not p.is_symlink():
                out.append(p)
    return sorted(out, key=lambda p: p.relative_to(root).as_posix())


def signature(root: str | Path) -> tuple[tuple[str, int, int, int], ...]:
    """What a snapshot of `root` depends on, from stats alone: each file's name, size, mtime and mode. A client
    packs the dir again only when it changed (`Client.push_code`), not for each task of a `map`."""
    root = Path(root).expanduser()
    if not root.is_dir():
        return ()
    out = []
    for p in _entries(root):
        st = p.stat()
        out.append((p.relative_to(root).as_posix(), st.st_size, st.st_mtime_ns, st.st_mode))
    return tuple(out)


def pack(root: str | Path) -> bytes:
    """The snapshot of the code dir `root`: BadRequest when it is no dir, holds no file, or is too large to ship."""
    root = Path(root).expanduser()
    if not root.is_dir():
        raise BadRequest(f"code {str(root)!r}: not a directory")
    files = _entries(root)
    # a package (an `__init__.py`) keeps its name, so `code="./mypkg"` ships `mypkg/…` and `mypkg.work` imports;
    # any other dir is a path entry: what it holds goes on the path as it is
    top = root.resolve().name + "/" if (root / "__init__.py").is_file() else ""
    if not files:
        raise BadRequest(f"code {str(root)!r}: the directory holds no file to ship")
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for p in files:
            info = tarfile.TarInfo(top + p.relative_to(root).as_posix())
            data = p.read_bytes()
            info.size, info.mtime, info.uid, info.gid = len(data), 0, 0, 0
            info.mode = 0o755 if os.access(p, os.X_OK) else 0o644
            tar.addfile(info, io.BytesIO(data))
    out = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=out, mtime=0) as gz:
        gz.write(raw.getvalue())
    blob = out.getvalue()
    if len(blob) > MAX_BYTES:
        raise BadRequest(
            f"code {str(root)!r}: its snapshot is {len(blob) / 2**20:.1f} MiB, over the {MAX_BYTES >> 20} MiB a "
            "submit may carry; ship the code only (data goes in the job's inputs)"
        )
    return blob


class UnsafeMember(tarfile.TarError):
    """A snapshot member that is not a plain file or dir under the snapshot's own dir."""


def unpack(blob: Path, dest: Path) -> None:
    """Unpack a snapshot into `dest`, every member checked before any is written: UnsafeMember for an absolute path,
    a `..`, a name twice, or anything but a plain file or dir (a link, a device, a fifo), which `pack` never writes.
    Files get 0644, or 0755 when executable; no owner or time is kept. Checked here, not by tarfile's `data` filter,
    which Python has only from 3.11.4 (Debian 12's is 3.11.2): one way on every Python that piloop runs on."""
    with tarfile.open(blob, mode="r:gz") as tar:
        members = [(m, _member_path(m)) for m in tar.getmembers()]
        names = [parts for _, parts in members if parts]
        if len(set(names)) != len(names):
            raise UnsafeMember("the snapshot names a member twice")
        dest.mkdir(parents=True, exist_ok=True)
        for m, parts in members:
            target = dest.joinpath(*parts)
            if m.isdir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            src = tar.extractfile(m)
            assert src is not None  # a regular file (`_member_path`)
            # O_NOFOLLOW and O_EXCL: nothing written through a link, nor over a file; the parents are our own dirs
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(target, flags, 0o755 if m.mode & 0o111 else 0o644)
            with src, os.fdopen(fd, "wb") as out:
                shutil.copyfileobj(src, out)


def _member_path(m: tarfile.TarInfo) -> tuple[str, ...]:
    """The parts of a member's path under the snapshot's dir (() for the dir itself); UnsafeMember when it is not a
    plain file or dir, or its path is absolute or climbs out."""
    if not (m.isreg() or m.isdir()):
        kind = "a link" if m.islnk() or m.issym() else "a device" if m.isdev() else "not a file"
        raise UnsafeMember(f"the snapshot's member {m.name!r} is {kind}: a snapshot holds files and dirs only")
    path = PurePosixPath(m.name)
    if path.is_absolute() or m.name.startswith("/"):
        raise UnsafeMember(f"the snapshot's member {m.name!r} is an absolute path")
    parts = tuple(p for p in path.parts if p != ".")
    if ".." in parts or "\0" in m.name:
        raise UnsafeMember(f"the snapshot's member {m.name!r} is outside its dir")
    if not parts and m.isreg():
        raise UnsafeMember(f"the snapshot's member {m.name!r} has no name")
    return parts


class CodeCache:
    """A worker's unpacked code dirs, `<--dir>/code/<hex>`, one per address: fetched once, then reused by every
    task that names it. Bounded: after a fetch, the least recently used beyond `KEEP` are removed, except one used
    within `KEEP_SECONDS` (a task may still import from it)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, address: str) -> Path:
        return self.root / address.partition(":")[2]

    def get(self, address: str, fetch: Callable[[str, Path], None]) -> Path:
        """The dir of `address`, fetched (`fetch(address, file)`) and unpacked the first time."""
        dest = self.path(address)
        if dest.is_dir():
            with contextlib.suppress(OSError):
                os.utime(dest)  # its last use, for the bound
            return dest
        self.root.mkdir(parents=True, exist_ok=True)
        part = self.root / f".part-{dest.name}-{os.getpid()}"
        shutil.rmtree(part, ignore_errors=True)
        part.mkdir()
        try:
            fetch(address, part / "code.tar.gz")
            unpack(part / "code.tar.gz", part / "code")
            (part / "code").rename(dest)  # whole or not at all: a crash half-way leaves only a .part dir
        finally:
            shutil.rmtree(part, ignore_errors=True)
        self.trim()
        return dest

    def trim(self, now: float | None = None) -> list[Path]:
        """Remove the code dirs past the bound; those removed."""
        now = time.time() if now is None else now
        try:
            every = list(self.root.iterdir())
        except OSError:
            return []
        for p in every:  # a fetch a dead worker left half-done
            if p.name.startswith(".part-") and now - p.stat().st_mtime > KEEP_SECONDS:
                shutil.rmtree(p, ignore_errors=True)
        dirs = [p for p in every if not p.name.startswith(".")]
        dirs.sort(key=lambda p: p.stat().st_mtime, reverse=True)
        gone = []
        for p in dirs[KEEP:]:
            if now - p.stat().st_mtime > KEEP_SECONDS:
                shutil.rmtree(p, ignore_errors=True)
                gone.append(p)
        return gone
