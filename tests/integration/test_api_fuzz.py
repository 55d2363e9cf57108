"""The API fuzzed from its own OpenAPI schema with schemathesis, against a real `piloop serve` over its TCP listener
on loopback: every operation, every role (admin, operator, viewer, a worker's token, a `--rename` one, none), with
bodies, paths and queries that fit the schema and ones that do not. No answer is a 5xx, no connection is reset and
no body holds a traceback; and after each write it let in, every listing still answers 200.

The run is derandomized (the same examples every run, so a failure reproduces as is); hypothesis prints the
falsifying example, and the failing call is printed as a curl command. `PILOOP_FUZZ_EXAMPLES` sets the budget."""

from __future__ import annotations

import os
import uuid

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.generation import GenerationMode

from piloop_common.sdk.client import ApiClient
from tests.helpers.redis import free_port
from tests.helpers.serve import Daemon, short_home
from tests.helpers.simworker import SimWorker

CONFIG = """
[plugins.executor]
renew_seconds = 10
grace_seconds = 120
toleration_seconds = 600
pass_seconds = 0.5

[plugins.executor.pools.gpu]
agents = 1
evaluations = 2
max_load = 1000
min_memory_gb = 0
"""
EXAMPLES = int(os.environ.get("PILOOP_FUZZ_EXAMPLES", "1500"))  # about 40 s here
LISTINGS = ("/v1/jobs", "/v1/workers", "/v1/status", "/v1/schedules", "/v1/events?after=0&count=1000")
ROLES = ("admin", "operator", "viewer", "worker", "renamed", "none")


@pytest.fixture(scope="module")
def fuzzed(redis_server):
    ns = "t" + uuid.uuid4().hex[:10]
    d = Daemon(short_home(), config=CONFIG, redis_url=redis_server.url, namespace=ns)
    port = free_port()
    d.start(listen=f"127.0.0.1:{port}")
    d.url = f"http://127.0.0.1:{port}"  # type: ignore[attr-defined]
    try:
        yield d
    finally:
        d.cleanup()


def _tokens(d: Daemon) -> dict[str, dict[str, str]]:
    def make(name: str, *args: str) -> str:
        return d.cli("token", "create", name, *args, check=True).stdout.strip()

    worker = make("fz-worker", "--pool", "gpu")
    return {
        "admin": {"authorization": f"Bearer {make('fz-admin', '--role', 'admin')}"},
        "operator": {"authorization": f"Bearer {make('fz-operator', '--role', 'operator')}"},
        "viewer": {"authorization": f"Bearer {make('fz-viewer', '--role', 'viewer')}"},
        "worker": {"authorization": f"Bearer {worker}"},
        "renamed": {
            "authorization": f"Bearer {make('fz-fleet', '--pool', 'gpu', '--rename')}",
            "x-piloop-worker": "fz-fleet-1",
        },
        "none": {},
    }


@pytest.mark.timeout(900)
def test_no_5xx_no_reset_no_traceback_on_any_route_for_any_role(fuzzed):
    d = fuzzed
    with d.api() as api:
        raw = api.call("GET", "/openapi.json")
        cas_id = api.call("GET", "/v1/status")["cas"]["id"]
    auths = _tokens(d)
    # something to read and to act on: a job, a registered worker holding a lease, a secret
    d.cli("secret", "set", "FUZZ_SECRET", input="fuzz-secret-value", check=True)
    d.cli("job", "submit", "--pool", "gpu", "--", "true", check=True)
    w = SimWorker(ApiClient(url=d.url, token=auths["worker"]["authorization"].split()[1]), "gpu", cas_id)
    w.register()
    w.claim()
    schema = schemathesis.openapi.from_dict(raw)
    ops = sorted((r.ok() for r in schema.get_all_operations()), key=lambda op: op.label)
    assert len(ops) > 30, [op.label for op in ops]
    cases = st.sampled_from(ops).flatmap(
        lambda op: st.sampled_from([GenerationMode.POSITIVE, GenerationMode.NEGATIVE]).flatmap(op.as_strategy)
    )
    session = requests.Session()
    seen: dict[str, int] = {}

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        print_blob=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=cases, role=st.sampled_from(ROLES))
    def one(case, role: str) -> None:
        headers = {**(case.headers or {}), **auths[role]}
        try:
            resp = case.call(base_url=d.url, session=session, headers=headers, timeout=30)  # type: ignore[attr-defined]
        except requests.ConnectionError as e:
            pytest.fail(f"{role}: the connection was reset: {e}\n{case.as_curl_command(headers=headers)}")
        status = resp.status_code
        seen[str(status)[0] + "xx"] = seen.get(str(status)[0] + "xx", 0) + 1
        body = resp.content.decode("utf-8", "replace")
        where = f"{role}: {case.method} {case.formatted_path} -> {status}\n{case.as_curl_command(headers=headers)}"
        assert status < 500, f"{where}\n{body[:2000]}"
        assert "Traceback" not in body, f"{where}\n{body[:2000]}"
        if case.method != "GET" and status < 300:
            # what a write let in never poisons a listing
            for path in LISTINGS:
                got = session.get(d.url + path, headers=auths["viewer"], timeout=30)  # type: ignore[attr-defined]
                assert got.status_code == 200, f"{where}\nthen GET {path} -> {got.status_code}: {got.text[:2000]}"

    one()
    session.close()
    w.api.close()
    print("answers by class:", dict(sorted(seen.items())))
    assert seen.get("2xx") and seen.get("4xx"), seen  # the fuzz reached past the door and was refused at it
    assert "Traceback" not in d.daemon_log(), d.daemon_log()[-4000:]
