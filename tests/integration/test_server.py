"""The daemon and its CLI against a real `piloop serve`, a real Redis, and protocol-level workers."""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Iterator

import pytest
import redis

from piloop_common.errors import Refused
from piloop_common.protocol.worker import PROTOCOL
from piloop_common.sdk.client import ApiClient
from piloop_server.state.records.lease import fence
from tests.helpers.redis import RedisProcess, free_port, wait_for
from tests.helpers.serve import Daemon, piloop, short_home
from tests.helpers.simworker import SimWorker, sample


def _tcp_daemon(redis_server, namespace, extra: str = "") -> Daemon:
    from tests.helpers.serve import FAST_EXECUTOR

    d = Daemon(short_home(), config=FAST_EXECUTOR + extra, redis_url=redis_server.url, namespace=namespace)
    port = free_port()
    d.start(listen=f"127.0.0.1:{port}")
    d.url = f"http://127.0.0.1:{port}"
    return d


@pytest.fixture
def tcp_daemon(redis_server, namespace):
    d = _tcp_daemon(
        redis_server,
        namespace,
        "\n[plugins.executor.pools.gpu]\nagents = 2\nevaluations = 1\nmax_load = 1.5\nmin_memory_gb = 4\n",
    )
    yield d
    d.cleanup()


def _cas_id(d: Daemon) -> str:
    with d.api() as api:
        return api.call("GET", "/v1/status")["cas"]["id"]


def _token(d: Daemon, name: str, *args: str) -> str:
    out = d.cli("token", "create", name, *args, check=True).stdout.strip()
    assert out.startswith("plt_")
    return out


def test_limits_lines_are_the_spec_lines(daemon):
    r = daemon.cli("limits", "set", "executor.pools.serve.evaluations=1", "--reason", "the GPU trains a model")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "executor.pools.serve.evaluations = 1: the daemon applies it at once\n"
    st = daemon.cli("status").stdout
    assert "executor.pools.serve.evaluations = 1: the GPU trains a model (human:" in st
    r = daemon.cli("limits", "unset", "executor.pools.serve.evaluations")
    assert r.stdout == "executor.pools.serve.evaluations: the limit is gone\n"
    assert "limits" not in daemon.cli("status").stdout.split("\n\n", 2)[-1]


@pytest.mark.parametrize(
    "assignment, says",
    [
        ("executor.pools.nope.agents=1", "executor.pools has no nope (serve)"),
        ("executor.pools.serve.agents=two", "executor.pools.serve.agents = 'two' is refused"),
        ("executor.pools.serve.agent=1", "no such key"),
        ("executor.pools.serve.agents=-1", "greater than or equal to 0"),
        ("plugins.cas.provider=s3", "limits set keys of [plugins.executor]"),
    ],
)
def test_bad_limits_are_refused_with_the_reason_and_change_nothing(daemon, assignment, says):
    r = daemon.cli("limits", "set", assignment, "--reason", "because")
    assert r.returncode == 2  # bad input: a usage error
    assert says in r.stderr and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert daemon.cli("limits", "list").stdout == "no limits\n"


def test_a_limit_changes_claims_from_the_next_pass(tcp_daemon):
    d = tcp_daemon
    w = SimWorker(ApiClient(url=d.url, token=_token(d, "gpu1", "--pool", "gpu")), "gpu", _cas_id(d))
    w.register()
    d.cli("limits", "set", "executor.pools.gpu.evaluations=0", "--reason", "budget", check=True)
    d.cli("job", "submit", "--pool", "gpu", "--", "true", check=True)
    assert w.claim()["reason"] == "slots"
    d.cli("limits", "unset", "executor.pools.gpu.evaluations", check=True)
    w.heartbeat()
    # from the next pass (every 0.2 s here; a busy machine may delay one): the claim that follows it gets the job
    got = wait_for(lambda: (c := w.claim())["leases"] and c, 10, interval=0.1, what="a claim after the next pass")
    assert len(got["leases"]) == 1, got


