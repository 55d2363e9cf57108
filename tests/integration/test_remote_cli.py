"""Every command remote: a real `piloop serve` on TLS, and the CLI run from a second PILOOP_HOME (another user's
view: no socket, no config) with PILOOP_SERVER, PILOOP_TOKEN and PILOOP_CA, with a token of each role, a worker's,
a revoked one and an expired one."""

from __future__ import annotations

import json
import os
import ssl
import sys
import time

import httpx
import pytest

from piloop_common.errors import Forbidden
from piloop_common.tasks import Client
from piloop_worker.main import EXIT_REFUSED
from tests.helpers.certs import make_pki
from tests.helpers.redis import free_port, wait_for
from tests.helpers.serve import FAST_EXECUTOR, Daemon, piloop, short_home
from tests.helpers.slowdown import scaled

TICKER = "import time\nfor i in range(6):\n    print('remote line', i, flush=True)\n    time.sleep(0.2)\n"
WORKER_ONLY = "workers can only register, heartbeat, claim, report, release and log"


@pytest.fixture(scope="module")
def tls(redis_server):
    home = short_home()
    pki = make_pki(home / "pki")
    net = f'\n[plugins.network]\ntls = {{ cert = "{pki.cert}", key = "{pki.key}" }}\n'
    d = Daemon(home, config=FAST_EXECUTOR + net, redis_url=redis_server.url, namespace="t" + os.urandom(5).hex())
    port = free_port()
    d.start(listen=f"127.0.0.1:{port}")
    d.url, d.pki = f"https://127.0.0.1:{port}", pki
    d.tokens = {
        r: d.cli("token", "create", f"u-{r}", "--role", r, "--expires", "1d", check=True).stdout.strip()
        for r in ("viewer", "operator", "admin")
    }
    d.worker_token = d.cli("token", "create", "u-worker", check=True).stdout.strip()
    d.elsewhere = short_home("u")  # another user's home: no socket, no config.toml
    yield d
    d.cleanup()


def remote(d: Daemon, token: str, *args: str, timeout: float = 60, input: str | None = None, **env: str):
    """The CLI from the other home, as that user: only the server's URL, a token and the CA."""
    base = {"PILOOP_SERVER": d.url, "PILOOP_TOKEN": token, "PILOOP_CA": str(d.pki.ca), "SSL_CERT_FILE": ""}
    return piloop(d.elsewhere, *args, env={**base, **env}, timeout=timeout, input=input)


def _refused(out, says: str) -> None:
    assert out.returncode == 1, (out.returncode, out.stdout, out.stderr)
    assert says in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and out.stderr.count("\n") == 1, out.stderr


def test_an_operator_submits_lists_waits_attaches_and_cancels_from_another_home(tls):
    d, op = tls, tls.tokens["operator"]
    assert not (d.elsewhere / "piloop.sock").exists()
    job = remote(d, op, "job", "submit", "--", sys.executable, "-c", TICKER)
    assert job.returncode == 0, job.stderr
    jid = job.stdout.strip()
    listed = remote(d, op, "job", "list", "--json")
    assert listed.returncode == 0 and jid in {j["id"] for j in json.loads(listed.stdout)}
    waited = remote(d, op, "job", "wait", jid, "--timeout", "60s")
    assert waited.returncode == 0 and f"{jid}  succeeded" in waited.stdout, waited.stderr
    attached = remote(d, op, "attach", jid)
    assert attached.returncode == 0, attached.stderr
    assert attached.stdout.splitlines() == [f"remote line {i}" for i in range(6)]
    with d.api() as api:
        assert api.call("GET", f"/v1/jobs/{jid}")["state"] == "succeeded"
    assert "job.queued" in (ev := remote(d, op, "events", "--last", "200")).stdout, ev.stderr
    assert "token:u-operator" in ev.stdout  # the submit is signed with the token's name

    data = d.elsewhere / "data.txt"  # a file only the other home has: it travels through the server's CAS
    data.write_text("forty-two from afar\n")
    fed = remote(d, op, "job", "submit", "--input", str(data), "--", "sh", "-c", "cat ../inputs/data.txt")
    assert fed.returncode == 0, fed.stderr
    fed_out = remote(d, op, "attach", fed.stdout.strip())
    assert fed_out.returncode == 0 and fed_out.stdout == "forty-two from afar\n", (fed_out.stdout, fed_out.stderr)

    long = remote(d, op, "job", "submit", "--", "sleep", "60").stdout.strip()
    assert long, "no job id"
    wait_for(lambda: remote(d, op, "job", "show", long, "--json").stdout.count('"running"'), 30, what="running")
    cancelled = remote(d, op, "job", "cancel", long)
    assert cancelled.returncode == 0 and cancelled.stdout.startswith(f"{long}: "), cancelled.stderr
    end = remote(d, op, "job", "wait", long, "--timeout", "30s")
    assert end.returncode == 1 and f"{long}  cancelled" in end.stdout, (end.stdout, end.stderr)


