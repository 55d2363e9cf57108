"""The cached provider's LRU: the cache stays under its limit, and what was read last stays."""

from __future__ import annotations

import os
import time
from pathlib import Path

from piloop_common.cas.cached import CachedStore
from piloop_common.cas.local import LocalStore


def _blobs(root: Path) -> int:
    return sum(f.stat().st_size for f in (root / "blobs").rglob("*") if f.is_file())


def test_eviction_keeps_the_cache_under_its_limit_by_last_access(tmp_path: Path) -> None:
    remote = LocalStore(tmp_path / "remote")
    store = CachedStore(remote, tmp_path / "cache", max_bytes=3000)
    addresses = [store.put_bytes(os.urandom(1000)) for _ in range(3)]
    assert _blobs(tmp_path / "cache") == 3000
    first = addresses[0]
    old = time.time() - 100
    for i, a in enumerate(addresses):  # give the three blobs distinct, old access times
        os.utime(store.cache.path_of(a), (old + i, old + i))
    store.get_bytes(first)  # now the most recently used
    fourth = store.put_bytes(os.urandom(1000))
    cached = {a for a in [*addresses, fourth] if store.cache.path_of(a).exists()}
    assert cached == {first, addresses[2], fourth}  # the least recently read went
    assert _blobs(tmp_path / "cache") <= 3000
    assert remote.has_many([*addresses, fourth]) == {*addresses, fourth}  # the remote keeps everything
    assert store.get_bytes(addresses[1]) == remote.get_bytes(addresses[1])  # and refills the cache


def test_a_blob_bigger_than_the_cache_streams_through(tmp_path: Path) -> None:
    remote = LocalStore(tmp_path / "remote")
    store = CachedStore(remote, tmp_path / "cache", max_bytes=100)
    data = os.urandom(1000)
    address = store.put_bytes(data)
    assert not store.cache.path_of(address).exists()
    assert store.get_bytes(address) == data
    assert _blobs(tmp_path / "cache") == 0
    assert list((tmp_path / "cache" / "tmp").iterdir()) == []  # no spool left behind


def test_identity_is_the_remotes(tmp_path: Path) -> None:
    remote = LocalStore(tmp_path / "remote")
    assert CachedStore(remote, tmp_path / "cache", max_bytes=100).identity() == remote.identity()
    assert not (tmp_path / "cache" / "piloop-cas.json").exists()
