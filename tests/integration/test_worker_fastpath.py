"""A heartbeat answered by the fast path in front of FastAPI (`api/worker.py` FastBeat) is answered exactly as the
route answers it: the same status and the same JSON, for good calls and refused ones. `application/json;
charset=utf-8` is not taken by the fast path, so each call is made both ways. A real `piloop serve`, real Redis."""

from __future__ import annotations

import json

import httpx
import pytest

from piloop_common.client import ApiClient
from tests.helpers.simworker import SimWorker
from tests.helpers.workers import token

FAST = "application/json"
ROUTED = "application/json; charset=utf-8"  # FastAPI reads it as JSON; the fast path leaves it to FastAPI


def both(d, tok: str | None, body: object) -> tuple[tuple[int, object], tuple[int, object]]:
    """(status, JSON) of the same heartbeat, by the fast path and by the route."""
    out = []
    for ctype in (FAST, ROUTED):
        headers = {"content-type": ctype, **({"authorization": f"Bearer {tok}"} if tok else {})}
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        r = httpx.post(d.url + "/v1/worker/heartbeat", content=content, headers=headers, timeout=10)
        out.append((r.status_code, r.json()))
    return out[0], out[1]


@pytest.fixture
def worker(server):
    tok = token(server, "fw1")
    with server.api() as api:
        cas_id = api.call("GET", "/v1/status")["cas"]["id"]
    w = SimWorker(ApiClient(url=server.url, token=tok), "gpu", cas_id)
    w.register()
    w.heartbeat()  # the token verified, so the fast path takes the next calls
    w.tok = tok  # type: ignore[attr-defined]
    return w


def test_a_good_heartbeat_is_answered_alike(server, worker):
    fast, routed = both(server, worker.tok, worker.hello())
    assert fast == routed == (200, {"jobs": {}})


@pytest.mark.parametrize("change", [
    {"pool": "nope"},  # refused: unknown pool
    {"protocol": 0},  # refused: another protocol
    {"cas_id": "other"},  # refused: another CAS
    {"jobs": [{"job": "j-none", "token": "t-stale"}]},  # a job it does not hold: answered "lost"
    {"sample": {"cpus": 0, "load1": 1, "memory_available_gb": 1, "disk_free_gb": 1}},  # a bad body: 400
    {"extra": 1},  # a bad body: 400
])
def test_a_refused_or_odd_heartbeat_is_answered_alike(server, worker, change):
    fast, routed = both(server, worker.tok, {**worker.hello(), **change})
    assert fast == routed and fast[0] in (200, 400, 403), (fast, routed)


@pytest.mark.parametrize("tok", [None, "plt_" + "A" * 43, "not-a-token"])
def test_a_heartbeat_without_a_good_token_is_answered_alike(server, worker, tok):
    fast, routed = both(server, tok, worker.hello())
    assert fast == routed and fast[0] in (401, 403), (fast, routed)


def test_a_body_that_is_not_json_is_answered_alike(server, worker):
    fast, routed = both(server, worker.tok, b"{not json")
    assert fast == routed and fast[0] == 400, (fast, routed)


def test_a_worker_not_registered_is_answered_alike(server, worker):
    tok = token(server, "fw-unregistered")
    both(server, tok, worker.hello())  # the token verified, so the next fast call is the fast path's
    fast, routed = both(server, tok, worker.hello())
    assert fast == routed and fast[0] == 404 and "register again" in fast[1]["message"], (fast, routed)


def test_a_heartbeat_with_no_stated_length_or_a_large_body_goes_to_the_app_and_is_answered_alike(server, worker):
    """The fast path takes a body only of a stated length up to FAST_BODY (it sits in front of the app's body limit):
    a chunked heartbeat and one padded past that are the app's, which answers them as the fast path answers a
    plain one, and one over the server's limit is refused by size."""
    good = json.dumps(worker.hello()).encode()
    headers = {"content-type": FAST, "authorization": f"Bearer {worker.tok}"}
    chunked = httpx.post(server.url + "/v1/worker/heartbeat", content=iter([good[:10], good[10:]]), headers=headers,
                         timeout=10)
    padded = httpx.post(server.url + "/v1/worker/heartbeat", content=good[:-1] + b" " * (70 * 1024) + b"}",
                        headers=headers, timeout=10)
    assert (chunked.status_code, chunked.json()) == (padded.status_code, padded.json()) == (200, {"jobs": {}})
    huge = httpx.post(server.url + "/v1/worker/heartbeat", content=b" " * (17 * 2**20), headers=headers, timeout=30)
    assert huge.status_code == 413 and huge.json()["error"] == "too_large"
