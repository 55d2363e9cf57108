"""Faults at a worker's start and in its jobs' reach: the server is asked before the CAS (a revoked token is a
refusal, exit 3, even with a `cached` CAS over `http` that the token no longer opens; a certificate the worker does
not trust is one line and exit 5, even where the CAS sits behind it), and a job finds its worker's `piloop` and
hears, in its log, when its relay cannot serve it.

Real processes: `piloop serve` over TCP (HTTPS with a test CA for the TLS test), `piloop cas serve` over the
server's own store, `piloop worker`, and agent jobs that run the real CLI."""

from __future__ import annotations

import os
import shutil
import ssl
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from piloop_worker.main import EXIT_OK, EXIT_REFUSED, EXIT_UNTRUSTED
from tests.helpers.certs import Pki, make_pki
from tests.helpers.redis import free_port, wait_for
from tests.helpers.s3 import stop, wait_until_answers
from tests.helpers.serve import FAST_EXECUTOR, Daemon, cli_env, fast_executor, short_home
from tests.helpers.workers import GPU, RemoteWorker, kill_tree_of, state, submit, tcp_server, token

VENV_BIN = os.path.dirname(sys.executable)
# a PATH without the venv: the worker is found by the absolute path of its interpreter only
BARE_PATH = os.pathsep.join(p for p in ("/usr/local/bin", "/usr/bin", "/bin") if p != VENV_BIN)
# a re-attach after a detach takes seconds on a loaded machine: fence late, the test is about the relay
LATE_FENCE = fast_executor(20)


class CasServe:
    """`piloop cas serve` over the daemon's own store, checking tokens in the daemon's Redis and namespace."""

    def __init__(self, d: Daemon, redis_url: str, namespace: str, pki: Pki | None = None) -> None:
        self.home = short_home("cas")
        tls = f'\n[plugins.network]\ntls = {{ cert = "{pki.cert}", key = "{pki.key}" }}\n' if pki else ""
        (self.home / "config.toml").write_text(
            f'[plugins.state]\nurl = "{redis_url}"\n\n[plugins.cas]\nprovider = "local"\npath = "{d.home}/cas"\n' + tls
        )
        port = free_port()
        self.url = f"{'https' if pki else 'http'}://127.0.0.1:{port}"
        self.log = open(self.home / "cas.log", "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "piloop_common.cli", "cas", "serve", "--listen", f"127.0.0.1:{port}"],
            env=cli_env(self.home, {"PILOOP_NAMESPACE": namespace}),
            stdout=self.log,
            stderr=self.log,
            stdin=subprocess.DEVNULL,
        )
        if pki is None:
            wait_until_answers(f"{self.url}/v1/cas/identity", self.proc)
        else:
            ctx = ssl.create_default_context(cafile=str(pki.ca))
            wait_for(lambda: self._answers(ctx), 30, interval=0.1, what=f"the CAS at {self.url}")

    def _answers(self, verify: ssl.SSLContext) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"piloop cas serve exited {self.proc.returncode}: {self.output()}")
        try:
            httpx.get(f"{self.url}/v1/cas/identity", verify=verify, timeout=2)
        except httpx.TransportError:
            return False
        return True

    def status_for(self, tok: str, verify: ssl.SSLContext | bool = True) -> int:
        headers = {"authorization": f"Bearer {tok}"}
        return httpx.get(f"{self.url}/v1/cas/identity", headers=headers, verify=verify, timeout=5).status_code

    def output(self) -> str:
        return (self.home / "cas.log").read_text(errors="replace")

    def cleanup(self) -> None:
        stop(self.proc)
        self.log.close()
        shutil.rmtree(self.home, ignore_errors=True)


def cached_over(url: str, home: Path) -> str:
    """A worker's `[plugins.cas]`: a cache in its home in front of the CAS at `url` (its token: the worker's)."""
    return (
        f'[plugins.cas]\nprovider = "cached"\npath = "{home}/cas-cache"\n'
        f'remote = {{ provider = "http", url = "{url}" }}\n'
    )


def registered(w: RemoteWorker, timeout: float = 30) -> None:
    def seen() -> bool:
        if not w.alive:
            raise AssertionError(f"the worker exited {w.proc.returncode if w.proc else '?'}: {w.output()}")
        return "event=worker.registered" in w.output()

    wait_for(seen, timeout, interval=0.1, what="the worker to register")


