"""The page's login over plain HTTP against a real `piloop serve`: the link of `piloop ui` works once and briefly,
the session cookie's flags and lifetime, the CSRF header on every write a cookie authenticates, logout, tokens
that may not log in, and what `piloop ui` says when the daemon has no TCP listener."""

from __future__ import annotations

import hashlib
import re
import uuid

import httpx
import pytest

from piloop_server.state.keys import Keys
from piloop_server.ui.sessions import ONCE_SECONDS, SESSION_SECONDS, csrf_for
from tests.helpers.redis import free_port
from tests.helpers.serve import FAST_EXECUTOR, Daemon, short_home
from tests.helpers.workers import submit, token, view


@pytest.fixture(scope="module")
def served(redis_server):
    d = Daemon(short_home(), config=FAST_EXECUTOR, redis_url=redis_server.url, namespace="t" + uuid.uuid4().hex[:10])
    port = free_port()
    d.start(listen=f"127.0.0.1:{port}")
    d.url = f"http://127.0.0.1:{port}"  # type: ignore[attr-defined]
    d.namespace = d.env["PILOOP_NAMESPACE"]  # type: ignore[attr-defined]
    yield d
    d.cleanup()


def link(d: Daemon) -> str:
    out = d.cli("ui", check=True).stdout
    m = re.search(r"(http://\S+/ui/login\?once=(\S+))", out)
    assert m and f"within {ONCE_SECONDS} s" in out, out
    return m.group(1)


def login(d: Daemon) -> httpx.Client:
    c = httpx.Client(base_url=d.url, timeout=10)  # type: ignore[attr-defined]
    r = c.get(link(d).removeprefix(d.url))  # type: ignore[attr-defined]
    assert r.status_code == 303 and r.headers["location"] == "/ui", r.text
    return c


