"""A bounded fuzz pass over every operation of the daemon's OpenAPI schema (read from the running daemon):
bad bodies, bad tokens, role tokens and stale lease tokens. No answer is a 5xx, and a refused call changes nothing
in the namespace (every key's DUMP, before and after)."""

from __future__ import annotations

import re
import uuid
from urllib.parse import quote

import httpx
import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from piloop_common.protocol.worker import PROTOCOL
from piloop_common.sdk.client import ApiClient
from piloop_server.state.keys import Keys
from tests.helpers.redis import free_port
from tests.helpers.serve import Daemon, short_home
from tests.helpers.simworker import SimWorker

# long timings: nothing expires on its own while the pass runs, so any change is the call's
CONFIG = """
[plugins.executor]
renew_seconds = 10
grace_seconds = 120
toleration_seconds = 600
pass_seconds = 0.5

[plugins.executor.pools.gpu]
agents = 0
evaluations = 1
max_load = 1000
min_memory_gb = 0
"""
EXAMPLES = 300

json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
json_any = st.recursive(
    json_leaf,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=4)),
    max_leaves=12,
)
odd_text = st.one_of(st.text(max_size=40), st.sampled_from(["..", "%2e%2e", "a/b", "\x00", "plt_", "x" * 600, "-1"]))


@pytest.fixture
def fuzz_server(redis_server):
    ns = "t" + uuid.uuid4().hex[:10]
    d = Daemon(short_home(), config=CONFIG, redis_url=redis_server.url, namespace=ns)
    port = free_port()
    d.start(listen=f"127.0.0.1:{port}")
    d.url, d.ns = f"http://127.0.0.1:{port}", ns
    yield d
    d.cleanup()


def _snapshot(r: redis.Redis, keys: Keys) -> dict[bytes, bytes]:
    """Every key of the namespace and its DUMP, less what the pass and the daemon's own worker touch."""
    volatile = (keys.daemon().encode(), keys.worker("serve").encode())
    names = [k for k in r.scan_iter(match=keys.prefix() + "*", count=1000) if not k.startswith(volatile)]
    pipe = r.pipeline(transaction=False)
    for k in names:
        pipe.dump(k)
    return dict(zip(names, pipe.execute(), strict=True))