def one_line(out: str) -> str:
    lines = out.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out, out
    return lines[0]


def agent(d: Daemon, script: str, *opts: str) -> str:
    return submit(d, "sh", "-c", textwrap.dedent(script), kind="agent", opts=("--campaign", "c1", *opts))


@pytest.fixture
def cas_http(server, redis_server, namespace) -> Iterator[CasServe]:
    c = CasServe(server, redis_server.url, namespace)
    yield c
    c.cleanup()


@pytest.fixture
def tls(redis_server, namespace) -> Iterator[tuple[Daemon, CasServe]]:
    """`piloop serve` over HTTPS (a test CA the system does not trust), and a `piloop cas serve` over HTTPS too."""
    home = short_home()
    pki = make_pki(home / "pki")
    net = f'\n[plugins.network]\ntls = {{ cert = "{pki.cert}", key = "{pki.key}" }}\n'
    d = Daemon(home, config=FAST_EXECUTOR + GPU + net, redis_url=redis_server.url, namespace=namespace)
    port = free_port()
    d.start(listen=f"127.0.0.1:{port}")
    d.url, d.pki = f"https://127.0.0.1:{port}", pki
    c = CasServe(d, redis_server.url, namespace, pki)
    yield d, c
    c.cleanup()
    d.cleanup()
    kill_tree_of(str(home))


@pytest.fixture
def late_server(redis_server, namespace) -> Iterator[Daemon]:
    d = tcp_server(redis_server.url, namespace, config=LATE_FENCE)
    yield d
    d.cleanup()
    kill_tree_of(str(d.home))


def test_a_revoked_token_is_refused_with_the_servers_reason_though_its_cached_http_cas_refuses_it_first(
    server, cas_http, workers
):
    d = server
    tok = token(d, "gpu1")
    first = workers(d, tok, same_cas=False)
    (first.home / "config.toml").write_text(cached_over(cas_http.url, first.home))
    first.start()
    registered(first)  # the cached CAS over http opens with a live token, and is the server's
    d.cli("token", "revoke", "gpu1", check=True)
    # the CAS refuses the revoked token too (within its token cache's 2 s): opened first, it would say so first
    wait_for(lambda: cas_http.status_for(tok) == 401, 15, interval=0.1, what="the CAS to refuse the revoked token")
    assert first.wait(30) == EXIT_REFUSED, first.output()

    again = workers(d, tok, same_cas=False)
    (again.home / "config.toml").write_text(cached_over(cas_http.url, again.home))
    again.start()
    assert again.wait(30) == EXIT_REFUSED, again.output()
    line = one_line(again.output())
    assert line == "piloop worker: refused by the server: token gpu1 was revoked", line
    assert tok not in again.output() + first.output()