def test_flags_do_what_the_variables_do_and_errors_keep_the_local_wording(tls, tmp_path):
    d = tls
    token_file = tmp_path / "token"
    token_file.write_text(d.tokens["viewer"] + "\n")
    flags = ("--server", d.url, "--token-file", str(token_file), "--ca", str(d.pki.ca))
    got = piloop(d.elsewhere, *flags, "status", "--json", env={"SSL_CERT_FILE": ""})
    assert got.returncode == 0 and '"daemon"' in got.stdout, got.stderr
    local = d.cli("job", "show", "nosuchjob")
    far = piloop(d.elsewhere, *flags, "job", "show", "nosuchjob", env={"SSL_CERT_FILE": ""})
    assert local.returncode == far.returncode == 1
    assert far.stderr == local.stderr and "404" not in far.stderr, (local.stderr, far.stderr)
    untrusted = remote(d, d.tokens["viewer"], "job", "list", PILOOP_CA="")
    assert untrusted.returncode == 1 and "certificate is not trusted" in untrusted.stderr
    assert "--ca" in untrusted.stderr and "Traceback" not in untrusted.stderr, untrusted.stderr
    alone = piloop(d.elsewhere, "--token-file", str(token_file), "job", "list")  # no server: not the local socket
    assert alone.returncode == 2 and "give --server URL (or PILOOP_SERVER) too" in alone.stderr, alone.stderr
    missing = remote(d, d.tokens["viewer"], "job", "list", PILOOP_CA=str(tmp_path / "nope.pem"))
    assert missing.returncode == 2 and "no such file" in missing.stderr, missing.stderr


def test_a_viewer_reads_and_is_refused_every_write(tls):
    d, viewer = tls, tls.tokens["viewer"]
    jid = d.cli("job", "submit", "--", "true", check=True).stdout.strip()
    for args in (
        ("status",),
        ("job", "list"),
        ("job", "show", jid),
        ("worker", "list"),
        ("inbox",),
        ("limits", "list"),
    ):
        out = remote(d, viewer, *args)
        assert out.returncode == 0, (args, out.stderr)
    wait_for(lambda: remote(d, viewer, "job", "wait", jid).returncode == 0, 30, what=f"{jid} to succeed")
    assert remote(d, viewer, "attach", jid).returncode == 0

    _refused(
        remote(d, viewer, "job", "submit", "--", "true"),
        "piloop: POST /v1/jobs needs the operator role; token u-viewer has the viewer role",
    )
    _refused(remote(d, viewer, "job", "cancel", jid), "needs the operator role; token u-viewer has the viewer role")
    _refused(remote(d, viewer, "token", "list"), "GET /v1/tokens needs the admin role; token u-viewer has the viewer")
    op = d.tokens["operator"]
    _refused(remote(d, op, "secret", "list"), "GET /v1/secrets needs the admin role; token u-operator has the operator")
    _refused(
        remote(d, op, "limits", "set", "executor.pools.serve.evaluations=1", "--reason", "x"),
        "needs the admin role; token u-operator",
    )
    admin = remote(d, d.tokens["admin"], "token", "list")
    assert admin.returncode == 0 and "u-viewer" in admin.stdout, admin.stderr
    # what only an admin may, it may from afar: a secret (its value on stdin), a limit, a token
    adm = d.tokens["admin"]
    assert remote(d, adm, "secret", "set", "REMOTE_SECRET", input="far-value").returncode == 0
    assert "REMOTE_SECRET" in d.cli("secret", "list", check=True).stdout
    limit = remote(d, adm, "limits", "set", "executor.pools.serve.evaluations=2", "--reason", "remote")
    assert limit.returncode == 0, limit.stderr
    assert remote(d, adm, "limits", "unset", "executor.pools.serve.evaluations").returncode == 0
    made = remote(d, adm, "token", "create", "u-made", "--role", "viewer")
    assert made.returncode == 0 and made.stdout.startswith("plt_"), made.stderr
    assert remote(d, made.stdout.strip(), "job", "list").returncode == 0
    signed = [e for e in d.cli("events", "--last", "500", "--json", check=True).stdout.splitlines() if "u-made" in e]
    assert any('"by": "token:u-admin"' in e for e in signed), signed


def test_a_worker_token_is_refused_all_but_the_worker_routes_and_a_role_token_those(tls):
    d, tok = tls, tls.worker_token
    for args in (("job", "list"), ("status",), ("job", "submit", "--", "true")):
        _refused(remote(d, tok, *args), f"token u-worker is a worker's, and {WORKER_ONLY}")
    verify = ssl.create_default_context(cafile=d.pki.ca)
    hello = {"protocol": 1, "pool": "serve"}
    r = httpx.post(
        d.url + "/v1/worker/heartbeat", json=hello, headers={"authorization": f"Bearer {tok}"}, verify=verify
    )
    assert r.status_code not in (401, 403), r.text  # its own routes take it (a bad body, or not registered)
    for role, token in d.tokens.items():
        for route in ("register", "heartbeat", "claim", "report"):
            r = httpx.post(
                d.url + f"/v1/worker/{route}", json=hello, headers={"authorization": f"Bearer {token}"}, verify=verify
            )
            assert r.status_code == 403 and f"token u-{role} ({role} role) is not a worker's" in r.text, r.text
    home = short_home("w")  # a real worker started with a role token: refused, it exits saying why
    (home / "config.toml").write_text(f'[plugins.cas]\nprovider = "local"\npath = "{home}/cas"\n')
    env = {"PILOOP_HTTPS_TOKEN": d.tokens["operator"], "SSL_CERT_FILE": str(d.pki.ca)}
    out = piloop(home, "worker", "--server", d.url, "--pool", "serve", env=env, timeout=60)
    assert out.returncode == EXIT_REFUSED, (out.returncode, out.stdout, out.stderr)
    said = out.stdout + out.stderr
    assert "token u-operator (operator role) is not a worker's" in said and "Traceback" not in said, said
    assert d.tokens["operator"] not in said


