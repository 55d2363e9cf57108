"""Token and worker names (issue 26, item 8), attacked over real HTTP against a real `piloop serve`: every bad name
is refused with a 4xx and one line, and the namespace's keys are as they were."""

from __future__ import annotations

import json

import pytest

from piloop_common.protocol.worker import PROTOCOL
from piloop_common.sdk.client import ApiClient
from piloop_server.state.keys import Keys
from piloop_server.state.records.token import Token
from tests.helpers.keyspace import settled
from tests.helpers.serve import Daemon, short_home
from tests.helpers.workers import token, wait_for

ATTACKS = ["serve", "piloop-x", "victim:leases:evaluation", "../../etc", "*", "{evil}", "x" * 300, "Gpu1", ""]
JSON = {"content-type": "application/json"}


def cas_id(d: Daemon) -> str:
    with d.api() as api:
        return api.call("GET", "/v1/status")["cas"]["id"]


def hello(d: Daemon, pool: str = "gpu") -> bytes:
    return json.dumps(
        {
            "protocol": PROTOCOL,
            "pool": pool,
            "image": "",
            "cas_id": cas_id(d),
            "sample": {"cpus": 1, "load1": 0.0, "memory_available_gb": 8.0, "disk_free_gb": 10.0},
            "jobs": [],
        }
    ).encode()


def one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


def test_a_token_with_a_bad_name_is_refused_by_the_cli_and_by_the_api(server, redis_client, namespace):
    keys = Keys(namespace)
    before = settled(redis_client, keys)
    for name in ATTACKS:
        p = server.cli("token", "create", name, "--pool", "gpu")
        line = one_line(p.stderr)
        assert p.returncode != 0 and "token name" in line and repr(name[:60]) in line, (name, line)
        with server.api() as api:  # past the CLI's own check: the server holds the same rule
            status, body = api.request("POST", "/v1/tokens", json.dumps({"name": name}).encode(), headers=JSON)
        msg = json.loads(body)["message"]
        assert status == 400 and "token name" in msg and repr(name[:60]) in msg, (name, status, msg)
    assert settled(redis_client, keys) == before
    assert token(server, "gpu-box.1_a", "--pool", "gpu").startswith("plt_")  # the rule lets a good name through


def test_a_rename_token_cannot_name_its_worker_badly(server, redis_client, namespace):
    keys = Keys(namespace)
    tok = token(server, "fleet", "--pool", "gpu", "--rename")
    body = hello(server)
    api = ApiClient(url=server.url, token=tok)
    before = settled(redis_client, keys)
    for name in ATTACKS:
        for path in ("/v1/worker/register", "/v1/worker/heartbeat", "/v1/worker/claim"):
            sent = (
                body
                if path != "/v1/worker/claim"
                else json.dumps({"protocol": PROTOCOL, "want": {"agent": 0, "evaluation": 1}}).encode()
            )
            status, answer = api.request("POST", path, sent, headers={**api.headers, **JSON, "x-piloop-worker": name})
            msg = json.loads(answer)["message"]
            assert status == 403 and "worker name" in msg and repr(name[:60]) in msg, (name, path, status, msg)
    assert settled(redis_client, keys) == before
    assert not [k for k in redis_client.scan_iter(match=keys.prefix() + "*") if b"victim" in k or b"evil" in k]
    # the same token and body with a good name: the refusals above were the names'
    status, answer = api.request(
        "POST", "/v1/worker/register", body, headers={**api.headers, **JSON, "x-piloop-worker": "gpu-box-7"}
    )
    assert status == 200 and json.loads(answer)["worker"] == "gpu-box-7", answer
    api.close()


def test_on_the_socket_the_daemons_own_worker_is_serve_but_no_name_spells_a_key(daemon, redis_client, namespace):
    keys = Keys(namespace)
    wait_for(lambda: redis_client.sismember(keys.workers(), "serve"), 30, what="the serve worker registered")
    before = settled(redis_client, keys)
    with daemon.api() as api:
        for name in ("victim:leases:evaluation", "../x", ""):
            status, answer = api.request(
                "POST", "/v1/worker/register", hello(daemon, "serve"), headers={**JSON, "x-piloop-worker": name}
            )
            assert status == 403 and "worker name" in json.loads(answer)["message"], (name, status, answer)
    assert settled(redis_client, keys) == before


@pytest.mark.parametrize(
    "kind,bad", [("token", "Victim:leases:evaluation"), ("worker", "victim:leases:evaluation"), ("token", "serve")]
)
def test_serve_stops_at_start_on_a_bad_name_already_in_redis(redis_server, redis_client, namespace, kind, bad):
    keys = Keys(namespace)
    if kind == "token":  # as a server from before the rule wrote it
        rec = Token(bad, "0" * 64, 1, "human:old")
        redis_client.hset(keys.tokens(), bad, rec.to_redis())
        redis_client.hset(keys.token_hashes(), rec.hash, bad)
    else:
        redis_client.sadd(keys.workers(), bad)
    d = Daemon(short_home(), redis_url=redis_server.url, namespace=namespace)
    try:
        p = d.cli("serve", timeout=60)
        line = one_line(p.stderr)
        assert p.returncode != 0 and f"the {kind} name {bad!r}" in line and "remove it by hand" in line, line
        assert not (d.home / "piloop.sock").exists()
    finally:
        d.cleanup()
