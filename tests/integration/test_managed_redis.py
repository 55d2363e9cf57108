"""A Redis as a managed service gives it: TLS with its own CA, an ACL user whose password is in a file, and CONFIG
renamed away. `piloop serve` connects, says what it could not check, and runs a job; a wrong password is refused
without being named. And serve's background (rq) workers over Sentinel."""

from __future__ import annotations

import shutil
import uuid

import pytest

from piloop_common.config.load import load_settings
from piloop_server import tasks
from piloop_server.state.connection import open_client
from piloop_server.state.taskqueue import rq_connection
from tests.helpers.certs import make_pki
from tests.helpers.redis import RedisProcess, free_port, wait_for
from tests.helpers.sentinel import SentinelSet
from tests.helpers.serve import FAST_EXECUTOR, Daemon, piloop, short_home
from tests.helpers.workers import state, submit
from tests.integration.test_background import MOD, REPO, _events, _submitter

REDIS7 = shutil.which("redis-server", path="/usr/bin")
PASSWORD = "s3cret-Pa55word-xyz"

needs_redis7 = pytest.mark.skipif(REDIS7 is None, reason="Debian's redis-server 7 (with TLS) is not installed")


@pytest.fixture
def managed(tmp_path):
    pki = make_pki(tmp_path / "pki")
    acl = tmp_path / "users.acl"
    acl.write_text(f"user default off\nuser piloop on >{PASSWORD} ~* &* +@all\n")
    tls = free_port()
    rp = RedisProcess(
        tmp_path / "redis",
        binary=REDIS7,
        extra=(
            "--tls-port",
            str(tls),
            "--tls-cert-file",
            str(pki.cert),
            "--tls-key-file",
            str(pki.key),
            "--tls-ca-cert-file",
            str(pki.ca),
            "--tls-auth-clients",
            "no",
            "--aclfile",
            str(acl),
            "--rename-command",
            "CONFIG",
            "",
        ),
    ).start()
    yield rp, tls, pki
    rp.stop(kill=True)


def _config(tls: int, ca: str, password_file: str) -> str:
    return FAST_EXECUTOR + (
        f'\n[plugins.state]\nurl = "rediss://piloop@127.0.0.1:{tls}/0"\n'
        f'password_file = "{password_file}"\nca_file = "{ca}"\n'
    )


@needs_redis7
def test_tls_an_acl_user_a_password_file_and_no_config_serve_runs_a_job_and_says_what_it_did_not_check(
    managed, tmp_path, namespace
):
    _, tls, pki = managed
    pw = tmp_path / "redis.password"
    pw.write_text(PASSWORD + "\n")
    pw.chmod(0o600)
    d = Daemon(short_home(), config=_config(tls, str(pki.ca), str(pw)), namespace=namespace)
    d.start()
    try:
        log = d.daemon_log()
        assert "event=redis.unchecked CONFIG is refused" in log and "read from INFO memory" in log, log[-2000:]
        assert PASSWORD not in log
        status = d.cli("status", check=True).stdout
        assert "not checked: CONFIG is refused" in status, status
        job = submit(d, "sh", "-c", "echo managed", pool="serve")
        assert state(d, job, timeout=60)["state"] == "succeeded"
        # rq's client is the same Redis, the same way: TLS, the user and the file's password
        rq = rq_connection(load_settings(d.home, env={"PILOOP_NAMESPACE": namespace}), d.home)
        assert rq.ping()
        assert rq.acl_whoami() in (b"piloop", "piloop")
    finally:
        d.cleanup()


@needs_redis7
def test_a_wrong_password_is_refused_and_no_message_names_it(managed, tmp_path, namespace):
    _, tls, pki = managed
    wrong = "not-the-Pa55word-abc"
    pw = tmp_path / "wrong.password"
    pw.write_text(wrong + "\n")
    home = short_home()
    (home / "config.toml").write_text(_config(tls, str(pki.ca), str(pw)))
    out = piloop(home, "serve", env={"PILOOP_NAMESPACE": namespace}, timeout=60)
    assert out.returncode != 0
    text = out.stdout + out.stderr + "".join(p.read_text() for p in (home / "logs").glob("*.log"))
    assert "refused the credentials" in text, text[-2000:]
    assert wrong not in text and PASSWORD not in text
    assert "Traceback" not in out.stderr
    # a password in the URL is not named either
    (home / "config.toml").write_text(
        FAST_EXECUTOR + f'\n[plugins.state]\nurl = "rediss://piloop:{wrong}@127.0.0.1:{tls}/0"\nca_file = "{pki.ca}"\n'
    )
    out = piloop(home, "serve", env={"PILOOP_NAMESPACE": namespace}, timeout=60)
    assert out.returncode != 0 and wrong not in out.stdout + out.stderr, out.stderr
    shutil.rmtree(home, ignore_errors=True)


