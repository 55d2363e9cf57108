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
