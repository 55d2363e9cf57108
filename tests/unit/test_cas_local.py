"""The local store's small-blob path: hashed before anything is written, so a blob it has costs no write."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from piloop_common.cas import local
from piloop_common.cas.address import hash_bytes
from piloop_common.cas.local import LocalStore


def test_a_small_blob_the_store_has_is_not_written_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = LocalStore(tmp_path / "cas")
    src = tmp_path / "result.json"
    src.write_bytes(b'{"value": null}')
    first = store.put_file(src)
    assert first == hash_bytes(src.read_bytes()) and store.get_bytes(first) == src.read_bytes()

    def no_temp(*a: object, **kw: object) -> None:
        raise AssertionError("a temp file was made for a blob the store has")

    monkeypatch.setattr(tempfile, "mkstemp", no_temp)
    assert store.put_file(src) == first and store.put_bytes(src.read_bytes()) == first
    assert not list(store.spool_dir.iterdir())  # nothing left behind by the first put either


def test_a_large_file_still_streams_in_one_pass(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(local, "SMALL", 1024)
    store = LocalStore(tmp_path / "cas")
    src = tmp_path / "big.bin"
    src.write_bytes(b"x" * 5000)
    read_whole: list[int] = []
    monkeypatch.setattr(LocalStore, "put_bytes", lambda self, data: read_whole.append(len(data)))
    address = store.put_file(src)
    assert address == hash_bytes(b"x" * 5000) and store.get_bytes(address) == b"x" * 5000 and not read_whole


def test_a_blob_got_in_place_is_written_straight_to_its_path_and_removed_when_corrupt(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "cas")
    address = store.put_bytes(b'{"args": [], "kwargs": {}}')
    dest = tmp_path / "inputs" / "args.json"
    dest.parent.mkdir()
    assert store.get_file(address, dest, durable=False, in_place=True) == 26
    assert dest.read_bytes() == b'{"args": [], "kwargs": {}}' and sorted(p.name for p in dest.parent.iterdir()) == [
        "args.json"
    ]  # no temp file beside it
    store.path_of(address).write_bytes(b"something else")  # the blob rots in the store
    with pytest.raises(Exception, match="corrupt"):
        store.get_file(address, dest, durable=False, in_place=True)
    assert not dest.exists()
