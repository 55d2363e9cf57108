"""Access control on every route of the app, and the hardening around it: body limits (declared and chunked),
malformed bodies, the socket's and the home's modes, no token in any log."""

from __future__ import annotations

import re
import stat
import uuid
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from fastapi.routing import APIRoute

from piloop_common.config.load import load_settings
from piloop_common.protocol.worker import PROTOCOL
from piloop_common.sdk.client import SOCKET_NAME
from piloop_server.app import create_app
from tests.helpers.redis import free_port
from tests.helpers.serve import FAST_EXECUTOR, Daemon, short_home

PUBLIC = {"/v1/health"}
WORKER = {
    f"/v1/worker/{r}" for r in ("register", "heartbeat", "claim", "release", "report", "reports", "log", "bundle")
}
RELAY = "/v1/relay/"  # workers reach it for the jobs they hold: its own tests check the lease
# the web page's login and logout take no caller; its views send one without a session to the login (test_ui_login.py)
PAGE_LOGIN = {"/ui/login", "/ui/logout"}


def app_routes(tmp: Path) -> list[tuple[str, str]]:
    """Every (method, path) the daemon's app serves, from the app itself."""
    app = create_app(SimpleNamespace(settings=load_settings(tmp, env={})))  # type: ignore[arg-type]
    out: list[tuple[str, str]] = []

    def walk(routes) -> None:
        for r in routes:
            if hasattr(r, "original_router"):  # FastAPI ≥ 0.16x keeps included routers as they are
                walk(r.original_router.routes)
            elif isinstance(r, APIRoute):
                out.extend((m, r.path) for m in sorted(r.methods or ()) if m != "HEAD")

    walk(app.routes)
    in_schema = {(m.upper(), p) for p, ops in app.openapi()["paths"].items() for m in ops}
    assert in_schema <= set(out), in_schema - set(out)
    return out


@pytest.fixture(scope="module")
def server(redis_server):
    d = Daemon(
        short_home(),
        config=FAST_EXECUTOR + "\n[plugins.network]\nmax_body_mb = 1\n",
        redis_url=redis_server.url,
        namespace="t" + uuid.uuid4().hex[:10],
    )
    port = free_port()
    d.start(listen=f"127.0.0.1:{port}")
    d.url = f"http://127.0.0.1:{port}"
    d.token = d.cli("token", "create", "w1", check=True).stdout.strip()
    yield d
    d.cleanup()


def _call(d: Daemon, method: str, path: str, headers: dict[str, str]) -> httpx.Response:
    url = d.url + re.sub(r"\{[^}]+\}", "x", path)
    body = {} if method in ("POST", "PUT", "PATCH") else None
    return httpx.request(method, url, json=body, headers=headers, timeout=10)


def test_every_route_refuses_workers_unless_it_is_theirs_and_everyone_without_a_token(server, tmp_path):
    d = server
    routes = app_routes(tmp_path)
    assert ("PUT", "/v1/secrets/{name}") in routes and ("POST", "/v1/worker/claim") in routes
    assert {p for _, p in routes} >= WORKER
    worker = {"authorization": f"Bearer {d.token}"}
    unknown = {"authorization": "Bearer plt_" + "A" * 43}
    seen = []
    for method, path in routes:
        anon = _call(d, method, path, {})
        if path in PUBLIC:
            assert anon.status_code == 200, (method, path, anon.text)
            continue
        if path in PAGE_LOGIN:
            assert anon.status_code in (200, 303, 400), (method, path, anon.text)  # the form, or what it lacks
            continue
        if path.startswith("/ui"):  # a view of the page: to the login without a caller, refused to a worker
            assert anon.status_code == 303 and anon.headers["location"] == "/ui/login", (method, path)
            got = _call(d, method, path, {"authorization": f"Bearer {d.token}"})
            assert got.status_code == 403 and "workers can only" in got.text, (method, path, got.text)
            continue
        assert anon.status_code == 401 and anon.json()["error"] == "unauthorized", (method, path, anon.text)
        bad = _call(d, method, path, unknown)
        assert bad.status_code == 403 and "does not know this token" in bad.json()["message"], (method, path)
        if path.startswith(RELAY):
            continue
        got = _call(d, method, path, worker)
        if path in WORKER:
            assert got.status_code not in (401, 403), (method, path, got.text)  # `{}` is a bad body: 400
        else:
            assert got.status_code == 403, (method, path, got.text)
            assert "workers can only" in got.json()["message"]
        seen.append(path)
    assert len(seen) >= 15, seen
    assert d.token not in d.daemon_log()


