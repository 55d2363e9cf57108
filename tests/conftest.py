"""Session services for every test: a real redis-server, and a namespace per test."""

from __future__ import annotations

import os
import uuid

import pytest

from tests.helpers.redis import RedisProcess
from tests.helpers.slowdown import factor


def pytest_configure(config):
    try:
        factor()
    except ValueError as e:
        raise pytest.UsageError(str(e)) from None


def pytest_collection_modifyitems(config, items):
    """pytest-timeout's limit for each test (`--timeout`, else pyproject's `timeout`, or the test's own mark)
    stretched by PILOOP_TEST_SLOWDOWN, as the tests' own deadlines are (`tests.helpers.slowdown`)."""
    f = factor()
    if f == 1:
        return
    given = config.getoption("timeout", None)
    default = float(given if given is not None else config.getini("timeout") or 0)
    for item in items:
        mark = item.get_closest_marker("timeout")
        base = float(mark.args[0] if mark.args else mark.kwargs.get("timeout", 0)) if mark else default
        if base > 0:
            rest = {k: v for k, v in mark.kwargs.items() if k != "timeout"} if mark else {}
            item.add_marker(pytest.mark.timeout(base * f, **rest), append=False)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    rp = RedisProcess(tmp_path_factory.mktemp("redis")).start()
    yield rp
    rp.stop()


@pytest.fixture
def redis_client(redis_server):
    import redis

    c = redis.Redis.from_url(redis_server.url)
    yield c
    c.close()


@pytest.fixture
def namespace() -> str:
    """Each test its own key namespace, instead of flushing a shared Redis."""
    return "t" + uuid.uuid4().hex[:10]


@pytest.fixture
def daemon(redis_server, namespace):
    """A real `piloop serve` on a short temp home, on the session Redis under its own namespace."""
    from tests.helpers.serve import Daemon, short_home

    d = Daemon(short_home(), redis_url=redis_server.url, namespace=namespace)
    d.start()
    yield d
    d.cleanup()


@pytest.fixture
def server(redis_server, namespace):
    """`piloop serve --listen 127.0.0.1:<port>` with a `gpu` pool for remote workers; `.url` is its address."""
    from tests.helpers.workers import kill_tree_of, tcp_server

    d = tcp_server(redis_server.url, namespace)
    yield d
    d.cleanup()
    kill_tree_of(str(d.home))


@pytest.fixture
def workers():
    """Make `piloop worker` processes (tests.helpers.workers.RemoteWorker); all are cleaned up after the test."""
    from tests.helpers.workers import RemoteWorker

    made = []

    def make(*a, **kw):
        w = RemoteWorker(*a, **kw)
        made.append(w)
        return w

    yield make
    for w in made:
        w.cleanup()


@pytest.fixture
def job_cgroups():
    """A `Cgroups` of its own (a base named for this test process, so parallel tests never share one), or a skip
    where no memory cgroup is writable; every group left under it, and the base, removed after the test."""
    from piloop_worker.cgroups import Cgroups, JobCgroup

    c = Cgroups(f"piloop-test-{os.getpid()}")
    if c.base is None:
        pytest.skip(f"no writable memory cgroup here ({c.reason})")
    yield c
    for p in c.base.iterdir():
        if p.is_dir():
            JobCgroup(p, c.version).kill_all()
            p.rmdir()
    c.base.rmdir()