def test_the_link_works_once_and_briefly(served, redis_client):
    d = served
    url = link(d)
    secret = url.rsplit("=", 1)[1]
    keys = Keys(d.namespace)  # type: ignore[attr-defined]
    once_key = keys.ui_once(hashlib.sha256(secret.encode()).hexdigest())
    assert 0 < redis_client.pttl(once_key) <= ONCE_SECONDS * 1000
    assert secret.encode() not in b"".join(redis_client.keys(keys.prefix() + "*"))  # Redis holds only its hash

    r = httpx.get(url, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/ui"
    cookies = r.headers.get_list("set-cookie")
    session = next(c for c in cookies if c.startswith("piloop_session="))
    csrf = next(c for c in cookies if c.startswith("piloop_csrf="))
    assert "HttpOnly" in session and "SameSite=strict" in session and "Path=/" in session
    assert "HttpOnly" not in csrf and "SameSite=strict" in csrf  # the page's script reads it
    assert "Max-Age" not in session and "expires" not in session.lower()  # the browser forgets it at its exit
    assert not redis_client.exists(once_key)

    again = httpx.get(url, follow_redirects=False)
    assert again.status_code == 403 and "used already or has expired" in again.text
    assert "piloop_session" not in again.headers.get("set-cookie", "")
    made_up = httpx.get(url.rsplit("=", 1)[0] + "=" + "x" * 43, follow_redirects=False)
    assert made_up.status_code == 403


def test_a_session_reads_and_writes_only_with_its_csrf_header(served, redis_client):
    d = served
    c = login(d)
    sid = c.cookies["piloop_session"]
    assert c.cookies["piloop_csrf"] == csrf_for(sid)
    assert c.get("/v1/status").status_code == 200
    page = c.get("/ui/jobs")
    assert page.status_code == 200 and 'src="/ui/static/app.js"' in page.text
    assert (
        "frame-ancestors 'none'" in page.headers["content-security-policy"]
        and page.headers["x-frame-options"] == "DENY"
    )

    # reading renews the session's idle time
    skey = Keys(d.namespace).ui_session(hashlib.sha256(sid.encode()).hexdigest())  # type: ignore[attr-defined]
    redis_client.pexpire(skey, 5000)
    assert c.get("/v1/workers").status_code == 200
    assert SESSION_SECONDS * 1000 - 60_000 < redis_client.pttl(skey) <= SESSION_SECONDS * 1000

    jid = submit(d, "sleep", "60", pool="serve")
    for headers in ({}, {"x-piloop-csrf": "0" * 64}, {"x-piloop-csrf": csrf_for("another session")}):
        r = c.post(f"/v1/jobs/{jid}/cancel", headers=headers)
        assert r.status_code == 403 and r.json()["error"] == "forbidden" and "CSRF" in r.json()["message"], r.text
    for method, path in (("POST", "/v1/limits"), ("DELETE", "/v1/limits/executor.pools.serve.agents")):
        assert c.request(method, path, headers={}).status_code == 403
    assert view(d, jid)["state"] != "cancelled"
    r = c.post(f"/v1/jobs/{jid}/cancel", headers={"x-piloop-csrf": c.cookies["piloop_csrf"]})
    assert r.status_code == 200 and r.json()["state"] in ("cancelling", "cancelled"), r.text

    # the link's session is the socket's user, seen as such in what it did
    cancelled = [e for e in d.cli("events", "--json", check=True).stdout.splitlines() if jid in e and "cancel" in e]
    assert cancelled and any('"by": "human:' in e for e in cancelled), cancelled

    # logout needs the header too; then the session is gone from Redis and the API answers 401
    assert c.post("/ui/logout").status_code == 403
    r = c.post("/ui/logout", headers={"x-piloop-csrf": c.cookies["piloop_csrf"]})
    assert r.status_code == 303 and not redis_client.exists(skey)
    stale = httpx.Client(base_url=d.url, cookies={"piloop_session": sid})  # type: ignore[attr-defined]
    assert stale.get("/v1/status").status_code == 401
    assert stale.get("/ui").status_code == 303


def test_no_login_no_page_and_a_worker_token_cannot_log_in(served):
    d = served
    anon = httpx.Client(base_url=d.url)  # type: ignore[attr-defined]
    for path in ("/ui", "/ui/jobs", "/ui/jobs/j123", "/ui/campaigns/demo", "/ui/events", "/ui/inbox"):
        r = anon.get(path)
        assert r.status_code == 303 and r.headers["location"] == "/ui/login", path
    assert anon.get("/v1/status").status_code == 401
    assert anon.get("/ui/login").status_code == 200 and 'name="token"' in anon.get("/ui/login").text
    assert anon.get("/ui/static/app.js").status_code == 200  # code, no data
    assert anon.post("/v1/ui/link").status_code == 401  # a link is made over the socket only

    tok = token(d, "w1", "--pool", "serve")
    r = anon.post("/ui/login", data={"token": tok})
    assert r.status_code == 403 and "not a worker" in r.text and "piloop_session" not in r.headers.get("set-cookie", "")
    with httpx.Client(base_url=d.url, headers={"authorization": f"Bearer {tok}"}) as w:  # type: ignore[attr-defined]
        assert w.post("/v1/ui/link").status_code == 403
    r = anon.post("/ui/login", data={"token": "plt_" + "x" * 43})
    assert r.status_code == 403 and "does not know this token" in r.text
    assert anon.post("/ui/login", data={"token": ""}).status_code == 400
    assert anon.post("/ui/login", content=b"token=" + b"x" * 5000).status_code == 413

    c = login(d)
    assert c.get("/ui/nowhere").status_code == 404 and c.get("/ui/events/x").status_code == 404


def test_piloop_ui_says_how_to_listen_when_serve_has_only_its_socket(daemon):
    p = daemon.cli("ui")
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert "listens only on its unix socket" in p.stderr and "piloop serve --listen 127.0.0.1:8080" in p.stderr
    assert "[plugins.network]" in p.stderr


def test_a_viewer_token_logs_in_to_read_and_an_operator_token_to_act(served):
    """A role token's session has the token's role: the same checks as a bearer call of that token, each request."""
    d = served
    jid = submit(d, "sleep", "60", pool="serve")
    sessions = {}
    for role in ("viewer", "operator"):
        c = httpx.Client(base_url=d.url, timeout=10)  # type: ignore[attr-defined]
        r = c.post("/ui/login", data={"token": token(d, f"ui-{role}", "--role", role)})
        assert r.status_code == 303 and r.headers["location"] == "/ui", r.text
        assert c.get("/ui/jobs").status_code == 200 and c.get("/v1/jobs").status_code == 200
        sessions[role] = c
    viewer, operator = sessions["viewer"], sessions["operator"]
    r = viewer.post(f"/v1/jobs/{jid}/cancel", headers={"x-piloop-csrf": viewer.cookies["piloop_csrf"]})
    assert (
        r.status_code == 403 and "needs the operator role; token ui-viewer has the viewer role" in r.json()["message"]
    )
    assert view(d, jid)["state"] == "running" or view(d, jid)["state"] == "queued"
    r = operator.post(f"/v1/jobs/{jid}/cancel", headers={"x-piloop-csrf": operator.cookies["piloop_csrf"]})
    assert r.status_code == 200 and r.json()["state"] in ("cancelling", "cancelled"), r.text
    limit = {"key": "executor.pools.serve.agents", "value": "0", "reason": "from the page"}
    r = operator.post("/v1/limits", json=limit, headers={"x-piloop-csrf": operator.cookies["piloop_csrf"]})
    assert r.status_code == 403 and "needs the admin role" in r.json()["message"], r.text

    d.cli("token", "revoke", "ui-viewer", check=True)
    assert viewer.get("/v1/status").status_code == 401  # its session ended with its token
    assert viewer.get("/ui").status_code == 303
