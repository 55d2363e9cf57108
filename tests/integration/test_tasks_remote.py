"""From another machine: a Python client and `piloop attach` with only the API's address (PILOOP_SERVER) and a
credential, no CAS of their own, through an authenticating proxy whose rules let the caller act."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest

from piloop_common.tasks import Client
from tests.helpers import tasks_mod
from tests.helpers.proxy import Proxy
from tests.helpers.redis import free_port
from tests.helpers.serve import FAST_EXECUTOR, Daemon, piloop, short_home
from tests.helpers.slowdown import scaled

REPO = str(Path(__file__).resolve().parents[2])
NETWORK = """
[plugins.network]
provider = "proxy"
url = "https://piloop.example.com"
claims = { org = "x-org-id", user = "x-user-id" }
name_claims = ["user"]
rules = [{ when = { org = "acme" }, access = "act" }]
"""
KEY = f"k-human-{uuid.uuid4().hex}"


@pytest.fixture(scope="module")
def remote(redis_server):
    d = Daemon(
        short_home(),
        config=FAST_EXECUTOR + NETWORK,
        redis_url=redis_server.url,
        namespace="t" + uuid.uuid4().hex[:10],
        env={"PYTHONPATH": REPO},
    )
    d.start(listen=f"127.0.0.1:{free_port()}")
    proxy = Proxy(
        free_port(),
        f"http://{d.listen}",
        {KEY: {"x-org-id": "acme", "x-user-id": "alice"}},
        d.home / "logs" / "proxy.log",
    ).start()
    elsewhere = short_home("away")  # another machine's home: no daemon, no CAS
    yield d, {"PILOOP_SERVER": proxy.url, "PILOOP_HTTPS_TOKEN": KEY}, elsewhere
    proxy.stop()
    d.cleanup()


def test_a_remote_client_runs_a_task_and_attaches_through_the_api(remote, monkeypatch):
    _d, env, elsewhere = remote
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with Client.from_env(elsewhere) as client:
        assert client.api.socket is None
        r = tasks_mod.add.apply_async((20, 22), client=client)
        assert r.get(timeout=scaled(60)) == 42
        job = client.submit([sys.executable, "-c", "print('from afar'); print('twice')"])
        client.wait(job, timeout=scaled(60))
    got = piloop(elsewhere, "attach", job, env=env, timeout=60)
    assert got.returncode == 0, got.stderr
    assert got.stdout == "from afar\ntwice\n"
    assert not (elsewhere / "cas").exists()
