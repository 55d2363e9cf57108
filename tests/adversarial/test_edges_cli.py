"""The smaller holes of issue 26 (item 12) that take a process of their own: a secret key of the wrong length stops
`piloop serve`, `secret rotate-key` reseals every secret, `piloop cas serve` caps a put, the proxy network listens
on loopback only without TLS, and a worker a provisioner starts on the proxy network gets no piloop token. Real
`piloop` processes throughout, over real HTTP.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator

import httpx
import psutil
import pytest

from piloop_common.cas.local import LocalStore
from piloop_server.provisioner.base import NAME_ENV, TAG_ENV
from piloop_server.state.keys import Keys
from tests.helpers.adversary import PROXY_NETWORK
from tests.helpers.redis import free_port, wait_for
from tests.helpers.serve import FAST_EXECUTOR, Daemon, cli_env, piloop, short_home
from tests.helpers.workers import kill_tree_of, token

GPU = "\n[plugins.executor.pools.gpu]\nagents = 0\nevaluations = 1\nmax_load = 1000\nmin_memory_gb = 0\n"
WORKER_KEY = "k-worker-" + uuid.uuid4().hex


def one_line(p: subprocess.CompletedProcess) -> str:
    lines = p.stderr.strip().splitlines()
    assert p.returncode != 0 and len(lines) == 1 and "Traceback" not in p.stderr, (p.returncode, p.stderr)
    return lines[0]


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


# -- a secret key of the wrong length --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "written,says",
    [
        (base64.b64encode(b"k" * 16).decode() + "\n", "the key is 16 bytes; it must be 32"),
        (base64.b64encode(b"k" * 64).decode() + "\n", "the key is 64 bytes; it must be 32"),
        ("not base64 at all!\n", "not base64"),
    ],
    ids=["short", "long", "not_base64"],
)
def test_serve_stops_on_a_secret_key_file_of_the_wrong_length(redis_server, redis_client, namespace, written, says):
    d = Daemon(short_home(), redis_url=redis_server.url, namespace=namespace)
    try:
        key = d.home / "secret.key"
        key.touch(mode=0o600)
        key.write_text(written)
        p = d.cli("serve", timeout=60)
        line = one_line(p)
        assert str(key) in line and says in line, line
        assert not (d.home / "piloop.sock").exists()
        assert key.read_text() == written  # never replaced by a key of the right length
        assert not list(redis_client.scan_iter(match=Keys(namespace).prefix() + "*"))
    finally:
        d.cleanup()


def test_serve_stops_on_a_secret_key_env_of_the_wrong_length(redis_server, namespace):
    d = Daemon(short_home(), redis_url=redis_server.url, namespace=namespace)
    try:
        p = d.cli("serve", env={"PILOOP_SECRET_KEY": base64.b64encode(b"k" * 31).decode()}, timeout=60)
        line = one_line(p)
        assert "PILOOP_SECRET_KEY" in line and "the key is 31 bytes; it must be 32" in line, line
        assert not (d.home / "secret.key").exists()
    finally:
        d.cleanup()


# -- piloop cas serve caps a put -------------------------------------------------------------------------------------


@pytest.fixture
def cas_server(redis_server, namespace) -> Iterator[tuple[Daemon, str, str]]:
    """A daemon whose config caps a CAS put at 1 MiB, and `piloop cas serve` on its home: (daemon, url, token)."""
    d = Daemon(
        short_home(),
        config=FAST_EXECUTOR + "\n[plugins.network]\ncas_max_put_mb = 1\n",
        redis_url=redis_server.url,
        namespace=namespace,
    )
    log = None
    proc: subprocess.Popen | None = None
    try:
        d.start()
        tok = token(d, "cas-user")
        url = f"http://127.0.0.1:{free_port()}"
        log = open(d.home / "logs" / "cas.log", "ab")
        proc = subprocess.Popen(
            [sys.executable, "-m", "piloop_common.cli", "cas", "serve", "--listen", url.removeprefix("http://")],
            env=cli_env(d.home, d.env),
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
        )

        def up() -> bool:
            assert proc is not None and proc.poll() is None, (d.home / "logs" / "cas.log").read_text()
            headers = {"authorization": f"Bearer {tok}"}
            return httpx.get(url + "/v1/cas/identity", headers=headers, timeout=2).is_success

        wait_for(up, 30, interval=0.05, what=f"piloop cas serve on {url}")
        yield d, url, tok
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(10)
        if log is not None:
            log.close()
        d.cleanup()


MIB = 1024 * 1024


def test_cas_serve_refuses_a_put_over_its_cap_and_takes_one_under(cas_server):
    d, url, tok = cas_server
    auth = {"authorization": f"Bearer {tok}"}
    store = LocalStore(d.home / "cas")
    over = os.urandom(MIB + 1)
    under = os.urandom(MIB)
    with httpx.Client(base_url=url, headers=auth, timeout=30) as c:
        # by its Content-Length, before a byte is read
        resp = c.put(f"/v1/cas/blobs/{sha(over)}", content=over)
        assert resp.status_code == 413, resp.text
        msg = resp.json()["message"]
        assert "cas_max_put_mb" in msg and "1 MiB" in msg and "nothing was stored" in msg, msg
        # with no Content-Length (chunked), as it comes
        resp = c.put(
            f"/v1/cas/blobs/{sha(over)}", content=iter([over[i : i + 65536] for i in range(0, len(over), 65536)])
        )
        assert resp.status_code == 413 and "cas_max_put_mb" in resp.json()["message"], resp.text
        assert c.head(f"/v1/cas/blobs/{sha(over)}").status_code == 404
        assert not store.has_many([sha(over)])
        # at the cap, it goes through
        resp = c.put(f"/v1/cas/blobs/{sha(under)}", content=under)
        assert resp.status_code in (200, 201), resp.text
        assert c.get(f"/v1/cas/blobs/{sha(under)}").content == under
    assert store.has_many([sha(under)]) == {sha(under)}


# -- the proxy network: loopback only without TLS; no piloop token for started workers -------------------------------


def test_the_proxy_network_listens_on_loopback_only_without_tls(redis_server, namespace):
    home = short_home()
    (home / "config.toml").write_text(
        FAST_EXECUTOR + PROXY_NETWORK + f'\n[plugins.state]\nurl = "{redis_server.url}"\n'
    )
    env = {"PILOOP_NAMESPACE": namespace}
    try:
        for argv in (
            ("serve", "--listen", f"0.0.0.0:{free_port()}"),
            ("cas", "serve", "--listen", f"[::]:{free_port()}"),
        ):
            listen = argv[-1]
            p = piloop(home, *argv, env=env, timeout=60)
            line = one_line(p)
            assert p.returncode == 2, (argv, p.returncode, line)
            assert (
                f"--listen {listen}" in line
                and "is not a loopback address, and [plugins.network] tls is not set" in line
            )
            assert not (home / "piloop.sock").exists()
    finally:
        shutil.rmtree(home, ignore_errors=True)  # both refused before they started anything


def _tokens(d: Daemon) -> dict[str, dict]:
    return {t["name"]: t for t in json.loads(d.cli("token", "list", "--json", check=True).stdout)}


def _started(tag: str) -> list[psutil.Process]:
    """The processes a local provisioner started with this server's tag (the top of each tree)."""
    out = []
    for p in psutil.process_iter(["pid", "ppid"]):
        try:
            env = p.environ()
        except (psutil.Error, OSError):
            continue
        if env.get(TAG_ENV) == tag and env.get(NAME_ENV):
            out.append(p)
    return [p for p in out if p.info["ppid"] not in {q.pid for q in out}]