def test_token_is_printed_once_and_never_listed(daemon):
    token = _token(daemon, "gpu1")
    listing = daemon.cli("token", "list").stdout + daemon.cli("token", "list", "--json").stdout
    assert token not in listing and "gpu1" in listing
    assert token not in daemon.cli("events", "--json").stdout
    r = daemon.cli("token", "create", "gpu1")
    assert r.returncode == 1 and "token gpu1 exists" in r.stderr


def test_non_loopback_listen_without_tls_is_refused(redis_server, namespace):
    home = short_home()
    r = piloop(home, "serve", "--listen", f"0.0.0.0:{free_port()}")
    assert r.returncode == 2
    assert "not a loopback address, and [plugins.network] tls is not set" in r.stderr
    assert not (home / "piloop.sock").exists()


@contextlib.contextmanager
def _beating(*workers: SimWorker, every: float = 0.5) -> Iterator[None]:
    """The workers beat now, and every `every` s on a thread until the block ends."""
    stop = threading.Event()

    def beat() -> None:
        for w in workers:
            w.heartbeat()

    def keep() -> None:
        while not stop.wait(every):
            beat()

    beat()
    thread = threading.Thread(target=keep, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(10)


def test_worker_list_columns_and_reasons(tcp_daemon):
    d = tcp_daemon
    cas = _cas_id(d)
    busy = SimWorker(ApiClient(url=d.url, token=_token(d, "gpu1")), "gpu", cas)
    busy.sample = sample(load1=78.1, cpus=32, mem=60.8, disk=379.3)
    busy.register()
    idle = SimWorker(ApiClient(url=d.url, token=_token(d, "gpu2")), "gpu", cas)
    idle.sample = sample(load1=21.8, cpus=32, mem=103.8, disk=816.4)
    idle.register()
    assert busy.claim()["reason"] == "load"
    assert idle.claim()["reason"] == "nothing"
    low = SimWorker(ApiClient(url=d.url, token=_token(d, "gpu3")), "gpu", cas)
    low.sample = sample(load1=1, cpus=32, mem=2.0, disk=10)
    low.register()
    with _beating(busy, idle, low):  # alive through both CLI calls: grace is 2 s, a CLI's start ~1 s on a busy box
        out = d.cli("worker", "list").stdout.splitlines()
        js = d.cli("worker", "list", "--json").stdout
    header = out[0]
    names = ["worker", "pool", "seen", "load", "memory", "disk", "agents", "evaluations", "no lease"]
    starts = [header.index(n) for n in names]
    assert header.startswith(" worker  ") and header.endswith("evaluations  no lease")
    rows = {line.split()[0]: line for line in out[1:]}
    expect = {
        "gpu1": ["gpu1", "gpu", r"\ds ago", "78.1/32", "60.8 GB", "379.3 GB", "0", "0", "load"],
        "gpu2": ["gpu2", "gpu", r"\ds ago", "21.8/32", "103.8 GB", "816.4 GB", "0", "0", "nothing"],
    }
    for name, cells in expect.items():
        line = rows[name]
        for start, cell, end in zip(starts, cells, [*starts[1:], None], strict=True):
            # every cell starts under its header, two spaces apart, as the spec prints them
            assert re.fullmatch(cell, line[start:end].rstrip()), (name, cell, line)
    assert rows["gpu3"].endswith("memory")
    assert '"no_lease": "load"' in js


@pytest.mark.parametrize("case", ["protocol", "pool", "revoked", "cas", "token_pool"])
def test_workers_are_refused_with_the_reason(tcp_daemon, case):
    d = tcp_daemon
    token = _token(d, "w", *(["--pool", "serve"] if case == "token_pool" else []))
    w = SimWorker(ApiClient(url=d.url, token=token), "gpu", _cas_id(d))
    if case == "protocol":
        w.protocol = 99
    elif case == "pool":
        w.pool = "tpu"
    elif case == "cas":
        w.cas_id = "another"
    elif case == "revoked":
        d.cli("token", "revoke", "w", check=True)
    with pytest.raises(Refused) as e:
        w.register()
    expect = {
        "protocol": f"protocol {PROTOCOL}, this worker 99",
        "pool": "unknown pool tpu",
        "revoked": "token w was revoked",
        "cas": "is not the server's",
        "token_pool": "token w is for pool serve, not gpu",
    }[case]
    assert expect in str(e.value)


def test_worker_routes_need_a_token_and_act_routes_refuse_workers(tcp_daemon):
    d = tcp_daemon
    with ApiClient(url=d.url) as anon:
        with pytest.raises(Exception) as e:
            anon.call("GET", "/v1/workers")
        assert getattr(e.value, "status", None) == 401
    with ApiClient(url=d.url, token=_token(d, "w")) as w:
        with pytest.raises(Exception) as e:
            w.call("POST", "/v1/jobs", {"spec": {"argv": ["true"]}})
        assert getattr(e.value, "status", None) == 403


def test_lease_lifecycle_and_stale_report(tcp_daemon):
    d = tcp_daemon
    w = SimWorker(ApiClient(url=d.url, token=_token(d, "gpu1")), "gpu", _cas_id(d))
    w.register()
    job = d.cli("job", "submit", "--pool", "gpu", "--", "echo", "hi", check=True).stdout.strip()
    w.heartbeat()
    (lease,) = w.claim()["leases"]
    assert lease["spec"]["argv"] == ["echo", "hi"]
    token = lease["token"]
    w.heartbeat()
    assert d.cli("job", "show", job, "--json").stdout.count('"running"') == 1
    first = w.report(job, report_id="r1", token=token)
    again = w.report(job, report_id="r1", token=token)
    assert first == again == {"answer": "accepted", "state": "succeeded"}
    stale = w.report(job, report_id="r2", token=token)
    assert stale == {"answer": "stale", "state": None}
    assert "lease.stale_report" in d.cli("events").stdout
    assert d.cli("job", "wait", job).returncode == 0


def test_silent_worker_leases_expire_and_jobs_requeue_with_a_new_token(tcp_daemon):
    d = tcp_daemon
    cas = _cas_id(d)
    w1 = SimWorker(ApiClient(url=d.url, token=_token(d, "gpu1")), "gpu", cas)
    w2 = SimWorker(ApiClient(url=d.url, token=_token(d, "gpu2")), "gpu", cas)
    w1.register()
    w2.register()
    job = d.cli("job", "submit", "--pool", "gpu", "--", "true", check=True).stdout.strip()
    w1.heartbeat()
    (lease,) = w1.claim()["leases"]

    # w1 goes silent; w2 keeps beating. grace 2 s: w1 unreachable; toleration 6 s: its lease expires
    def unreachable():
        w2.heartbeat()
        return "unreachable" in next(ln for ln in d.cli("worker", "list").stdout.splitlines() if "gpu1" in ln)

    wait_for(unreachable, 10, interval=0.3, what="gpu1 unreachable")

    def requeued():
        w2.heartbeat()
        got = w2.claim()["leases"]
        return got or None

    (again,) = wait_for(requeued, 15, interval=0.3, what="the job to come back")
    assert again["job"] == job and fence(again["token"]) > fence(lease["token"])
    assert w1.report(job, token=lease["token"])["answer"] == "stale"
    assert w2.report(job)["state"] == "succeeded"


def test_daemon_absence_longer_than_grace_expires_nothing(tcp_daemon):
    d = tcp_daemon
    w = SimWorker(ApiClient(url=d.url, token=_token(d, "gpu1")), "gpu", _cas_id(d))
    w.register()
    job = d.cli("job", "submit", "--pool", "gpu", "--", "true", check=True).stdout.strip()
    w.heartbeat()
    (lease,) = w.claim()["leases"]
    w.heartbeat()
    d.pause()  # the machine sleeps: longer than toleration (6 s), so even the lease keys lapse
    r = redis.Redis.from_url(d.env and d.home and _redis_url(d))
    from piloop_server.state.keys import Keys

    k = Keys(d.env["PILOOP_NAMESPACE"])
    wait_for(lambda: not r.exists(k.lease(job)), 15, interval=0.2, what="the lease key to lapse while frozen")
    d.resume()
    wait_for(lambda: r.exists(k.lease(job)), 10, interval=0.1, what="the pass to re-arm the lease")
    assert w.heartbeat() == {job: "ok"}
    assert "daemon.rearmed" in d.cli("events").stdout
    assert "lease.expired" not in d.cli("events").stdout
    assert w.report(job)["state"] == "succeeded"
    del lease


def _redis_url(d: Daemon) -> str:
    text = (d.home / "config.toml").read_text()
    return re.search(r'url = "([^"]+)"', text).group(1)


def test_redis_restarted_empty_changes_generation_and_never_reissues_a_token(tmp_path, namespace):
    rp = RedisProcess(tmp_path / "r", appendonly=False).start()
    d = _tcp_daemon(rp, namespace, "\n[plugins.executor.pools.sim]\nevaluations = 1\nmax_load = 1000\n")
    try:
        w = SimWorker(ApiClient(url=d.url, token=_token(d, "w1")), "sim", _cas_id(d))
        w.register()
        d.cli("job", "submit", "--pool", "sim", "--", "true", check=True)
        w.heartbeat()
        (before,) = w.claim()["leases"]
        gen1 = d.cli("status", "--json").stdout
        rp.stop(kill=True)
        rp.wipe()
        rp.start()  # empty: no AOF, no snapshot
        wait_for(
            lambda: '"redis.lost_data"' in d.cli("inbox", "--json").stdout,
            15,
            interval=0.2,
            what="the daemon to notice the data loss",
        )
        assert gen1 != d.cli("status", "--json").stdout
        token = _token(d, "w2")  # the old token's record is gone with the data
        w = SimWorker(ApiClient(url=d.url, token=token), "sim", _cas_id(d))
        w.held = {before["job"]: before["token"]}
        w.register()
        assert w.heartbeat() == {before["job"]: "lost"}
        d.cli("job", "submit", "--pool", "sim", "--", "true", check=True)

        def claimed():
            w.heartbeat()
            got = w.claim()
            return got["leases"] or (got["reason"] == "recovering" and None)

        (after,) = wait_for(claimed, 10, interval=0.2, what="claims after the hold")
        assert fence(after["token"]) > fence(before["token"])
    finally:
        d.cleanup()
        rp.stop()


def test_a_redis_that_may_evict_is_refused_at_start(tmp_path, namespace):
    rp = RedisProcess(tmp_path / "r").start()
    try:
        redis.Redis(port=rp.port).config_set("maxmemory-policy", "allkeys-lru")
        d = Daemon(short_home(), redis_url=rp.url, namespace=namespace)
        with pytest.raises(AssertionError) as e:
            d.start(timeout=20)
        assert "maxmemory-policy is allkeys-lru" in str(e.value)
        d.cleanup()
    finally:
        rp.stop()


def test_cancel_a_queued_job(daemon):
    job = daemon.cli("limits", "set", "executor.pools.serve.evaluations=0", "--reason", "hold", check=True)
    job = daemon.cli("job", "submit", "--", "sleep", "100", check=True).stdout.strip()
    assert daemon.cli("job", "cancel", job).stdout.strip() == f"{job}: cancelled"
    r = daemon.cli("job", "wait", job)
    assert r.returncode == 1 and "cancelled" in r.stdout
    assert "job.cancelled" in daemon.cli("events").stdout
    time.sleep(0)  # nothing else to wait for: the state is final
