"""TLS: `piloop serve` with `[plugins.network] tls = {cert, key}`, a real `piloop worker` that trusts the
test CA through `SSL_CERT_FILE`, and one that does not and exits saying so."""

from __future__ import annotations

import os
import ssl
import subprocess
import sys

import httpx
import pytest

from piloop_worker.main import EXIT_UNTRUSTED
from tests.helpers.certs import make_pki
from tests.helpers.redis import free_port, wait_for
from tests.helpers.serve import FAST_EXECUTOR, Daemon, cli_env, short_home

GPU = "\n[plugins.executor.pools.gpu]\nagents = 0\nevaluations = 1\nmax_load = 1000\nmin_memory_gb = 0\n"


@pytest.fixture
def tls_server(redis_server, namespace):
    home = short_home()
    pki = make_pki(home / "pki")
    net = f'\n[plugins.network]\ntls = {{ cert = "{pki.cert}", key = "{pki.key}" }}\n'
    d = Daemon(home, config=FAST_EXECUTOR + GPU + net, redis_url=redis_server.url, namespace=namespace)
    port = free_port()
    d.start(listen=f"127.0.0.1:{port}")
    d.url, d.pki = f"https://127.0.0.1:{port}", pki
    yield d
    d.cleanup()


def _worker(d: Daemon, token: str, env: dict[str, str]) -> tuple[subprocess.Popen, object]:
    home = short_home("w")
    (home / "config.toml").write_text(f'[plugins.cas]\nprovider = "local"\npath = "{d.home}/cas"\n')
    base = {k: v for k, v in cli_env(home, {"PILOOP_HTTPS_TOKEN": token}).items() if k != "SSL_CERT_FILE"}
    log = home / "worker.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "piloop_common.cli", "worker", "--server", d.url, "--pool", "gpu"],
        env={**base, **env},
        stdout=open(log, "ab"),
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    return proc, home


def test_a_worker_trusting_the_ca_runs_a_job_and_one_that_does_not_exits_saying_why(tls_server):
    d = tls_server
    assert httpx.get(d.url + "/v1/health", verify=ssl.create_default_context(cafile=d.pki.ca)).json()["ok"]
    with pytest.raises(httpx.ConnectError):
        httpx.get(d.url + "/v1/health")  # the system does not trust the test CA
    with pytest.raises(httpx.TransportError):
        httpx.get(d.url.replace("https:", "http:") + "/v1/health")  # no plain HTTP on the TLS port
    token = d.cli("token", "create", "gpu1", check=True).stdout.strip()
    bad, bad_home = _worker(d, token, {})
    good, good_home = _worker(d, token, {"SSL_CERT_FILE": str(d.pki.ca)})
    try:
        assert bad.wait(30) == EXIT_UNTRUSTED
        out = (bad_home / "worker.log").read_text()
        assert "certificate is not trusted" in out and "SSL_CERT_FILE" in out, out
        assert "Traceback" not in out and out.strip().count("\n") == 0, out
        assert token not in out
        job = d.cli("job", "submit", "--pool", "gpu", "--kind", "evaluation", "--", "true", check=True).stdout.strip()

        def done() -> dict | None:
            with d.api() as api:
                v = api.call("GET", f"/v1/jobs/{job}")
            return v if v["state"] == "succeeded" else None

        v = wait_for(done, 40, interval=0.1, what=f"job {job} to succeed over TLS")
        assert v["worker"] == "gpu1"
    finally:
        for p in (bad, good):
            if p.poll() is None:
                p.terminate()
                p.wait(20)
    logs = (good_home / "worker.log").read_text() + d.daemon_log()
    assert token not in logs and "Traceback" not in logs
    for h in (bad_home, good_home):
        subprocess.run(["rm", "-rf", str(h)], check=False)
    assert os.path.exists(d.pki.key)
