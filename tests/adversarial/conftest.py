"""The adversarial modules' shared set-up: a real `piloop serve` over TCP on the session Redis, in a namespace of its
own, for a module's tests to attack (their config parts and key snapshots: tests/helpers/adversary.py)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
import redis

from piloop_server.state.keys import Keys
from tests.helpers.serve import Daemon
from tests.helpers.workers import kill_tree_of, tcp_server


@dataclass
class Served:
    d: Daemon  # `.url` its address
    r: redis.Redis
    ns: str
    k: Keys


@pytest.fixture(scope="module")
def tcp_daemon(redis_server) -> Iterator[Callable[..., Served]]:
    """`tcp_daemon(config, env=None)`: `piloop serve --listen 127.0.0.1:<port>` with `config` (no pool added), and a
    client of its Redis; each stopped, its processes killed and its client closed when the module ends (after the
    module's own fixtures have let go of it)."""
    made: list[Served] = []

    def start(config: str, env: dict[str, str] | None = None) -> Served:
        ns = "t" + uuid.uuid4().hex[:10]
        d = tcp_server(redis_server.url, ns, extra="", config=config, env=env)
        s = Served(d, redis.Redis.from_url(redis_server.url), ns, Keys(ns))
        made.append(s)
        return s

    yield start
    for s in made:
        s.d.cleanup()
        kill_tree_of(str(s.d.home))
        s.r.close()
