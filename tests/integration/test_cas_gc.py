"""CAS garbage collection against real backends: `local`, `s3` (moto's server) and `http` (a real `piloop cas serve`).

Blobs are named the way piloop names them, through the state modules on a real Redis: a queued job's input, a
cancelled (retained) job's spec and log chunk, a campaign's bundle and workspace manifest (whose entry is marked by
following it), an event. Old blobs are made old with `os.utime` on disk, or on S3 (whose ages cannot be set) by a
grace of seconds waited out against the listing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import TypeAdapter

from piloop_common.cas import CasConfig, Store, open_store
from piloop_common.cas.base import Blob, Listed
from piloop_common.cas.local import LocalStore
from piloop_server.cas_gc import collect
from piloop_server.state.campaigns import CampaignsState
from piloop_server.state.keys import Keys
from piloop_server.state.leases import LeasesState
from piloop_server.state.records.campaign import Campaign
from piloop_server.state.records.lease import Timings
from piloop_server.state.references import GcLock, ReferencesState
from tests.helpers.redis import wait_for
from tests.helpers.s3 import free_port, start_moto, stop, wait_until_answers
from tests.helpers.slowdown import scaled

BUCKET = "piloop-gc"
DAY = 86_400
GRACE = 2 * DAY  # the default
S3_GRACE = 10.0  # moto's ages cannot be set: the old blobs are waited out; the young one stays young throughout
CONFIG = TypeAdapter(CasConfig)
pytestmark = pytest.mark.timeout(60)


class OperatedCas:
    """A real `piloop cas serve` over a local store, with an operator token (named in `cas_operators`) and a plain
    one."""

    def __init__(self, home: Path, redis_url: str) -> None:
        import redis

        from piloop_server.tokens import TokenStore

        self.home = home
        self.root = home / "served"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        namespace = "gc" + uuid.uuid4().hex[:8]
        client = redis.Redis.from_url(redis_url)
        tokens = TokenStore(client, Keys(namespace))
        self.operator = tokens.create("gc-operator", by="test")
        self.plain = tokens.create("gc-plain", by="test")
        client.close()
        plugins = {
            "state": {"url": redis_url},
            "cas": {"provider": "local", "path": str(self.root)},
            "network": {"cas_operators": ["gc-operator"]},
        }
        env = {**os.environ, "PILOOP_PLUGINS": json.dumps(plugins), "PILOOP_NAMESPACE": namespace}
        argv = [sys.executable, "-m", "piloop_common.cli", "--home", str(home)]
        self.proc = subprocess.Popen([*argv, "cas", "serve", "--listen", f"127.0.0.1:{self.port}"], env=env)
        wait_until_answers(f"{self.url}/v1/cas/identity", self.proc)


@pytest.fixture(scope="module")
def s3_url() -> Iterator[str]:
    import boto3

    with start_moto() as url:
        boto3.client("s3", endpoint_url=url, region_name="us-east-1").create_bucket(Bucket=BUCKET)
        yield url


@pytest.fixture
def cas_server(tmp_path: Path, redis_server: Any) -> Iterator[OperatedCas]:
    """A server of its own for each test: a collection sweeps the whole served store."""
    server = OperatedCas(tmp_path / "cas", redis_server.url)
    yield server
    stop(server.proc)


@dataclass
class Backend:
    """A provider under test, and how to make one of its blobs old."""

    name: str
    config: dict[str, Any]
    grace: float
    age: Callable[[Store, str], None] | None  # make a blob older than any grace (None: wait the grace out)
    opened: list[Store] = field(default_factory=list)

    def open(self, home: Path) -> Store:
        store = open_store(CONFIG.validate_python(self.config), home)
        self.opened.append(store)
        return store


def _age_local(root: Path) -> Callable[[Store, str], None]:
    def age(store: Store, address: str) -> None:
        then = time.time() - 3 * DAY
        os.utime(LocalStore(root).path_of(address), (then, then))

    return age


@pytest.fixture(params=["local", "s3", "http"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    if request.param == "local":
        root = tmp_path / "store"
        b = Backend("local", {"provider": "local", "path": str(root)}, GRACE, _age_local(root))
    elif request.param == "s3":
        url = request.getfixturevalue("s3_url")
        prefix = uuid.uuid4().hex[:12] + "/"
        grace = scaled(S3_GRACE)  # the young blob must outlast two `cas gc` runs, each slower on a loaded machine
        b = Backend("s3", {"provider": "s3", "bucket": BUCKET, "prefix": prefix, "endpoint_url": url}, grace, None)
    else:
        server: OperatedCas = request.getfixturevalue("cas_server")
        b = Backend("http", {"provider": "http", "url": server.url, "token": server.operator}, GRACE, None)
        b.age = _age_local(server.root)
    yield b
    for store in b.opened:
        store.close()


@dataclass
class World:
    """The blobs of one test, by what names them."""

    queued: str
    retained_spec: str
    retained_log: str
    bundle: str
    manifest: str
    in_workspace: str  # named only by the campaign's workspace manifest
    in_event: str
    young: str
    old: list[str]
    sizes: dict[str, int]

    @property
    def referenced(self) -> list[str]:
        return [
            self.queued,
            self.retained_spec,
            self.retained_log,
            self.bundle,
            self.manifest,
            self.in_workspace,
            self.in_event,
        ]


def _put(store: Store, sizes: dict[str, int], what: str) -> str:
    data = f"{what} {uuid.uuid4().hex}".encode() * 3
    address = store.put_bytes(data)
    sizes[address] = len(data)
    return address


def _campaign(name: str, bundle: str, workspace: str) -> Campaign:
    return Campaign(
        name=name,
        state="active",
        repo="r",
        base="b" * 40,
        branch="main",
        bundle=bundle,
        bundle_bytes=0,
        agent_cmd="a",
        eval_cmd="e",
        agents=1,
        agent_pool="p",
        eval_pool="p",
        workspace=workspace,
        workspace_files=1,
        agent_spec="{}",
        eval_spec="{}",
        created=0,
        by="admin",
    )


def _world(store: Store, backend: Backend, r: Any, keys: Keys) -> World:
    """Put every blob, name some of them in Redis as piloop does, and make all but the young one old."""
    sizes: dict[str, int] = {}
    put = lambda what: _put(store, sizes, what)  # noqa: E731
    queued, spec, log_chunk, bundle, in_ws, in_event = (put(w) for w in ("q", "spec", "log", "bundle", "ws", "ev"))
    manifest = store.put_bytes(json.dumps({"notes/a.txt": in_ws}).encode())
    sizes[manifest] = store.size(manifest)
    old = [put(f"old{i}") for i in range(5)]
    leases = LeasesState(r, keys, Timings(2000, 6000))
    leases.enqueue("jqueuedaaaaaa", "evaluation", "p", {"argv": ["cat"], "inputs": {"in": queued}}, by="admin")
    leases.enqueue("jretainedaaaa", "evaluation", "p", {"argv": ["cat"], "inputs": {"in": spec}}, by="admin")
    assert leases.cancel("jretainedaaaa", "admin") == "cancelled"
    r.rpush(keys.job_log("jretainedaaaa"), log_chunk)
    campaigns = CampaignsState(r, keys)
    campaigns.reserve("c1")
    campaigns.put(_campaign("c1", bundle, manifest))
    r.xadd(keys.events(), {"type": "test", "blob": in_event})
    everything = [queued, spec, log_chunk, bundle, manifest, in_ws, in_event, *old]
    if backend.age is not None:
        for address in everything:
            backend.age(store, address)
    else:  # S3: wait until the listing shows every one of them older than the grace
        wanted = set(everything)

        def all_old() -> bool:
            cutoff = time.time() - backend.grace
            return wanted <= {b.address for b in store.blobs() if b.modified < cutoff}

        wait_for(all_old, backend.grace + 15, interval=0.2, what="the blobs to pass the grace")
    young = put("young")
    return World(queued, spec, log_chunk, bundle, manifest, in_ws, in_event, young, old, sizes)


def _cli_gc(backend: Backend, redis_url: str, namespace: str, home: Path, *flags: str) -> subprocess.CompletedProcess:
    plugins = {"state": {"url": redis_url}, "cas": backend.config, "retention": {"cas_grace_seconds": backend.grace}}
    env = {**os.environ, "PILOOP_PLUGINS": json.dumps(plugins), "PILOOP_NAMESPACE": namespace}
    argv = [sys.executable, "-m", "piloop_common.cli", "--home", str(home), "cas", "gc", *flags]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=50)


def _row(out: str, name: str) -> tuple[int, int]:
    for line in out.splitlines():
        parts = line.split()
        if parts[:-2] == name.split():
            return int(parts[-2]), int(parts[-1])
    raise AssertionError(f"no row {name!r} in:\n{out}")


def test_gc_removes_exactly_the_old_unreferenced_blobs(
    backend: Backend, redis_server: Any, redis_client: Any, namespace: str, tmp_path: Path
) -> None:
    keys = Keys(namespace)
    store = backend.open(tmp_path)
    w = _world(store, backend, redis_client, keys)
    old_bytes = sum(w.sizes[a] for a in w.old)
    everything = [*w.referenced, w.young, *w.old]

    dry = _cli_gc(backend, redis_server.url, namespace, tmp_path, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert _row(dry.stdout, "to remove") == (5, old_bytes), dry.stdout
    assert "dry run: nothing was removed" in dry.stdout
    assert store.has_many(everything) == set(everything)  # the dry run removed nothing

    real = _cli_gc(backend, redis_server.url, namespace, tmp_path, "--json")
    assert real.returncode == 0, real.stderr
    report = json.loads(real.stdout)
    assert report["skipped"] is None and report["dry_run"] is False
    assert report["removed"] == {"blobs": 5, "bytes": old_bytes}
    assert report["young"] == {"blobs": 1, "bytes": w.sizes[w.young]}
    assert report["referenced"]["blobs"] == len(w.referenced) and report["missing"] == 0
    assert store.has_many(everything) == {*w.referenced, w.young}
    # a second collection finds nothing more to take
    again = _cli_gc(backend, redis_server.url, namespace, tmp_path)
    assert again.returncode == 0, again.stderr
    assert _row(again.stdout, "removed") == (0, 0), again.stdout
    assert _row(again.stdout, "kept")[0] == len(w.referenced) + 1


def test_a_second_gc_says_so_and_a_concurrent_put_and_gc_lose_nothing(
    backend: Backend, redis_server: Any, redis_client: Any, namespace: str, tmp_path: Path
) -> None:
    keys = Keys(namespace)
    store = backend.open(tmp_path)
    w = _world(store, backend, redis_client, keys)

    # while one sweep holds the lock, a second says so, removes nothing and exits 0
    held = GcLock(redis_client, keys, 30)
    assert held.acquire()
    second = _cli_gc(backend, redis_server.url, namespace, tmp_path)
    assert second.returncode == 0, second.stderr
    assert "another CAS garbage collection holds the lock" in second.stdout, second.stdout
    assert store.has_many(w.old) == set(w.old)
    held.release()

    # a collection during which: a second one starts (and finds the lock held), an old unreferenced blob is put
    # again and a job naming it is submitted (between the listing and the second mark), and new blobs keep coming
    revived = w.old[0]
    leases = LeasesState(redis_client, keys, Timings(2000, 6000))
    reports: list[Any] = []

    def after_listing() -> None:
        reports.append(collect(backend.open(tmp_path), redis_client, keys, grace_seconds=backend.grace))
        assert store.put_bytes(_bytes_of(store, revived)) == revived
        leases.enqueue("jrevivedaaaaa", "evaluation", "p", {"argv": ["cat"], "inputs": {"in": revived}}, by="admin")

    # `local` (and `cas serve` over it, which an http client's put touches) tells a blob put again after the second
    # mark, before its delete: it stays. S3 has no delete conditional on age: such a put is lost (docs/cas.md).
    late = w.old[1] if backend.name in ("local", "http") else None
    late_data = _bytes_of(store, late) if late else b""

    def before_delete() -> None:
        if late is not None:
            assert store.put_bytes(late_data) == late

    stop_putting = threading.Event()
    fresh: list[str] = []

    def putter() -> None:
        other = backend.open(tmp_path)
        while not stop_putting.is_set():
            fresh.append(_put(other, w.sizes, "fresh"))
            stop_putting.wait(0.02)

    thread = threading.Thread(target=putter)
    thread.start()
    try:
        wait_for(lambda: fresh, 10, what="the first concurrent put")
        interleaved = Interleaved(backend.open(tmp_path), after_listing, before_delete)
        swept = collect(interleaved, redis_client, keys, grace_seconds=backend.grace)
    finally:
        stop_putting.set()
        thread.join(10)
    assert interleaved.listed and interleaved.deleted
    assert len(reports) == 1 and reports[0].skipped and reports[0].removed.blobs == 0, reports
    kept = {*w.referenced, w.young, revived, *fresh, *([late] if late else [])}
    assert store.has_many(kept) == kept, "a referenced, young or re-put blob was removed"
    gone = set(w.old) - kept
    assert len(gone) == (3 if late else 4) and not store.has_many(gone), "an old unreferenced blob was kept"
    assert swept.skipped is None and swept.removed.blobs == len(gone)


def test_serve_lets_only_operators_list_and_delete(cas_server: OperatedCas, tmp_path: Path) -> None:
    plain = open_store(
        CONFIG.validate_python({"provider": "http", "url": cas_server.url, "token": cas_server.plain}), tmp_path
    )
    try:
        address = plain.put_bytes(b"mine " + uuid.uuid4().bytes)
        for method, path, body in (
            ("GET", "/v1/cas/list", None),
            ("POST", "/v1/cas/delete", {"addresses": [address], "before": time.time()}),
        ):
            answer = httpx.request(
                method, cas_server.url + path, json=body, headers={"Authorization": f"Bearer {cas_server.plain}"}
            )
            assert answer.status_code == 403, answer.text
            assert "cas_operators" in answer.json()["message"]
        assert plain.has(address)
        nobody = httpx.get(cas_server.url + "/v1/cas/list")
        assert nobody.status_code == 401
    finally:
        plain.close()


def test_the_mark_reads_every_kind_of_key(redis_client: Any, namespace: str) -> None:
    keys = Keys(namespace)
    a = [f"sha256:{i:064x}" for i in range(8)]
    r = redis_client
    r.set(keys.campaign_bundle("c", "x" * 40), a[0])
    r.hset(
        keys.job("j1"), mapping={"spec": json.dumps({"inputs": {"x": a[1]}}), "result": json.dumps({"workspace": a[2]})}
    )
    r.rpush(keys.job_log("j1"), a[3])
    r.sadd(keys.rq_prefix() + ":x", a[4])  # a key under rq's prefix, as rq names them
    r.zadd(keys.jobs(), {a[5]: 1})
    r.xadd(keys.events(), {"type": "t", "blob": a[6]})
    r.hset(keys.rq_prefix() + ":job:t1", mapping={"data": zlib.compress(repr(("f", [a[7]])).encode())})
    r.set("{other}:job:j1", "sha256:" + "f" * 64)  # another namespace's: not read
    marked = ReferencesState(r, keys).mark()
    assert marked.addresses == set(a)
    assert marked.manifests == {a[2]}
    assert marked.keys == 7


class Interleaved(Store):
    """A store that runs `after_listing` once its listing ends and `before_delete` before each delete: a put and a
    submit landing at exactly those moments of a collection."""

    def __init__(self, inner: Store, after_listing: Callable[[], None], before_delete: Callable[[], None]) -> None:
        self.inner, self.after_listing, self.before_delete = inner, after_listing, before_delete
        self.where = inner.where
        self.listed = self.deleted = False

    def _store(self, address: str, path: Path, owned: bool) -> None:
        self.inner._store(address, path, owned)

    def _open(self, address: str) -> AbstractContextManager[Blob]:
        return self.inner._open(address)

    def _has_many(self, addresses: list[str]) -> set[str]:
        return self.inner._has_many(addresses)

    def _size(self, address: str) -> int:
        return self.inner._size(address)

    def identity(self) -> str:
        return self.inner.identity()

    def _list(self, after: str | None) -> Iterator[Listed]:
        yield from self.inner._list(after)
        if not self.listed:
            self.listed = True
            self.after_listing()

    def _delete(self, addresses: list[str], before: float) -> list[str]:
        self.deleted = True
        self.before_delete()
        return self.inner._delete(addresses, before)


def _bytes_of(store: Store, address: str | None) -> bytes:
    assert address is not None
    return store.get_bytes(address)


def test_the_pass_queues_a_collection_that_runs_through_rq(
    redis_server: Any, redis_client: Any, namespace: str
) -> None:
    from tests.helpers.serve import FAST_EXECUTOR, Daemon, short_home

    keys = Keys(namespace)
    home = short_home()
    config = FAST_EXECUTOR + "\n[plugins.retention]\ncas_gc_seconds = 2\n"
    d = Daemon(home, config=config, redis_url=redis_server.url, namespace=namespace)
    store = LocalStore(home / "cas")
    then = time.time() - 3 * DAY
    unreferenced, referenced = store.put_bytes(b"nobody's " + uuid.uuid4().bytes), store.put_bytes(uuid.uuid4().bytes)
    for address in (unreferenced, referenced):
        os.utime(store.path_of(address), (then, then))
    redis_client.rpush(keys.job_log("jloggedaaaaaa"), referenced)
    d.start()
    try:
        wait_for(lambda: not store.has(unreferenced), 40, interval=0.2, what="the scheduled collection")
        assert store.has(referenced)
        assert redis_client.get(keys.cas_gc_last()) is not None

        def gc_events() -> list[Any]:
            return [f for _, f in redis_client.xrange(keys.events()) if f.get(b"type") == b"cas.gc"]

        events = wait_for(gc_events, 10, what="the cas.gc event")
        assert events[0][b"removed"] == b"1", events
    finally:
        d.cleanup()
