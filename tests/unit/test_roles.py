"""The roles: their order, the one check every route calls, and the table of which route needs what, read off the
app itself and written in docs/security.md."""

from __future__ import annotations

from pathlib import Path

import pytest

from piloop_common.errors import Forbidden, Refused
from piloop_server.api.roleref import PUBLIC, render_roles, splice_roles, table
from piloop_server.auth import ROLE_ORDER, Caller, Role, require_role, require_worker
from piloop_server.state.records.token import Token

DOCS = Path(__file__).resolve().parents[2] / "docs"
WORKER_ROUTES = {
    f"/v1/worker/{r}" for r in ("register", "heartbeat", "claim", "release", "report", "reports", "log", "bundle")
}
ADMIN_PREFIXES = ("/v1/tokens", "/v1/secrets", "/v1/ui/link")  # the link logs in as the socket's user, an admin
OPERATOR_WRITES = {
    ("POST", "/v1/jobs"),
    ("POST", "/v1/jobs/{job_id}/cancel"),
    ("PUT", "/v1/cas/blobs/{address}"),
    ("POST", "/v1/campaigns"),
    ("POST", "/v1/campaigns/{name}/pause"),
    ("POST", "/v1/campaigns/{name}/resume"),
    ("DELETE", "/v1/campaigns/{name}"),
    ("POST", "/v1/inbox/{eid}/ack"),
    ("POST", "/v1/schedules"),
    ("DELETE", "/v1/schedules/{name}"),
}


def _token_caller(role: Role, name: str = "alice") -> Caller:
    return Caller("token", name, False, Token(name, "h", 0, "human:me", role=str(role)), role)


def test_each_role_reaches_itself_and_those_below_it_only():
    assert [str(r) for r in ROLE_ORDER] == ["viewer", "operator", "admin"]
    for i, have in enumerate(ROLE_ORDER):
        for j, need in enumerate(ROLE_ORDER):
            assert have.reaches(need) is (i >= j), (have, need)


def test_the_check_names_the_role_needed_and_the_token_that_lacked_it():
    with pytest.raises(Forbidden) as e:
        require_role(_token_caller(Role.VIEWER), Role.OPERATOR, "POST /v1/jobs")
    assert e.value.message == "POST /v1/jobs needs the operator role; token alice has the viewer role"
    assert require_role(_token_caller(Role.ADMIN), Role.OPERATOR, "x").name == "alice"
    socket = Caller("human", "me", True, role=Role.ADMIN)
    assert require_role(socket, Role.ADMIN, "x") is socket


def test_a_worker_has_no_role_and_a_role_token_is_no_worker():
    worker = Caller("worker", "gpu1", False, Token("gpu1", "h", 0, "human:me"))
    with pytest.raises(Forbidden) as e:
        require_role(worker, Role.VIEWER, "GET /v1/jobs")
    assert (
        "needs the viewer role; token gpu1 is a worker's" in e.value.message and "workers can only" in e.value.message
    )
    assert require_worker(worker) is worker
    with pytest.raises(Refused) as e:  # a worker started with it exits (3), it does not retry
        require_worker(_token_caller(Role.ADMIN, "root"))
    assert "for workers: token root (admin role) is not a worker's" in e.value.message


def test_the_route_table_gives_each_route_the_role_its_decision_says():
    got = table()
    assert len(got) >= 40, got
    for (method, path), needs in got.items():
        if path == "/v1/health":
            assert needs == PUBLIC
        elif path == "/ui" or path.startswith("/ui/"):
            # the page's login and logout, and its views, which check their session themselves (a view without one
            # sends the browser to the login page: test_ui.py, test_ui_login.py); their data comes from /v1
            assert needs == PUBLIC, (method, path)
        elif path in WORKER_ROUTES or path.startswith("/v1/relay/"):
            assert needs == "worker", (method, path)
        elif path.startswith(ADMIN_PREFIXES) or (path.startswith(("/v1/limits", "/v1/workers")) and method != "GET"):
            assert needs == "admin", (method, path)
        elif (method, path) in OPERATOR_WRITES:
            assert needs == "operator", (method, path)
        else:  # every other route only reads
            assert method == "GET" and needs == "viewer", (method, path, needs)
    assert set(got) >= OPERATOR_WRITES and {p for _, p in got} >= WORKER_ROUTES
    public = {p for (_, p), n in got.items() if n == PUBLIC}
    assert public <= {"/v1/health", "/ui", "/ui/login", "/ui/logout", "/ui/{view}", "/ui/{view}/{name}"}, public


def test_security_md_holds_the_table():
    text = (DOCS / "security.md").read_text()
    assert splice_roles(text) == text, (
        "docs/security.md's route table differs from the app: run `python -m piloop_server.docgen --write`"
    )
    assert render_roles() in text
