"""Fixtures for the fault tests: a `piloop serve` on TCP with a `gpu` pool, and remote workers that are cleaned up."""

from __future__ import annotations

import pytest

from tests.helpers.workers import RemoteWorker, kill_tree_of, tcp_server


@pytest.fixture
def server(redis_server, namespace):
    d = tcp_server(redis_server.url, namespace)
    yield d
    d.cleanup()
    kill_tree_of(str(d.home))


@pytest.fixture
def workers():
    made: list[RemoteWorker] = []

    def make(*a, **kw) -> RemoteWorker:
        w = RemoteWorker(*a, **kw)
        made.append(w)
        return w

    yield make
    for w in made:
        w.cleanup()
