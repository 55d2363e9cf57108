"""A put of a blob the store already has restarts its grace, on every provider: a client that re-puts an old,
unreferenced blob and then submits a job naming it does not lose it to a collection that runs in between.

`local` and `http` (a real `piloop cas serve` over `local`) make blobs old with `os.utime`; `s3` and `cached` (in
front of S3), whose ages cannot be set on moto's server, wait out a grace of seconds against the listing.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from piloop_common.cas import Store, open_store
from piloop_common.cas.http import HttpStore
from piloop_common.cas.local import LocalStore
from piloop_server.cas_gc import collect
from piloop_server.state.keys import Keys
from piloop_server.state.leases import LeasesState
from piloop_server.state.records.lease import Timings
from tests.helpers.redis import wait_for
from tests.integration.test_cas_gc import BUCKET, CONFIG, DAY, GRACE, OperatedCas, cas_server, s3_url

__all__ = ["cas_server", "s3_url"]  # fixtures this module uses
S3_GRACE = 6.0  # moto's LastModified is in whole seconds: the collection must list within ~5 s of the re-put
pytestmark = pytest.mark.timeout(60)


class Case:
    def __init__(self, name: str, config: dict[str, Any], grace: float, root: Path | None) -> None:
        self.name, self.config, self.grace, self.root = name, config, grace, root
        self.client_override: dict[str, Any] = {}  # what the client's store has of its own
        self.opened: list[Store] = []

    def open(self, home: Path, **override: Any) -> Store:
        store = open_store(CONFIG.validate_python({**self.config, **override}), home)
        self.opened.append(store)
        return store

    def make_old(self, store: Store, addresses: list[str]) -> None:
        if self.root is not None:
            then = time.time() - 3 * DAY
            for a in addresses:
                os.utime(LocalStore(self.root).path_of(a), (then, then))
            return

        def old() -> bool:
            cutoff = time.time() - self.grace
            return set(addresses) <= {b.address for b in store.blobs() if b.modified < cutoff}

        wait_for(old, self.grace + 15, interval=0.2, what="the blobs to pass the grace")


@pytest.fixture(params=["local", "s3", "http", "cached"])
def case(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Case]:
    if request.param == "local":
        root = tmp_path / "store"
        c = Case("local", {"provider": "local", "path": str(root)}, GRACE, root)
    elif request.param == "http":
        server: OperatedCas = request.getfixturevalue("cas_server")
        c = Case("http", {"provider": "http", "url": server.url, "token": server.operator}, GRACE, server.root)
        c.client_override = {"token": server.plain}  # a worker's or a person's token, not an operator's
    else:
        s3 = {"provider": "s3", "bucket": BUCKET, "prefix": uuid.uuid4().hex[:12] + "/"}
        s3["endpoint_url"] = request.getfixturevalue("s3_url")
        if request.param == "s3":
            c = Case("s3", s3, S3_GRACE, None)
        else:
            c = Case("cached", {"provider": "cached", "path": str(tmp_path / "cache"), "remote": s3}, S3_GRACE, None)
            c.client_override = {"path": str(tmp_path / "client-cache")}
    yield c
    for store in c.opened:
        store.close()


def test_a_re_put_restarts_an_old_blobs_grace(case: Case, redis_client: Any, namespace: str, tmp_path: Path) -> None:
    keys = Keys(namespace)
    store = case.open(tmp_path)
    data = {what: f"{what} {uuid.uuid4().hex}".encode() * 4 for what in ("re-put", "left")}
    reput, left = (store.put_bytes(d) for d in data.values())
    case.make_old(store, [reput, left])

    client = case.open(tmp_path / "client", **case.client_override)
    sent: list[str] = []
    if isinstance(client, HttpStore):
        client._client.event_hooks["request"].append(lambda r: sent.append(f"{r.method} {r.url.path}"))
    assert client.put_bytes(data["re-put"]) == reput
    if isinstance(client, HttpStore):
        assert sent == ["POST /v1/cas/has"], sent  # the server had it: no byte of it was sent again

    report = collect(store, redis_client, keys, grace_seconds=case.grace)
    # the job naming it is submitted after the collection: what it names is still there
    LeasesState(redis_client, keys, Timings(2000, 6000)).enqueue(
        "jreputaaaaaaa", "evaluation", "p", {"argv": ["cat"], "inputs": {"in": reput}}, by="admin"
    )
    assert report.skipped is None
    assert store.has(reput), f"{case.name}: a blob put again was collected as if it were old"
    assert not store.has(left), f"{case.name}: an old unreferenced blob that nobody put again was kept"
    assert report.removed.blobs == 1 and report.young.blobs == 1, report
    assert client.get_bytes(reput) == data["re-put"]


def test_a_touch_through_cas_serve_needs_a_token_and_answers_what_it_has(cas_server: OperatedCas) -> None:
    """The `touch` of `/v1/cas/has`: a plain token may (a put may), it answers only what is there, and it refreshes
    the served blob's mtime, as a PUT of it does."""
    root = LocalStore(cas_server.root)
    data = b"served " + uuid.uuid4().bytes
    have = root.put_bytes(data)
    then = time.time() - 3 * DAY
    os.utime(root.path_of(have), (then, then))
    missing = "sha256:" + "0" * 64
    url = cas_server.url + "/v1/cas/has"
    body = {"addresses": [have, missing], "touch": True}
    assert httpx.post(url, json=body).status_code == 401
    answer = httpx.post(url, json=body, headers={"Authorization": f"Bearer {cas_server.plain}"})
    assert answer.status_code == 200, answer.text
    assert answer.json()["present"] == [have]
    assert root.path_of(have).stat().st_mtime > time.time() - 60
    assert not root.path_of(missing).exists()
    # a PUT of a blob the server has (a client that does not ask first) restarts it there too
    os.utime(root.path_of(have), (then, then))
    put = httpx.put(
        f"{cas_server.url}/v1/cas/blobs/{have}", content=data, headers={"Authorization": f"Bearer {cas_server.plain}"}
    )
    assert put.status_code == 201, put.text
    assert root.path_of(have).stat().st_mtime > time.time() - 60
