"""Code snapshots (`piloop_common.taskcode`): the same files give the same bytes, a package keeps its name, what is
not code stays out, a member outside the dir is refused, and the worker's cache keeps its bound."""

from __future__ import annotations

import io
import os
import tarfile
import time
from pathlib import Path

import pytest

from piloop_common.errors import BadRequest
from piloop_common.taskcode import KEEP, KEEP_SECONDS, CodeCache, pack, signature, unpack


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