@pytest.mark.parametrize("network", ["proxy", "token"])
def test_a_worker_started_on_the_proxy_network_gets_no_piloop_token(redis_server, redis_client, namespace, network):
    # the compute's own env names a token: the server never hands it on
    provisioner = (
        "\n[plugins.executor.pools.gpu.provisioner]\nmax = 1\nregister_seconds = 120\n"
        '\n[plugins.executor.pools.gpu.provisioner.compute]\nprovider = "local"\nhang = true\n'
        'env = { PILOOP_HTTPS_TOKEN = "plt_fromthecompute", EDGE_MARK = "1" }\n'
    )
    config = FAST_EXECUTOR + GPU + provisioner + (PROXY_NETWORK if network == "proxy" else "")
    d = Daemon(short_home(), config=config, redis_url=redis_server.url, namespace=namespace)
    try:
        d.start(listen=f"127.0.0.1:{free_port()}")
        d.cli("secret", "set", "PILOOP_WORKER_CREDENTIAL", input=WORKER_KEY, check=True)
        with d.api() as api:
            tag = api.call("GET", "/v1/health")["server_id"]
            api.call("POST", "/v1/jobs", {"kind": "evaluation", "pool": "gpu", "spec": {"argv": ["true"]}})
        started = wait_for(lambda: _started(tag), 60, interval=0.1, what="the provisioner to start a worker")
        assert len(started) == 1, started
        env = started[0].environ()
        name = env[NAME_ENV]
        assert env["EDGE_MARK"] == "1"  # the compute's env reached it
        tokens = _tokens(d)
        if network == "proxy":
            assert "PILOOP_HTTPS_TOKEN" not in env, env.get("PILOOP_HTTPS_TOKEN")
            assert not [k for k, v in env.items() if "plt_" in v], [k for k, v in env.items() if "plt_" in v]
            assert env["PILOOP_WORKER_CREDENTIAL"] == WORKER_KEY and env["PILOOP_NETWORK__PROVIDER"] == "proxy"
            assert name not in tokens and not tokens, tokens  # nor did the server make one for it
        else:  # the token network, for contrast: its own token, never the compute's
            assert env["PILOOP_HTTPS_TOKEN"].startswith("plt_") and env["PILOOP_HTTPS_TOKEN"] != "plt_fromthecompute"
            assert "PILOOP_WORKER_CREDENTIAL" not in env
            assert tokens[name]["pool"] == "gpu" and not tokens[name]["revoked"], tokens
        assert WORKER_KEY not in d.daemon_log()
    finally:
        d.cleanup()
        kill_tree_of(str(d.home))