def test_a_revoked_and_an_expired_token_are_refused(tls):
    d = tls
    gone = d.cli("token", "create", "u-gone", "--role", "operator", check=True).stdout.strip()
    assert remote(d, gone, "job", "list").returncode == 0
    d.cli("token", "revoke", "u-gone", check=True)
    _refused(remote(d, gone, "job", "list"), "piloop: token u-gone was revoked")
    created = time.time()  # before the create: its expiry is 2 s after the server made it, so after this
    brief = d.cli("token", "create", "u-brief", "--role", "admin", "--expires", "2s", check=True).stdout.strip()
    listed = d.cli("token", "list", "--json", check=True).stdout
    assert '"u-brief"' in listed and '"role": "admin"' in listed
    wait_for(lambda: remote(d, brief, "job", "list").returncode != 0, 20, interval=0.5, what="u-brief to expire")
    assert time.time() - created >= 1.5  # refused for its age, not for being a bad token
    _refused(remote(d, brief, "job", "list"), "piloop: token u-brief expired")
    table = d.cli("token", "list", check=True).stdout.splitlines()
    head = table[0].split()
    assert head[:4] == ["name", "kind", "pool", "state"], table
    rows = {line.split()[0]: line.split() for line in table[1:]}
    assert rows["u-brief"][1:4] == ["admin", "-", "expired"] and rows["u-gone"][1:4] == ["operator", "-", "revoked"]
    assert rows["u-worker"][1:4] == ["worker", "any", "live"]
    for column in ("kind", "pool", "state", "expires"):  # aligned: each value starts under its header
        at = table[0].index(column)
        assert all(line[at - 1] == " " and line[at] != " " for line in table[1:]), (column, table)


def test_plain_http_off_the_loopback_is_refused_before_any_call(tls):
    d = tls
    for url in ("http://10.255.255.1:8443", "http://piloop.example.com"):
        started = time.monotonic()
        out = remote(d, d.tokens["operator"], "job", "list", PILOOP_SERVER=url, timeout=20)
        assert out.returncode == 2, (url, out.stderr)
        assert "plain http" in out.stderr and "https://" in out.stderr and "SSH tunnel" in out.stderr, out.stderr
        assert d.tokens["operator"] not in out.stderr + out.stdout
        assert time.monotonic() - started < 10  # no connection was tried
    loop = remote(d, d.tokens["operator"], "job", "list", PILOOP_SERVER=d.url.replace("https:", "http:"), timeout=20)
    assert loop.returncode == 1 and "plain http" not in loop.stderr  # loopback http is allowed: this port is TLS


def test_the_python_client_takes_the_same_server_token_and_ca(tls):
    d = tls
    with Client.from_env(server=d.url, token=d.tokens["operator"], ca=d.pki.ca) as c:
        jid = c.submit(["true"])
        assert c.wait(jid, timeout=scaled(60)).state == "succeeded"
    with Client.from_env(server=d.url, token=d.tokens["viewer"], ca=d.pki.ca) as c, pytest.raises(Forbidden) as e:
        c.submit(["true"])
    assert e.value.message == "POST /v1/jobs needs the operator role; token u-viewer has the viewer role"


def test_a_campaign_from_afar_may_not_have_the_server_read_its_own_files(tls, tmp_path):
    d, op = tls, tls.tokens["operator"]
    secret_dir = d.home  # the daemon's home: its secret key, its config; readable by the daemon's user
    cmd = ("--agent-cmd", "true", "--eval-cmd", "echo score=1", "--agents", "0")
    for flags, named in (
        (("--repo", str(secret_dir)), f"--repo {secret_dir}"),
        (("--repo", f"file://{secret_dir}"), f"--repo file://{secret_dir}"),
        (("--repo", "https://example.com/r.git", "--workspace", str(secret_dir)), f"--workspace {secret_dir}"),
    ):
        out = remote(d, op, "campaign", "create", "far", *flags, *cmd)
        _refused(out, f"{named}: a path on the server's host is for the unix socket's user only, and token u-operator")
    with d.api() as api:
        assert api.call("GET", "/v1/campaigns") == []
    listed = remote(d, tls.tokens["viewer"], "campaign", "list", "--json")
    assert listed.returncode == 0 and json.loads(listed.stdout) == [], listed.stderr