def test_with_config_renamed_away_a_redis_that_may_evict_is_still_refused_from_info(tmp_path, namespace):
    rp = RedisProcess(
        tmp_path / "r", extra=("--maxmemory-policy", "allkeys-lru", "--rename-command", "CONFIG", "")
    ).start()
    try:
        d = Daemon(short_home(), redis_url=rp.url, namespace=namespace)
        with pytest.raises(AssertionError) as e:
            d.start(timeout=20)
        assert "maxmemory-policy is allkeys-lru" in str(e.value)
        d.cleanup()
    finally:
        rp.stop()


def test_serves_background_workers_run_a_task_over_sentinel(tmp_path, namespace):
    """rq's client is built like the server's: over Sentinel, serve's background worker runs a submitted task."""
    ss = SentinelSet(tmp_path / "redis").start()
    d = Daemon(short_home(), redis_url=ss.url, namespace=namespace, env={"PYTHONPATH": REPO, tasks.RETRY_ENV: "1,1"})
    d.start()
    try:
        client = open_client(load_settings(d.home, env={"PILOOP_NAMESPACE": namespace}), d.home)
        name = uuid.uuid4().hex[:8]
        assert tasks.submit(_submitter(client, namespace), f"{MOD}:mark", name, key=name)
        wait_for(lambda: _events(d, "test.done", name), 30, interval=0.1, what="the task to run over Sentinel")
    finally:
        d.cleanup()
        ss.stop()


def test_sentinels_that_require_a_password_are_asked_with_sentinel_password_file(tmp_path, namespace):
    """Sentinels with `requirepass`: without `sentinel_password_file` serve refuses in one line naming the key (never
    the password), with it serve runs a job, and with a wrong one it refuses saying so."""
    secret = "Sentinel-Pa55-qrs"
    ss = SentinelSet(tmp_path / "redis", password=secret).start()
    pw = tmp_path / "sentinel.password"
    pw.write_text(secret + "\n")
    try:
        bare = Daemon(short_home(), config=FAST_EXECUTOR, redis_url=ss.url, namespace=namespace)
        with pytest.raises(AssertionError) as e:
            bare.start(timeout=30)
        said = str(e.value)
        assert "refused no password: set [plugins.state] sentinel_password_file" in said, said
        assert "Traceback" not in said
        bare.cleanup()

        keyed = f'{FAST_EXECUTOR}\n[plugins.state]\nurl = "{ss.url}"\nsentinel_password_file = "{pw}"\n'
        d = Daemon(short_home(), config=keyed, namespace=namespace)
        d.start()
        try:
            job = submit(d, "sh", "-c", "echo over sentinel", pool="serve")
            assert state(d, job, timeout=60)["state"] == "succeeded"
            assert secret not in d.daemon_log()
        finally:
            d.cleanup()

        wrong = tmp_path / "wrong.password"
        wrong.write_text("not-it\n")
        bad = f'{FAST_EXECUTOR}\n[plugins.state]\nurl = "{ss.url}"\nsentinel_password_file = "{wrong}"\n'
        d = Daemon(short_home(), config=bad, namespace=namespace)
        with pytest.raises(AssertionError) as e:
            d.start(timeout=30)
        assert "refused a wrong password" in str(e.value) and "not-it" not in str(e.value), str(e.value)
        d.cleanup()
    finally:
        ss.stop()


@needs_redis7
def test_sentinel_over_tls_runs_jobs_before_and_after_a_failover(tmp_path, namespace):
    """`rediss+sentinel://` with `ca_file`: every link TLS (the client's to the Sentinels and the master, the
    replica's, the Sentinels' own); a job runs, the primary is SIGKILLed, the replica is promoted over TLS, and the
    next job runs on it."""
    pki = make_pki(tmp_path / "pki")
    ss = SentinelSet(tmp_path / "redis", pki=pki, binary=REDIS7).start()
    config = f'{FAST_EXECUTOR}\n[plugins.state]\nurl = "{ss.url}"\nca_file = "{pki.ca}"\n'
    d = Daemon(short_home(), config=config, namespace=namespace)
    try:
        d.start()
        job = submit(d, "sh", "-c", "echo before", pool="serve")
        assert state(d, job, timeout=60)["state"] == "succeeded"
        assert ss.master_port() == ss.tls_ports[0]  # the Sentinels name the primary's TLS port
        ss.primary.stop(kill=True)
        wait_for(lambda: ss.master_port() == ss.tls_ports[1], 30, interval=0.2, what="the replica promoted over TLS")
        job = submit(d, "sh", "-c", "echo after", pool="serve")
        assert state(d, job, timeout=90)["state"] == "succeeded"
    finally:
        d.cleanup()
        ss.stop()