def test_no_5xx_and_refused_calls_change_nothing(fuzz_server, redis_client):
    d = fuzz_server
    keys = Keys(d.ns)
    with d.api() as api:
        schema = api.call("GET", "/openapi.json")
        cas_id = api.call("GET", "/v1/status")["cas"]["id"]
    ops = sorted((m.upper(), p) for p, methods in schema["paths"].items() for m in methods)
    assert ("POST", "/v1/worker/report") in ops and ("PUT", "/v1/secrets/{name}") in ops
    good = d.cli("token", "create", "fz", check=True).stdout.strip()
    revoked = d.cli("token", "create", "gone", check=True).stdout.strip()
    d.cli("token", "revoke", "gone", check=True)
    viewer = d.cli("token", "create", "fz-viewer", "--role", "viewer", check=True).stdout.strip()
    operator = d.cli("token", "create", "fz-operator", "--role", "operator", check=True).stdout.strip()
    d.cli("secret", "set", "FUZZ_SECRET", input="fuzz-secret-value", check=True)
    job = d.cli("job", "submit", "--pool", "gpu", "--", "true", check=True).stdout.strip()
    w = SimWorker(ApiClient(url=d.url, token=good), "gpu", cas_id)
    w.register()
    stale = w.claim()["leases"][0]["token"]
    w.api.call("POST", "/v1/worker/release", {"protocol": PROTOCOL, "job": job, "token": stale, "reason": "image"})
    live = w.claim()["leases"][0]["token"]
    assert live != stale
    templates = {
        "/v1/worker/report": {
            "protocol": PROTOCOL,
            "report_id": uuid.uuid4().hex,
            "job": job,
            "token": stale,
            "outcome": "succeeded",
            "exit_code": 0,
        },
        "/v1/worker/release": {"protocol": PROTOCOL, "job": job, "token": stale, "reason": "image"},
        "/v1/worker/log": {"protocol": PROTOCOL, "job": job, "token": stale, "chunks": ["sha256:" + "0" * 64]},
        "/v1/worker/heartbeat": {**w.hello(), "jobs": [{"job": job, "token": stale}]},
        "/v1/worker/claim": {"protocol": PROTOCOL, "want": {"evaluation": 1}},
        "/v1/jobs": {"pool": "gpu", "spec": {"argv": ["true"], "secrets": ["FUZZ_SECRET"]}},
        "/v1/limits": {"key": "executor.pools.gpu.evaluations", "value": "1", "reason": "fuzz"},
        "/v1/tokens": {"name": "fz2"},
    }
    auths = {
        "none": {},
        "garbage": {"authorization": "Bearer garbage"},
        "basic": {"authorization": "Basic eDp5"},
        "unknown": {"authorization": "Bearer plt_" + "A" * 43},
        "revoked": {"authorization": f"Bearer {revoked}"},
        "worker": {"authorization": f"Bearer {good}"},
        "renamed": {"authorization": f"Bearer {good}", "x-piloop-worker": "someone-else"},
        "viewer": {"authorization": f"Bearer {viewer}"},
        "operator": {"authorization": f"Bearer {operator}", "x-piloop-worker": "fz"},
        "socket": {},
    }
    http = httpx.Client(base_url=d.url, timeout=15)
    human = d.api(timeout=15).http  # the unix socket: the daemon's own user, for the act routes' bodies
    state = {"before": _snapshot(redis_client, keys)}
    stats: dict[int, int] = {}

    @st.composite
    def bodies(draw, path: str):
        base = templates.get(path)
        kind = draw(st.sampled_from(["none", "json", "bytes", "mutated"] if base else ["none", "json", "bytes"]))
        if kind == "none":
            return None
        if kind == "bytes":
            return draw(st.binary(max_size=64))
        if kind == "json":
            return draw(json_any)
        field = draw(st.sampled_from(sorted(base)))
        return {**base, field: draw(st.one_of(json_any, st.just(stale), st.just(live + "x")))}

    @st.composite
    def calls(draw):
        method, path = draw(st.sampled_from(ops))
        url = re.sub(
            r"\{[^}]+\}",
            lambda _: quote(draw(st.one_of(st.just(job), odd_text.filter(lambda s: s.strip("/.")))), safe=""),
            path,
        )
        auth = draw(st.sampled_from(sorted(auths)))
        body = draw(bodies(path)) if method in ("POST", "PUT", "PATCH", "DELETE") else None
        params = draw(
            st.dictionaries(
                st.sampled_from(["after", "count", "last", "limit", "state", "pool", "all"]), odd_text, max_size=2
            )
        )
        return method, url, auth, body, params

    @settings(
        max_examples=EXAMPLES, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck)
    )
    @given(calls())
    def one(call) -> None:
        method, url, auth, body, params = call
        kw = {"content": body} if isinstance(body, bytes) else ({"json": body} if body is not None else {})
        r = (human if auth == "socket" else http).request(
            method, url, headers={**auths[auth], "content-type": "application/json"}, params=params, **kw
        )
        stats[r.status_code] = stats.get(r.status_code, 0) + 1
        assert r.status_code < 500, (method, url, auth, body, params, r.status_code, r.text)
        after = _snapshot(redis_client, keys)
        if r.status_code >= 400:
            changed = sorted(k for k in set(after) | set(state["before"]) if after.get(k) != state["before"].get(k))
            assert not changed, (method, url, auth, body, params, r.status_code, r.text, changed)
        state["before"] = after

    one()
    print("answers by status:", dict(sorted(stats.items())))
    http.close()
    human.close()
    w.api.close()
    assert sum(v for k, v in stats.items() if k >= 400) > EXAMPLES // 2, stats
    assert "fuzz-secret-value" not in d.daemon_log() and good not in d.daemon_log()
