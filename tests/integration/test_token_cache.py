"""The server keeps the tokens it verified in memory (piloop_server/tokens.py): a token revoked, replaced or expired
still stops working within the cache's bound, however it was changed. A real `piloop serve` over TCP, real Redis."""

from __future__ import annotations

import time

import pytest
import redis

from piloop_common.errors import Refused
from piloop_common.sdk.client import ApiClient
from piloop_server.state.keys import Keys
from piloop_server.tokens import CACHE_SECONDS, TokenStore
from tests.helpers.redis import wait_for
from tests.helpers.simworker import SimWorker
from tests.helpers.workers import token

# a refused answer still has to travel: on a loaded machine a call can take this long on top of the bound
SLACK_SECONDS = 1.0


@pytest.fixture
def store(redis_server, namespace):
    """The tokens as another server on the same Redis sees them: no cache, no word to this server."""
    c = redis.Redis.from_url(redis_server.url)
    yield TokenStore(c, Keys(namespace))
    c.close()


def sim(d, tok: str) -> SimWorker:
    with d.api() as api:
        cas_id = api.call("GET", "/v1/status")["cas"]["id"]
    w = SimWorker(ApiClient(url=d.url, token=tok), "gpu", cas_id)
    w.register()
    return w


def refusal(w: SimWorker) -> str:
    """The refusal's message, or '' while the call is still accepted."""
    try:
        w.heartbeat()
    except Refused as e:
        return e.message
    return ""


def test_a_token_revoked_straight_in_redis_is_refused_within_the_bound(server, store):
    w = sim(server, token(server, "w1"))
    for _ in range(3):
        w.heartbeat()  # verified, and cached since
    store.revoke("w1")  # this server is not told
    t = time.monotonic()
    why = wait_for(lambda: refusal(w), CACHE_SECONDS + SLACK_SECONDS, interval=0.05, what="the revoked token refused")
    assert why == "token w1 was revoked" and time.monotonic() - t <= CACHE_SECONDS + SLACK_SECONDS
    assert refusal(w) == "token w1 was revoked"  # and it stays refused


def test_a_token_revoked_through_the_server_is_refused_at_once(server):
    w = sim(server, token(server, "w2"))
    w.heartbeat()
    server.cli("token", "revoke", "w2", check=True)
    assert refusal(w) == "token w2 was revoked"


def test_a_replaced_token_is_refused_and_its_successor_accepted(server, store):
    old = sim(server, token(server, "w3"))
    old.heartbeat()
    store.revoke("w3")
    new = SimWorker(ApiClient(url=server.url, token=store.create("w3", by="test")), "gpu", old.cas_id)
    new.register()
    assert new.heartbeat() == {}
    # its hash is no longer indexed: the same answer as a token never made
    wait_for(
        lambda: refusal(old) == "the server does not know this token",
        CACHE_SECONDS + SLACK_SECONDS,
        interval=0.05,
        what="the replaced token refused",
    )


def test_a_cached_token_is_refused_once_it_expires(server, store):
    w = sim(server, store.create("w4", by="test", expires_seconds=1.5))
    w.heartbeat()
    # expiry is checked on every call, cached or not: no bound beyond the call itself
    wait_for(lambda: refusal(w) == "token w4 expired", 1.5 + SLACK_SECONDS, interval=0.05, what="the token expired")
