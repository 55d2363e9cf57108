"""Session services for every test: a real redis-server, and a namespace per test."""

from __future__ import annotations

import uuid

import pytest

from tests.helpers.redis import RedisProcess


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
