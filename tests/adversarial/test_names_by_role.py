"""Names by role: the event stream, the inbox and `status` name tokens (their names, roles, pools, the token that
signed a write) and secrets only to an admin, the one role that lists them (`GET /v1/tokens`, `/v1/secrets`).
A real `piloop serve` over TCP, real tokens of each role, and writes made by them."""

from __future__ import annotations

import uuid

import httpx
import pytest

from tests.helpers.serve import FAST_EXECUTOR
from tests.helpers.workers import GPU, token

SECRET = "NAME_ONLY_ADMINS_SEE"
OPERATOR = "robot-only-admins-see"
WORKER = "gpu-only-admins-see"
GONE = "revoked-only-admins-see"
HIDDEN = "(hidden)"


@pytest.fixture(scope="module")
def world(tcp_daemon):
    d = tcp_daemon(FAST_EXECUTOR + GPU).d
    names = {role: f"{role}-{uuid.uuid4().hex[:6]}" for role in ("viewer", "operator", "admin")}
    tokens = {role: token(d, name, "--role", role) for role, name in names.items()}
    op = token(d, OPERATOR, "--role", "operator")
    token(d, WORKER, "--pool", "gpu")
    token(d, GONE, "--role", "viewer")
    d.cli("token", "revoke", GONE, check=True)
    d.cli("secret", "set", SECRET, input="value", check=True)
    d.cli("secret", "rm", SECRET, check=True)
    # a write signed by the operator's token: job.queued names it in `by`
    resp = httpx.post(
        f"{d.url}/v1/jobs",  # type: ignore[attr-defined]
        headers={"authorization": f"Bearer {op}"},
        json={"pool": "gpu", "spec": {"argv": ["true"]}},
        timeout=10,
    )
    assert resp.status_code == 200, resp.text
    return d, tokens, names


def _get(d, tok: str, path: str, **params) -> httpx.Response:
    resp = httpx.get(f"{d.url}{path}", headers={"authorization": f"Bearer {tok}"}, params=params, timeout=10)
    assert resp.status_code == 200, resp.text
    return resp


READS = [("/v1/events", {"after": "0", "count": 10_000}), ("/v1/events", {"last": 1000}), ("/v1/inbox", {"all": True})]


@pytest.mark.parametrize("role", ["viewer", "operator"])
def test_a_viewer_or_operator_sees_no_token_or_secret_name(world, role):
    d, tokens, names = world
    for path, params in READS:
        text = _get(d, tokens[role], path, **params).text
        for name in (SECRET, OPERATOR, WORKER, GONE, *names.values()):
            assert name not in text, (path, name)
    text = _get(d, tokens[role], "/v1/status").text
    assert OPERATOR not in text and SECRET not in text
    got = _get(d, tokens[role], "/v1/events", after="0", count=10_000).json()
    made = [e for e in got if e["type"] == "token.created"]
    assert len(made) >= 6 and all(e["name"] == e["role"] == e["pool"] == HIDDEN for e in made), made
    assert {e["name"] for e in got if e["type"].startswith("secret.")} == {HIDDEN}
    assert [e["name"] for e in got if e["type"] == "token.revoked"] == [HIDDEN]
    queued = [e for e in got if e["type"] == "job.queued" and e["by"] != f"token:{names[role]}"]
    assert queued and all(e["by"] == f"token:{HIDDEN}" and e["pool"] == "gpu" for e in queued), queued


def test_a_token_sees_its_own_name_on_its_own_writes(world):
    d, tokens, names = world
    resp = httpx.post(
        f"{d.url}/v1/jobs",
        headers={"authorization": f"Bearer {tokens['operator']}"},
        json={"pool": "gpu", "spec": {"argv": ["true"]}},
        timeout=10,
    )
    assert resp.status_code == 200, resp.text
    got = _get(d, tokens["operator"], "/v1/events", after="0", count=10_000).json()
    signed = {e["by"] for e in got if e["type"] == "job.queued"}
    assert signed == {f"token:{names['operator']}", f"token:{HIDDEN}"}, (
        signed
    )  # its own, and the other operator's hidden


def test_an_admin_sees_every_name(world):
    d, tokens, _names = world
    got = _get(d, tokens["admin"], "/v1/events", after="0", count=10_000).json()
    made = {e["name"]: (e["role"], e["pool"]) for e in got if e["type"] == "token.created"}
    assert made[OPERATOR] == ("operator", "") and made[WORKER] == ("worker", "gpu"), made
    assert {e["name"] for e in got if e["type"].startswith("secret.")} == {SECRET}
    assert [e["name"] for e in got if e["type"] == "token.revoked"] == [GONE]
    assert {e["by"] for e in got if e["type"] == "job.queued"} >= {f"token:{OPERATOR}"}
    # the socket's user is an admin: the CLI shows them too
    assert OPERATOR in d.cli("events", check=True).stdout


def test_a_jobs_secret_names_are_shown_to_an_admin_only(world):
    d, tokens, _ = world
    kept = "KEPT_" + uuid.uuid4().hex[:8].upper()
    d.cli("secret", "set", kept, input="value", check=True)
    resp = httpx.post(
        f"{d.url}/v1/jobs",
        headers={"authorization": f"Bearer {tokens['admin']}"},
        json={"pool": "gpu", "spec": {"argv": ["true"], "secrets": [kept]}},
        timeout=10,
    )
    assert resp.status_code == 200, resp.text
    job = resp.json()["job"]
    for role in ("viewer", "operator"):
        shown = _get(d, tokens[role], f"/v1/jobs/{job}").json()
        assert shown["spec"]["secrets"] == [HIDDEN], (role, shown["spec"])
        listed = _get(d, tokens[role], "/v1/jobs", limit=50)
        assert kept not in listed.text and job in listed.text, role
    assert _get(d, tokens["admin"], f"/v1/jobs/{job}").json()["spec"]["secrets"] == [kept]
