"""The proxy network: a test authenticating proxy in front of a real `piloop serve` with the spec's example
config; each rule (worker, service, human), a caller no rule matches, and `plt_` tokens, through the proxy."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
import uuid

import httpx
import pytest

from piloop_common.protocol.worker import PROTOCOL
from tests.helpers.proxy import Proxy
from tests.helpers.redis import free_port, wait_for
from tests.helpers.serve import FAST_EXECUTOR, Daemon, cli_env, short_home

GPU = "\n[plugins.executor.pools.gpu]\nagents = 0\nevaluations = 1\nmax_load = 1000\nmin_memory_gb = 0\n"
# the spec's example, but for listen (the test's port, given with --listen) and url
SPEC_NETWORK = """
[plugins.network]
provider = "proxy"
url = "https://piloop.example.com"
claims = { org = "x-org-id", kind = "x-subject-kind", user = "x-user-id", principal = "x-principal" }
name_claims = ["user", "principal"]
rules = [
  { when = { org = "acme", principal = "key-0123" }, access = "worker" },
  { when = { org = "acme", kind = "service_account" }, access = "act", caller = "service" },
  { when = { org = "acme" }, access = "act" },
]
"""
WORKER_KEY, SERVICE_KEY, HUMAN_KEY, NAMELESS_KEY, OTHER_KEY = (
    f"k-{w}-{uuid.uuid4().hex}" for w in ("worker", "svc", "human", "principal", "other")
)
KEYS = {
    WORKER_KEY: {"x-org-id": "acme", "x-subject-kind": "api_key", "x-principal": "key-0123"},
    SERVICE_KEY: {"x-org-id": "acme", "x-subject-kind": "service_account", "x-principal": "ci-bot"},
    HUMAN_KEY: {"x-org-id": "acme", "x-subject-kind": "user", "x-user-id": "alice", "x-principal": "key-0456"},
    NAMELESS_KEY: {"x-org-id": "acme", "x-subject-kind": "user", "x-principal": "key-0789"},
    OTHER_KEY: {"x-org-id": "umbrella", "x-subject-kind": "user", "x-user-id": "mallory"},
}


@pytest.fixture(scope="module")
def net(redis_server):
    d = Daemon(
        short_home(),
        config=FAST_EXECUTOR + GPU + SPEC_NETWORK,
        redis_url=redis_server.url,
        namespace="t" + uuid.uuid4().hex[:10],
    )
    d.start(listen=f"127.0.0.1:{free_port()}")
    proxy = Proxy(free_port(), f"http://{d.listen}", KEYS, d.home / "logs" / "proxy.log").start()
    yield d, proxy
    proxy.stop()
    d.cleanup()


def _call(proxy: Proxy, key: str, method: str, path: str, body=None, headers=None) -> httpx.Response:
    return httpx.request(
        method, proxy.url + path, json=body, timeout=10, headers={"authorization": f"Bearer {key}", **(headers or {})}
    )


def _events(d: Daemon, type_: str) -> list[dict]:
    with d.api() as api:
        return [e for e in api.call("GET", "/v1/events", params={"last": 1000}) if e["type"] == type_]


@pytest.mark.parametrize(
    "key,signed",
    [(HUMAN_KEY, "human:alice"), (SERVICE_KEY, "service:ci-bot"), (NAMELESS_KEY, "human:key-0789")],
    ids=["human", "service", "principal"],
)
def test_act_callers_sign_their_writes_as_the_rules_say(net, key, signed):
    d, proxy = net
    r = _call(proxy, key, "POST", "/v1/jobs", {"pool": "gpu", "spec": {"argv": ["true"]}})
    assert r.status_code == 200, r.text
    job = r.json()["job"]
    assert any(e["job"] == job and e["by"] == signed for e in _events(d, "job.queued"))
    r = _call(proxy, key, "POST", f"/v1/jobs/{job}/cancel")
    assert r.status_code == 200, r.text
    assert any(e["job"] == job and e["by"] == signed for e in _events(d, "job.cancelled"))
    # a caller's own copy of a claim header never reaches the server: the proxy stamps its own
    r = _call(
        proxy,
        key,
        "POST",
        "/v1/limits",
        {"key": "executor.pools.gpu.evaluations", "value": "1", "reason": "t"},
        headers={"x-user-id": "root", "x-subject-kind": "service_account"},
    )
    assert r.status_code == 200, r.text
    assert _events(d, "limit.set")[-1]["by"] == signed
    assert _call(proxy, key, "POST", "/v1/worker/claim", {"protocol": PROTOCOL, "want": {}}).status_code == 403


def test_a_caller_no_rule_matches_is_refused(net):
    _d, proxy = net
    forged = {"x-org-id": "acme", "x-principal": "key-0123", "x-piloop-worker": "w"}  # stripped by the proxy
    for path, body in (("/v1/jobs", {"pool": "gpu", "spec": {"argv": ["true"]}}), ("/v1/worker/heartbeat", {})):
        r = _call(proxy, OTHER_KEY, "POST", path, body, headers=forged)
        assert r.status_code == 403, r.text
        assert "no rule of [plugins.network] rules matches this caller" in r.json()["message"]
    assert _call(proxy, OTHER_KEY, "GET", "/v1/workers").status_code == 403


def test_piloop_tokens_are_refused_on_the_proxy_network(net):
    d, proxy = net
    token = d.cli("token", "create", "old", check=True).stdout.strip()
    r = httpx.get(proxy.url + "/v1/jobs", headers={"x-api-key": HUMAN_KEY, "authorization": f"Bearer {token}"})
    assert r.status_code == 403 and "piloop tokens (plt_) are refused on the proxy network" in r.json()["message"]
    # not even straight to `listen`, where a token would otherwise be the whole check
    r = httpx.get(f"http://{d.listen}/v1/jobs", headers={"authorization": f"Bearer {token}"})
    assert r.status_code == 403 and "plt_" in r.json()["message"]
    assert token not in d.daemon_log()


def test_the_worker_rule_names_the_worker_by_its_header_and_allows_worker_routes_only(net):
    _d, proxy = net
    r = _call(proxy, WORKER_KEY, "POST", "/v1/worker/claim", {"protocol": PROTOCOL, "want": {}})
    assert r.status_code == 403 and "x-piloop-worker" in r.json()["message"]
    r = _call(
        proxy,
        WORKER_KEY,
        "POST",
        "/v1/worker/claim",
        {"protocol": PROTOCOL, "want": {}},
        headers={"x-piloop-worker": "nobody"},
    )
    assert r.status_code == 404 and "nobody is not registered" in r.json()["message"]
    r = _call(proxy, WORKER_KEY, "GET", "/v1/jobs", headers={"x-piloop-worker": "w1"})
    assert r.status_code == 403 and "workers can only" in r.json()["message"]


def test_a_real_worker_registers_and_runs_a_job_through_the_proxy(net):
    d, proxy = net
    got = d.cli("secret", "set", "PILOOP_WORKER_CREDENTIAL", input=WORKER_KEY, check=True)
    assert WORKER_KEY not in got.stdout + got.stderr
    home = short_home("w")
    (home / "config.toml").write_text(f'[plugins.cas]\nprovider = "local"\npath = "{d.home}/cas"\n')
    env = cli_env(
        home, {"PILOOP_PLUGINS": json.dumps({"network": {"provider": "proxy"}}), "PILOOP_WORKER_CREDENTIAL": WORKER_KEY}
    )
    args = [sys.executable, "-m", "piloop_common.cli", "worker", "--server", proxy.url, "--pool", "gpu"]
    nameless = subprocess.run(args, env=env, capture_output=True, text=True, timeout=60)
    assert nameless.returncode == 2 and "--name" in nameless.stderr and "Traceback" not in nameless.stderr
    log = home / "worker.log"
    proc = subprocess.Popen(
        [*args, "--name", "gpu-a"], env=env, stdout=open(log, "ab"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
    )
    try:
        job = d.cli("job", "submit", "--pool", "gpu", "--", "true", check=True).stdout.strip()

        def done() -> dict | None:
            with d.api() as api:
                v = api.call("GET", f"/v1/jobs/{job}")
            return v if v["state"] == "succeeded" else None

        assert wait_for(done, 40, interval=0.1, what=f"job {job} through the proxy")["worker"] == "gpu-a"
        assert any(e["worker"] == "gpu-a" and e["by"] == "worker:gpu-a" for e in _events(d, "worker.registered"))
        with d.api() as api:
            info = next(w for w in api.call("GET", "/v1/workers") if w["name"] == "gpu-a")
        assert info["pool"] == "gpu"
    finally:
        proc.terminate()
        proc.wait(20)
        out = log.read_text()
        shutil.rmtree(home, ignore_errors=True)
    assert WORKER_KEY not in out + d.daemon_log() and "Traceback" not in out


def test_an_act_rule_gives_its_role_and_a_call_beyond_it_is_refused_naming_both(redis_server):
    viewer_key = f"k-viewer-{uuid.uuid4().hex}"
    rules = SPEC_NETWORK.replace(
        '  { when = { org = "acme" }, access = "act" },',
        '  { when = { org = "acme", kind = "auditor" }, access = "act", role = "viewer" },\n'
        '  { when = { org = "acme" }, access = "act" },',
    )
    assert 'role = "viewer"' in rules
    d = Daemon(
        short_home(),
        config=FAST_EXECUTOR + GPU + rules,
        redis_url=redis_server.url,
        namespace="t" + uuid.uuid4().hex[:10],
    )
    keys = {**KEYS, viewer_key: {"x-org-id": "acme", "x-subject-kind": "auditor", "x-user-id": "victor"}}
    d.start(listen=f"127.0.0.1:{free_port()}")
    proxy = Proxy(free_port(), f"http://{d.listen}", keys, d.home / "logs" / "proxy.log").start()
    try:
        assert _call(proxy, viewer_key, "GET", "/v1/jobs").status_code == 200
        r = _call(proxy, viewer_key, "POST", "/v1/jobs", {"pool": "gpu", "spec": {"argv": ["true"]}})
        assert r.status_code == 403, r.text
        assert r.json()["message"] == "POST /v1/jobs needs the operator role; human:victor has the viewer role"
        r = _call(proxy, HUMAN_KEY, "POST", "/v1/jobs", {"pool": "gpu", "spec": {"argv": ["true"]}})
        assert r.status_code == 200, r.text  # a rule without `role` is admin, as before roles
        assert _call(proxy, HUMAN_KEY, "GET", "/v1/tokens").status_code == 200
    finally:
        proxy.stop()
        d.cleanup()


def test_a_piloop_token_is_refused_in_any_authorization_form(net):
    d, proxy = net
    tok = d.cli("token", "create", f"t-{uuid.uuid4().hex[:6]}", check=True).stdout.strip()
    basic = base64.b64encode(f"alice:{tok}".encode()).decode()
    forms = {
        "a tab": f"Bearer\t{tok}",
        "spaces": f"bearer   {tok}",
        "upper case": f"BEARER {tok}",
        "another scheme": f"Token {tok}",
        "no scheme": tok,
        "basic": f"Basic {basic}",
        "basic unpadded": f"Basic {basic.rstrip('=')}",
    }
    for what, value in forms.items():
        for where in (proxy.url, f"http://{d.listen}"):  # through the proxy, and straight at `listen`
            r = httpx.get(where + "/v1/jobs", headers={"x-api-key": HUMAN_KEY, "authorization": value}, timeout=10)
            assert r.status_code == 403, (what, where, r.text)
            assert "piloop tokens (plt_) are refused on the proxy network" in r.json()["message"], (what, r.text)
    # the proxy's own credential in Authorization still passes
    assert _call(proxy, HUMAN_KEY, "GET", "/v1/jobs").status_code == 200
    assert tok not in d.daemon_log()


def test_a_browsers_write_needs_this_servers_own_page(net):
    d, proxy = net
    body = {"pool": "gpu", "spec": {"argv": ["true"]}}
    queued = len(_events(d, "job.queued"))
    cross = [
        {"origin": "https://evil.example"},
        {"origin": "null"},
        {"sec-fetch-site": "cross-site"},
        {"sec-fetch-site": "same-site", "origin": "https://other.piloop.example.com"},
        {"cookie": "_oauth2_proxy=abc"},  # the proxy's session, and nothing saying which page sent it
        {"cookie": "_oauth2_proxy=abc", "origin": "https://evil.example", "x-piloop-csrf": "guess"},
    ]
    for headers in cross:
        r = _call(proxy, HUMAN_KEY, "POST", "/v1/jobs", body, headers=headers)
        assert r.status_code == 403, (headers, r.text)
        assert "this server's own page" in r.json()["message"], r.text
        r = _call(
            proxy,
            HUMAN_KEY,
            "POST",
            "/v1/limits",
            {"key": "executor.pools.gpu.evaluations", "value": "0", "reason": "x"},
            headers=headers,
        )
        assert r.status_code == 403, (headers, r.text)
    assert len(_events(d, "job.queued")) == queued and not [e for e in _events(d, "limit.set") if e["value"] == "0"]
    same = [
        {"sec-fetch-site": "same-origin"},
        {"origin": "https://piloop.example.com"},  # [plugins.network] url
        {"cookie": "_oauth2_proxy=abc", "origin": "https://piloop.example.com", "sec-fetch-site": "same-origin"},
        {},  # no browser: the CLI, a service
    ]
    for headers in same:
        r = _call(proxy, HUMAN_KEY, "POST", "/v1/jobs", body, headers=headers)
        assert r.status_code == 200, (headers, r.text)
    # a read is never refused for it
    assert _call(proxy, HUMAN_KEY, "GET", "/v1/jobs", headers={"origin": "https://evil.example"}).status_code == 200


def test_health_says_only_that_it_is_up_to_a_caller_it_does_not_know(net, server):
    d, proxy = net
    for url, headers in (
        (f"http://{d.listen}", {}),  # no claims: no rule matches
        (f"http://{d.listen}", {"authorization": "Bearer plt_" + "A" * 43}),
        (server.url, {}),
        (server.url, {"authorization": "Bearer plt_" + "A" * 43}),
        (server.url, {"authorization": "Basic Zm9vOmJhcg=="}),
    ):
        r = httpx.get(url + "/v1/health", headers=headers, timeout=10)
        assert r.status_code == 200 and r.json() == {"ok": True}, (url, headers, r.text)
    viewer = server.cli("token", "create", "v1", "--role", "viewer", check=True).stdout.strip()
    worker = server.cli("token", "create", "w1", check=True).stdout.strip()
    for tok in (viewer, worker):
        got = httpx.get(server.url + "/v1/health", headers={"authorization": f"Bearer {tok}"}, timeout=10).json()
        assert got["ok"] and got["version"] and got["pid"] and got["server_id"], got
    got = _call(proxy, HUMAN_KEY, "GET", "/v1/health").json()
    assert got["version"] and got["pid"], got
    with server.api() as api:  # the socket's user
        assert api.call("GET", "/v1/health")["version"]
