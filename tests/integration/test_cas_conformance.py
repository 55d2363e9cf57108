"""One suite that every CAS provider must pass, against real backends.

`s3` is moto's server over HTTP; `http` is a real `piloop cas serve` process over a local store;
`cached` runs in front of each. Each test gets its own namespace (a directory, a key prefix).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from pydantic import TypeAdapter

from piloop_common.cas import CasConfig, Store, hash_bytes, hash_file, open_store
from piloop_common.cas.local import LocalStore
from piloop_common.errors import BadAddress, BlobMissing, Corrupt, Unavailable
from tests.helpers.s3 import DUMMY_CREDENTIALS, free_port, start_moto, stop, wait_until_answers

BUCKET = "piloop-cas"
MiB = 1 << 20
CONFIG = TypeAdapter(CasConfig)

# Opens a store from a config in a fresh process, races to create the identity, and puts a file.
PUT = """
import json, sys
from pathlib import Path
from pydantic import TypeAdapter
from piloop_common.cas import CasConfig, open_store
store = open_store(TypeAdapter(CasConfig).validate_json(sys.argv[1]), Path(sys.argv[2]))
print(json.dumps({"id": store.identity(), "address": store.put_file(sys.argv[3])}))
"""


class CasServer:
    """A real `piloop cas serve` over a local store, with its tokens in Redis; tests stop and restart it."""

    def __init__(self, home: Path, redis_url: str) -> None:
        import redis

        from piloop_server.state.keys import Keys
        from piloop_server.tokens import TokenStore

        self.home = home
        self.root = home / "served"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        namespace = "cas" + uuid.uuid4().hex[:8]
        client = redis.Redis.from_url(redis_url)
        self.token = TokenStore(client, Keys(namespace)).create("cas-test", by="test")
        client.close()
        plugins = {"state": {"url": redis_url}, "cas": {"provider": "local", "path": str(self.root)}}
        self.env = {**os.environ, "PILOOP_PLUGINS": json.dumps(plugins), "PILOOP_NAMESPACE": namespace}
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        argv = [sys.executable, "-m", "piloop_common.cli", "--home", str(self.home)]
        argv += ["cas", "serve", "--listen", f"127.0.0.1:{self.port}"]
        self.proc = subprocess.Popen(argv, env=self.env)
        wait_until_answers(f"{self.url}/v1/cas/identity", self.proc)

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc)
            self.proc = None


@pytest.fixture(scope="module")
def s3_url() -> Iterator[str]:
    import boto3

    with start_moto() as url:
        boto3.client("s3", endpoint_url=url, region_name="us-east-1").create_bucket(Bucket=BUCKET)
        yield url


@pytest.fixture(scope="module")
def cas_server(tmp_path_factory: pytest.TempPathFactory, redis_server: Any) -> Iterator[CasServer]:
    server = CasServer(tmp_path_factory.mktemp("cas-server"), redis_server.url)
    server.start()
    yield server
    server.stop()


@dataclass
class Provider:
    """A provider under test: how to open it, break it at the backend, and make it unreachable."""

    name: str
    config: dict[str, Any]
    home: Path
    corrupt: Callable[[str, bytes], None]
    unreachable: dict[str, Any] | None = None  # the same store with its remote unreachable
    outage: Callable[[], Any] | None = None  # a context in which the real remote is down
    cache_dir: Path | None = None
    opened: list[Store] = field(default_factory=list)

    def open(self, config: dict[str, Any] | None = None) -> Store:
        store = open_store(CONFIG.validate_python(config or self.config), self.home)
        self.opened.append(store)
        return store


PROVIDERS = ["local", "s3", "http", "cached-local", "cached-s3", "cached-http"]


@pytest.fixture(params=PROVIDERS)
def provider(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Provider]:
    kind = request.param.removeprefix("cached-")
    ns = uuid.uuid4().hex[:12]
    if kind == "local":
        remote, corrupt, dead, outage = _local(tmp_path / "store")
    elif kind == "s3":
        remote, corrupt, dead, outage = _s3(request.getfixturevalue("s3_url"), ns)
    else:
        remote, corrupt, dead, outage = _http(request.getfixturevalue("cas_server"))
    p = Provider(request.param, remote, tmp_path, corrupt, dead, outage)
    if request.param.startswith("cached-"):
        p.cache_dir = tmp_path / "cache"
        cache = LocalStore(p.cache_dir)

        def corrupt_remote(address: str, data: bytes) -> None:
            corrupt(address, data)
            cache.discard(address)  # so the read goes to the remote

        p.config = {"provider": "cached", "path": str(p.cache_dir), "local_max_gb": 1, "remote": remote}
        p.corrupt = corrupt_remote
        p.unreachable = dead and {**p.config, "remote": dead}
    yield p
    for store in p.opened:
        store.close()


def _local(root: Path) -> tuple[dict[str, Any], Callable[[str, bytes], None], None, None]:
    def corrupt(address: str, data: bytes) -> None:
        LocalStore(root).path_of(address).write_bytes(data)

    return {"provider": "local", "path": str(root)}, corrupt, None, None


def _s3(url: str, ns: str) -> tuple[dict[str, Any], Callable[[str, bytes], None], dict[str, Any], None]:
    import boto3

    config = {"provider": "s3", "bucket": BUCKET, "prefix": f"{ns}/", "endpoint_url": url, "multipart_mb": 16}

    def corrupt(address: str, data: bytes) -> None:
        key = f"{ns}/blobs/{address.removeprefix('sha256:')}"
        boto3.client("s3", endpoint_url=url, region_name="us-east-1").put_object(Bucket=BUCKET, Key=key, Body=data)

    # moto keeps objects in memory, so stopping it would lose them: the outage is a dead endpoint.
    dead = {**config, "endpoint_url": f"http://127.0.0.1:{free_port()}"}
    return config, corrupt, dead, None


def _http(server: CasServer) -> tuple[dict[str, Any], Callable[[str, bytes], None], None, Any]:
    def corrupt(address: str, data: bytes) -> None:
        LocalStore(server.root).path_of(address).write_bytes(data)

    class Outage:
        def __enter__(self) -> None:
            server.stop()

        def __exit__(self, *exc: object) -> None:
            server.start()

    return {"provider": "http", "url": server.url, "token": server.token}, corrupt, None, Outage


def _random_file(path: Path, size: int) -> Path:
    with open(path, "wb") as f:
        for offset in range(0, size, MiB):
            f.write(os.urandom(min(MiB, size - offset)))
    return path


# -- the suite ------------------------------------------------------------------------------


def test_round_trip_empty_small_and_large(provider: Provider, tmp_path: Path) -> None:
    store = provider.open()
    for data in (b"", b"piloop"):
        address = store.put_bytes(data)
        assert address == hash_bytes(data)
        assert store.get_bytes(address) == data
        assert store.size(address) == len(data)
        assert store.put_bytes(data) == address  # a second put of what exists is a no-op

    big = _random_file(tmp_path / "big", 64 * MiB)
    with open(big, "rb") as f:
        address = store.put_stream(f)
    assert address == hash_file(big)
    assert store.size(address) == 64 * MiB
    out = tmp_path / "out"
    assert store.get_file(address, out) == 64 * MiB
    assert hash_file(out) == address


def test_has_many_answers_a_thousand_in_one_call(provider: Provider) -> None:
    store = provider.open()
    blobs = [os.urandom(16) for _ in range(1000)]
    with ThreadPoolExecutor(4) as pool:
        present = set(pool.map(store.put_bytes, blobs[:500]))
    wanted = [hash_bytes(b) for b in blobs]
    assert store.has_many(wanted) == present
    assert store.has(wanted[0]) and not store.has(wanted[-1])


def test_corrupt_blob_is_refused_on_read(provider: Provider, tmp_path: Path) -> None:
    store = provider.open()
    address = store.put_bytes(b"the real bytes")
    provider.corrupt(address, b"other bytes!!!")
    with pytest.raises(Corrupt, match=address):
        store.get_bytes(address)
    target = tmp_path / "target"
    target.write_bytes(b"kept")
    with pytest.raises(Corrupt):
        store.get_file(address, target)
    assert target.read_bytes() == b"kept"  # get_file renames only what verified
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".target")] == []


def test_missing_blob(provider: Provider, tmp_path: Path) -> None:
    store = provider.open()
    address = hash_bytes(uuid.uuid4().bytes)
    with pytest.raises(BlobMissing, match=address):
        store.get_bytes(address)
    with pytest.raises(BlobMissing):
        store.size(address)
    with pytest.raises(BlobMissing):
        store.get_file(address, tmp_path / "never")
    assert not (tmp_path / "never").exists()
    assert not store.has(address)


BAD_ADDRESSES = [
    "sha256:../../etc/passwd",
    "sha256:" + "A" * 64,
    "sha256:" + "a" * 63,
    "sha256:" + "a" * 65,
    "sha256:" + "a" * 64 + "\n",
    "md5:" + "a" * 32,
    "sha512:" + "a" * 128,
    "a" * 64,
    "",
]


@pytest.mark.parametrize("bad", BAD_ADDRESSES)
def test_malformed_address_is_refused_before_io(provider: Provider, tmp_path: Path, bad: str) -> None:
    # A store whose backend cannot be reached, or does not exist yet: any I/O would show.
    untouched = tmp_path / "untouched"
    config = provider.unreachable or json.loads(json.dumps(provider.config).replace(str(tmp_path), str(untouched)))
    store = provider.open(config)
    for call in (
        lambda: store.get_bytes(bad),
        lambda: store.get_file(bad, tmp_path / "x"),
        lambda: store.size(bad),
        lambda: store.has(bad),
        lambda: store.has_many([hash_bytes(b"fine"), bad]),
        lambda: store.put_stream(open(os.devnull, "rb"), expect=bad),
    ):
        with pytest.raises(BadAddress):
            call()
    assert not untouched.exists()


def test_concurrent_puts_of_one_blob_from_two_processes(provider: Provider, tmp_path: Path) -> None:
    source = _random_file(tmp_path / "blob", 4 * MiB)
    env = {**os.environ, **DUMMY_CREDENTIALS}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", PUT, json.dumps(provider.config), str(provider.home), str(source)],
            stdout=subprocess.PIPE,
            env=env,
        )
        for _ in range(2)
    ]
    answers = []
    for proc in procs:
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0
        answers.append(json.loads(out))
    address = hash_file(source)
    assert [a["address"] for a in answers] == [address, address]
    assert answers[0]["id"] == answers[1]["id"]  # two first starts agree on one identity
    store = provider.open()
    assert store.identity() == answers[0]["id"]
    out_path = tmp_path / "out"
    store.get_file(address, out_path)
    assert hash_file(out_path) == address


def test_identity_is_stable_across_reopen_and_restart(provider: Provider) -> None:
    first = provider.open().identity()
    assert len(first) >= 16
    if provider.outage is not None:
        with provider.outage():
            pass  # the server restarts between the two opens
    assert provider.open().identity() == first


def test_unreachable_remote_is_unavailable_and_loses_nothing(provider: Provider) -> None:
    if provider.unreachable is None and provider.outage is None:
        pytest.skip(f"{provider.name} has no remote to lose")
    store = provider.open()
    kept = store.put_bytes(b"stored before the outage")
    lost = uuid.uuid4().bytes
    config = provider.unreachable or provider.config
    remote = config.get("remote", config)
    endpoint = remote.get("endpoint_url") or remote["url"]  # the message must name it
    if provider.outage is not None:
        with provider.outage(), pytest.raises(Unavailable, match=endpoint):
            store.put_bytes(lost)
    else:
        with pytest.raises(Unavailable, match=endpoint):
            provider.open(provider.unreachable).put_bytes(lost)
    assert store.get_bytes(kept) == b"stored before the outage"
    assert not store.has(hash_bytes(lost))  # a failed write is never reported stored
    if provider.cache_dir is not None:
        assert not LocalStore(provider.cache_dir).path_of(hash_bytes(lost)).exists()


def test_cached_heals_a_rotten_cache_copy(provider: Provider) -> None:
    if provider.cache_dir is None:
        pytest.skip("only the cached provider keeps a copy")
    store = provider.open()
    address = store.put_bytes(b"cached bytes")
    LocalStore(provider.cache_dir).path_of(address).write_bytes(b"rotten bytes")
    with pytest.raises(Corrupt):
        store.get_bytes(address)
    assert store.get_bytes(address) == b"cached bytes"  # the bad copy was dropped and refetched


# -- the s3 provider's own choices ------------------------------------------------------------


def test_s3_uploads_in_boto3s_parts_and_sends_nothing_that_exists(s3_url: str, tmp_path: Path) -> None:
    """By default a blob up to 8 MiB is one conditional PutObject, a bigger one 8 MiB parts; a second put
    of either sends no byte of it, only a copy inside S3 that restarts its age."""
    import boto3

    from piloop_common.cas.s3 import S3Store

    ns = uuid.uuid4().hex[:12]
    store = open_store(
        CONFIG.validate_python({"provider": "s3", "bucket": BUCKET, "prefix": f"{ns}/", "endpoint_url": s3_url}),
        tmp_path,
    )
    assert isinstance(store, S3Store)
    calls: list[str] = []
    store._client.meta.events.register("before-call.s3", lambda model, **_: calls.append(model.name))

    small = _random_file(tmp_path / "small", 8 * MiB - 1)
    small_address = store.put_file(small)
    assert calls == ["PutObject"]

    calls.clear()
    big = _random_file(tmp_path / "big", 20 * MiB)
    address = store.put_file(big)
    assert address == hash_file(big)
    assert calls.count("UploadPart") == 3  # 8 + 8 + 4 MiB
    key = f"{ns}/blobs/{address.removeprefix('sha256:')}"
    etag = boto3.client("s3", endpoint_url=s3_url, region_name="us-east-1").head_object(Bucket=BUCKET, Key=key)["ETag"]
    assert etag.endswith('-3"')

    calls.clear()
    assert store.put_file(big) == address
    assert store.put_file(small) == small_address
    # the PutObject is If-None-Match: *, answered 412; each CopyObject (onto itself) restarts an existing blob's grace
    assert calls == ["CopyObject", "PutObject", "CopyObject"]
    store.get_file(address, tmp_path / "out")
    assert (tmp_path / "out").read_bytes() == big.read_bytes()
    store.close()