def test_every_route_takes_a_role_token_whose_role_reaches_its_own_and_no_worker_route(server, tmp_path):
    from piloop_server.api.roleref import PUBLIC, table

    d = server
    roles = ["viewer", "operator", "admin"]
    tokens = {r: d.cli("token", "create", f"r-{r}", "--role", r, check=True).stdout.strip() for r in roles}
    needs = table()
    assert {(m, p) for m, p in app_routes(tmp_path)} == set(needs)
    for (method, path), need in needs.items():
        if need == PUBLIC:
            continue
        for have, token in tokens.items():
            got = _call(d, method, path, {"authorization": f"Bearer {token}"})
            if need == "worker":
                assert got.status_code == 403, (method, path, have, got.text)
                assert f"token r-{have} ({have} role) is not a worker's" in got.json()["message"]
            elif roles.index(have) >= roles.index(need) and (method, path) == ("POST", "/v1/ui/link"):
                # the page's one-time link logs in as the socket's user: made over the socket only, whatever the role
                assert got.status_code == 403 and "over the unix socket" in got.json()["message"], got.text
            elif roles.index(have) >= roles.index(need):
                assert got.status_code not in (401, 403), (method, path, have, got.text)
            else:
                assert got.status_code == 403, (method, path, have, got.text)
                want = f"needs the {need} role; token r-{have} has the {have} role"
                assert want in got.json()["message"], (method, path, got.text)
    assert not any(t in d.daemon_log() for t in tokens.values())


def test_bodies_over_the_limit_are_refused_declared_or_chunked(server):
    d = server
    big = b"x" * (1024 * 1024 + 1)
    headers = {"authorization": f"Bearer {d.token}", "content-type": "application/json"}
    r = httpx.post(d.url + "/v1/worker/claim", content=big, headers=headers)
    assert r.status_code == 413 and r.json()["error"] == "too_large"

    def chunks():
        for i in range(0, len(big), 64 * 1024):
            yield big[i : i + 64 * 1024]

    r = httpx.post(d.url + "/v1/worker/claim", content=chunks(), headers=headers)
    assert r.status_code == 413 and r.json()["error"] == "too_large"
    r = httpx.post(
        d.url + "/v1/worker/claim", content=iter([b'{"protocol": %d,' % PROTOCOL, b' "want": {}}']), headers=headers
    )
    assert r.status_code == 404 and "not registered" in r.json()["message"]  # a small chunked body goes through


@pytest.mark.parametrize(
    "body,says",
    [
        (b"{not json", "JSON decode error"),
        (b'{"pool": 5, "spec": "x"}', "spec: "),
        (b"[]", "body: "),
        (b'{"pool": "serve", "spec": {"argv": ["true"], "timeout_seconds": "soon"}}', "spec.timeout_seconds"),
    ],
)
def test_malformed_bodies_get_a_clear_400(server, body, says):
    with server.api() as api:
        r = api.http.post("/v1/jobs", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"] == "bad_request", r.text
    assert says in r.json()["message"], r.json()["message"]


def test_the_socket_is_0600_and_the_home_0700(server):
    assert stat.S_IMODE((server.home / SOCKET_NAME).stat().st_mode) == 0o600
    assert stat.S_IMODE(server.home.stat().st_mode) == 0o700
