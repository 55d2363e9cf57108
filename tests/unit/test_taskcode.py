"""Code snapshots (`piloop_common.sdk.taskcode`): the same files give the same bytes, a package keeps its name, what is
not code stays out, a member outside the dir is refused, and the worker's cache keeps its bound."""

from __future__ import annotations

import io
import os
import tarfile
import time
from pathlib import Path

import pytest

from piloop_common.errors import BadRequest
from piloop_common.sdk.taskcode import KEEP, KEEP_SECONDS, CodeCache, pack, signature, unpack


def _names(blob: bytes) -> list[str]:
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
        return tar.getnames()


def _tree(root: Path) -> Path:
    (root / "sub").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "sub" / "m.py").write_text("X = 1\n")
    (root / "__pycache__").mkdir()
    (root / "__pycache__" / "m.cpython-311.pyc").write_bytes(b"\0")
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("ref\n")
    (root / "link.py").symlink_to(root / "sub" / "m.py")
    return root


def test_the_same_files_pack_to_the_same_bytes_and_a_package_keeps_its_name(tmp_path):
    a = _tree(tmp_path / "a" / "mypkg")
    first = pack(a)
    os.utime(a / "sub" / "m.py", (1, 1))  # times are not part of it
    assert pack(a) == first
    assert _names(first) == ["mypkg/__init__.py", "mypkg/sub/m.py"]  # no cache, no .git, no symlink
    (a / "sub" / "m.py").write_text("X = 2\n")
    assert pack(a) != first
    (a / "__init__.py").unlink()
    assert _names(pack(a)) == ["sub/m.py"]  # a plain dir is a path entry: its contents at the top


def test_bad_dirs_are_refused_naming_them(tmp_path):
    with pytest.raises(BadRequest, match="not a directory"):
        pack(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(BadRequest, match="holds no file"):
        pack(tmp_path / "empty")


def test_a_member_outside_the_dir_is_refused(tmp_path):
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        info = tarfile.TarInfo("../escaped.py")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    (tmp_path / "evil.tar.gz").write_bytes(raw.getvalue())
    with pytest.raises(tarfile.TarError):
        unpack(tmp_path / "evil.tar.gz", tmp_path / "out")
    assert not (tmp_path / "escaped.py").exists()


def _evil(tmp_path: Path, *members: tarfile.TarInfo) -> Path:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        good = tarfile.TarInfo("ok.py")
        good.size = 1
        tar.addfile(good, io.BytesIO(b"x"))  # first: nothing is written before every member is checked
        for info in members:
            tar.addfile(info, io.BytesIO(b"x" * info.size) if info.isreg() else None)
    path = tmp_path / "evil.tar.gz"
    path.write_bytes(raw.getvalue())
    return path


def _info(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    info.size = 1 if kind == tarfile.REGTYPE else 0
    return info


@pytest.mark.parametrize(
    ("member", "says"),
    [
        (_info("/tmp/abs.py"), "absolute path"),
        (_info("pkg/../../up.py"), "outside its dir"),
        (_info("out", tarfile.SYMTYPE, "/etc/passwd"), "is a link"),
        (_info("inside", tarfile.SYMTYPE, "ok.py"), "is a link"),
        (_info("hard", tarfile.LNKTYPE, "/etc/passwd"), "is a link"),
        (_info("dev", tarfile.CHRTYPE), "is a device"),
        (_info("fifo", tarfile.FIFOTYPE), "is a device"),
        (_info("ok.py"), "twice"),
    ],
)
def test_a_member_that_is_not_a_plain_file_or_dir_inside_is_refused_and_nothing_is_written(tmp_path, member, says):
    # the same check on every Python 3.11 (tarfile's `data` filter is 3.11.4+): no crash, a TarError naming it
    with pytest.raises(tarfile.TarError, match=says):
        unpack(_evil(tmp_path, member), tmp_path / "out")
    assert not (tmp_path / "out").exists() and not (tmp_path / "up.py").exists()


def test_unpack_keeps_files_and_dirs_and_whether_a_file_runs(tmp_path):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "m.py").write_text("X = 1\n")
    (src / "sub" / "run.sh").write_text("#!/bin/sh\n")
    (src / "sub" / "run.sh").chmod(0o4755)  # the setuid bit is not kept
    (tmp_path / "code.tar.gz").write_bytes(pack(src))
    unpack(tmp_path / "code.tar.gz", tmp_path / "out")
    assert (tmp_path / "out" / "m.py").read_text() == "X = 1\n"
    assert (tmp_path / "out" / "m.py").stat().st_mode & 0o7777 == 0o644 & ~_umask()
    assert (tmp_path / "out" / "sub" / "run.sh").stat().st_mode & 0o7777 == 0o755 & ~_umask()


def _umask() -> int:
    old = os.umask(0)
    os.umask(old)
    return old


def test_the_cache_fetches_once_and_trims_the_least_recently_used_past_an_hour(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "m.py").write_text("X = 1\n")
    blob = pack(src)
    fetched: list[str] = []

    def fetch(address: str, dest: Path) -> None:
        fetched.append(address)
        dest.write_bytes(blob)

    cache = CodeCache(tmp_path / "code")
    one = cache.get("sha256:" + "1" * 64, fetch)
    assert (one / "m.py").read_text() == "X = 1\n"
    assert cache.get("sha256:" + "1" * 64, fetch) == one and len(fetched) == 1
    old = time.time() - KEEP_SECONDS - 10
    for i in range(KEEP + 2):
        d = cache.root / f"{i:064x}"
        d.mkdir()
        os.utime(d, (old - i, old - i))  # the higher i, the longer unused
    os.utime(one)
    gone = cache.trim()
    assert sorted(p.name for p in gone) == [f"{i:064x}" for i in (KEEP - 1, KEEP, KEEP + 1)]
    assert one.is_dir() and sum(1 for _ in cache.root.iterdir()) == KEEP


def test_the_signature_changes_with_any_file_and_not_otherwise(tmp_path):
    root = _tree(tmp_path / "mypkg")
    first = signature(root)
    assert signature(root) == first and [name for name, *_ in first] == ["__init__.py", "sub/m.py"]
    os.utime(root / "sub" / "m.py", ns=(1, 1))  # an edit that kept the size still moves the mtime
    assert signature(root) != first
    assert signature(tmp_path / "missing") == ()