def test_an_untrusted_certificate_is_one_line_naming_the_url_and_the_ca_setting_and_exit_5(tls):
    d, cas = tls
    ca = ssl.create_default_context(cafile=str(d.pki.ca))
    tok = token(d, "gpu1")
    assert cas.status_for(tok, verify=ca) == 200
    with pytest.raises(httpx.ConnectError):
        cas.status_for(tok)  # the system does not trust the test CA: the worker's CAS alone would fail on it

    def worker(env: dict[str, str]) -> tuple[subprocess.Popen, Path]:
        home = short_home("w")
        (home / "config.toml").write_text(cached_over(cas.url, home))
        base = {k: v for k, v in cli_env(home, {"PILOOP_HTTPS_TOKEN": tok}).items() if k != "SSL_CERT_FILE"}
        with open(home / "worker.log", "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "piloop_common.cli", "worker", "--server", d.url, "--pool", "gpu"],
                env={**base, **env},
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        return proc, home

    bad, bad_home = worker({})
    good, good_home = worker({"SSL_CERT_FILE": str(d.pki.ca)})
    try:
        assert bad.wait(30) == EXIT_UNTRUSTED, (bad_home / "worker.log").read_text()
        line = one_line((bad_home / "worker.log").read_text())
        assert line.startswith(f"piloop worker: {d.url}: the server's certificate is not trusted ("), line
        assert line.endswith("set SSL_CERT_FILE to the CA that signed it"), line
        assert "CERTIFICATE_VERIFY_FAILED" not in line and tok not in line, line

        def good_registered() -> bool:
            out = (good_home / "worker.log").read_text(errors="replace")
            if good.poll() is not None:
                raise AssertionError(f"the worker trusting the CA exited {good.returncode}: {out}")
            return "event=worker.registered" in out

        wait_for(good_registered, 30, interval=0.1, what="the worker trusting the CA to register")
        good.terminate()
        assert good.wait(20) == EXIT_OK
        out = (good_home / "worker.log").read_text(errors="replace")
        assert "Traceback" not in out and tok not in out, out
    finally:
        for p in (bad, good):
            if p.poll() is None:
                p.kill()
                p.wait(10)
        for h in (bad_home, good_home):
            kill_tree_of(str(h))
            shutil.rmtree(h, ignore_errors=True)


def test_an_agent_of_a_worker_started_by_its_interpreters_path_finds_piloop(server, workers, tmp_path):
    assert os.access(os.path.join(VENV_BIN, "piloop"), os.X_OK), f"no piloop beside {sys.executable}"
    d = server
    w = workers(d, token(d, "gpu1"), env={"PATH": BARE_PATH}).start()  # `sys.executable -m ...`, absolute
    out = tmp_path / "out"
    script = f"""
        set -e
        echo "$PATH" > {out}.path
        command -v piloop > {out}.which
        piloop progress hello
    """
    job = agent(d, script)
    v = state(d, job, "succeeded", "failed", "worker_lost")
    assert v["state"] == "succeeded", (v, d.cli("attach", job, timeout=30).stdout, w.output())
    assert [n["note"] for n in v["progress"]] == ["hello"]
    assert (tmp_path / "out.path").read_text().strip() == f"{VENV_BIN}{os.pathsep}{BARE_PATH}"
    assert (tmp_path / "out.which").read_text().strip() == os.path.join(VENV_BIN, "piloop")

    # a spec that sets PATH itself still gets the worker's bin dir first
    job = agent(d, script.replace("hello", "again"), "--env", "PATH=/bin")
    v = state(d, job, "succeeded", "failed", "worker_lost")
    assert v["state"] == "succeeded", (v, d.cli("attach", job, timeout=30).stdout, w.output())
    assert [n["note"] for n in v["progress"]] == ["again"]
    assert (tmp_path / "out.path").read_text().strip() == f"{VENV_BIN}{os.pathsep}/bin"


def test_a_relay_that_cannot_listen_says_so_in_the_jobs_log(late_server, workers, tmp_path):
    d = late_server
    tok = token(d, "gpu1")
    first = workers(d, tok)
    workdir = first.home / "dir"  # in the first worker's home: its cleanup ends whatever runs there
    first.args = ("--dir", str(workdir))
    first.start()
    go, out, relay = tmp_path / "go", tmp_path / "out", tmp_path / "relay"
    job = agent(
        d,
        f"""
        echo "$PILOOP_RELAY" > {relay}.tmp && mv {relay}.tmp {relay}
        while [ ! -e {go} ]; do sleep 0.05; done
        piloop progress late > {out} 2>&1; echo "rc=$?" >> {out}
    """,
    )

    def relay_socket() -> Path | None:
        at = relay.read_text().strip() if relay.exists() else ""  # where the job's `piloop` calls its relay
        return Path(at) if at and Path(at).is_socket() else None

    sock = wait_for(relay_socket, 30, interval=0.05, what="the job's relay socket")
    first.terminate()  # detach: the job runs on under its supervisor, its socket file left for the next worker
    assert first.proc is not None and first.proc.returncode == EXIT_OK, first.output()
    # the next worker cannot bind there: the socket's path is a directory now
    sock.unlink()
    sock.mkdir()
    (sock / "keep").write_text("")
    try:
        second = workers(d, tok, args=("--dir", str(workdir))).start()
        wait_for(
            lambda: "event=relay.unavailable" in second.output(), 30, interval=0.1, what="the relay's failure logged"
        )
        assert f"job={job}" in second.output() and "event=job.reattached" in second.output(), second.output()
        go.touch()
        v = state(d, job, "succeeded", "failed", "worker_lost", "lost")
        assert v["state"] == "succeeded", (v, second.output())
        said = out.read_text()
        assert "rc=1" in said and "the worker's relay at" in said, said  # the job's own `piloop` call failed
        assert not v.get("progress"), v
        log = d.cli("attach", job, timeout=30).stdout
        assert f"piloop: this job's relay is not available: {sock}: " in log, log
        assert "piloop commands will fail" in log, log
    finally:
        shutil.rmtree(sock, ignore_errors=True)
