"""What the adversarial tests (tests/adversarial/) share: a daemon's config in parts, the keys a live daemon and its
workers rewrite on their own, and every other key of a namespace read whole, to compare before and after an
attack. Their daemons start through the `tcp_daemon` fixture (tests/adversarial/conftest.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import redis

from piloop_server.state.keys import Keys
from tests.helpers.slowdown import scaled


def executor(grace: float, toleration: float, serve: tuple[int, int] = (0, 0)) -> str:
    """[plugins.executor] with the tests' short renew and pass, the given grace and toleration (toleration >
    grace + 2 × renew 0.5 + request timeout 1 + kill grace 1), and the daemon's own `serve` pool of (agents,
    evaluations): none by default."""
    text = f"""
[plugins.executor]
renew_seconds = 0.5
grace_seconds = {grace:g}
toleration_seconds = {toleration:g}
request_timeout_seconds = 1
kill_grace_seconds = 1
pass_seconds = 0.2
"""
    if serve == (0, 0):
        return text + "\n[plugins.executor.pools.serve]\nagents = 0\nevaluations = 0\n"
    return text + pool("serve", *serve)


def pool(name: str, agents: int, evaluations: int) -> str:
    """A pool for remote workers, any load and memory let in."""
    return (
        f"\n[plugins.executor.pools.{name}]\nagents = {agents}\nevaluations = {evaluations}\n"
        "max_load = 1000\nmin_memory_gb = 0\n"
    )


# long timings: nothing of the daemon's own clock fences a hand worker's lease while a test runs, nor makes the hand
# workers (which beat only when a test says so) unreachable while the module's tests run, however slow the machine
LONG_TIMINGS = executor(scaled(20), scaled(60)) + pool("gpu", 1, 4) + pool("judge", 0, 1)

# the proxy network with a worker rule and an act rule, without a proxy: the tests stamp the claims themselves
PROXY_NETWORK = """
[plugins.network]
provider = "proxy"
claims = { org = "x-org-id", principal = "x-principal" }
name_claims = ["principal"]
rules = [
  { when = { org = "acme", principal = "key-0123" }, access = "worker" },
  { when = { org = "acme" }, access = "act" },
]
"""


def live_beats(k: Keys, workers: Iterable[str]) -> set[str]:
    """What a live daemon and its workers' beats rewrite whatever an attempt does: the events stream (checked on its
    own), the lease deadlines, the daemon's pass, the workers' (and `serve`'s) records and alive keys."""
    beats = {k.events(), k.deadlines(), k.daemon(), k.disruption()}
    for name in (*workers, "serve"):
        beats |= {k.worker(name), k.worker_alive(name)}
    return beats


def snapshot(r: redis.Redis, k: Keys, volatile: Callable[[str], bool]) -> dict[str, object]:
    """Every key of the namespace with its whole value, read by type; those `volatile` names aside."""
    out: dict[str, object] = {}
    for raw in r.scan_iter(match=k.prefix() + "*", count=1000):
        key = raw.decode()
        if volatile(key):
            continue
        t = r.type(raw).decode()
        if t == "string":
            out[key] = r.get(raw)
        elif t == "hash":
            out[key] = r.hgetall(raw)
        elif t == "set":
            out[key] = r.smembers(raw)
        elif t == "zset":
            out[key] = r.zrange(raw, 0, -1, withscores=True)
        elif t == "list":
            out[key] = r.lrange(raw, 0, -1)
        elif t == "stream":
            out[key] = r.xrange(raw)
    return out
