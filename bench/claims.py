"""Claims and heartbeats per second: the Lua scripts alone, and through the HTTP API, beside rq.

All on one redis-server started here. Usage: python bench/claims.py [--jobs N] [--workers N]
Prints a table; rates are the median of the runs, ratios are against rq's enqueue+dequeue of the
same number of jobs on the same Redis.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis  # noqa: E402

from piloop_common.client import ApiClient  # noqa: E402
from piloop_server.state.generation import GenerationRecord, ensure_generation  # noqa: E402
from piloop_server.state.keys import Keys  # noqa: E402
from piloop_server.state.leases import Lease, Leases, Timings  # noqa: E402
from piloop_server.tokens import TokenStore  # noqa: E402
from tests.helpers.redis import RedisProcess, free_port  # noqa: E402
from tests.helpers.serve import Daemon, short_home  # noqa: E402
from tests.helpers.simworker import SimWorker, sample  # noqa: E402

TIMINGS = Timings(grace_ms=60_000, toleration_ms=600_000)


def fresh(r: redis.Redis, tmp: Path) -> Leases:
    keys = Keys("b" + uuid.uuid4().hex[:8])
    ensure_generation(r, keys, GenerationRecord(tmp / f"{keys.namespace}.json"), 0)
    return Leases(r, keys, TIMINGS)


def fill(lz: Leases, n: int, pool: str = "bench") -> None:
    for i in range(n):
        lz.enqueue(f"j{i}", "evaluation", pool, {"argv": ["true"]}, by="human:bench")


def lua_claims(r: redis.Redis, tmp: Path, n: int) -> float:
    lz = fresh(r, tmp)
    lz.register("w", "bench", "", "cas", {}, protocol=1, by="worker:w")
    fill(lz, n)
    t = time.perf_counter()
    got = 0
    while got < n:
        got += len(lz.claim("w", "bench", "evaluation", slots=n, image="", most=1).leases)
    return n / (time.perf_counter() - t)


def lua_heartbeats(r: redis.Redis, tmp: Path, workers: int, rounds: int) -> float:
    lz = fresh(r, tmp)
    names = [f"w{i}" for i in range(workers)]
    fill(lz, workers)
    held = {}
    for w in names:
        lz.register(w, "bench", "", "cas", {}, protocol=1, by=f"worker:{w}")
        held[w] = lz.claim(w, "bench", "evaluation", slots=1, image="").leases
    t = time.perf_counter()
    for _ in range(rounds):
        for w in names:
            lz.heartbeat(w, {"load1": 0.1}, held[w])
    return workers * rounds / (time.perf_counter() - t)


def rq_rate(r: redis.Redis, n: int) -> float:
    from rq import Queue

    from bench.noop import noop

    q = Queue("b" + uuid.uuid4().hex[:8], connection=r)
    t = time.perf_counter()
    for _ in range(n):
        q.enqueue(noop)
    for _ in range(n):
        Queue.dequeue_any([q], None, connection=r)
    return n / (time.perf_counter() - t)


def http_rates(rp: RedisProcess, n: int, workers: int) -> tuple[float, float]:
    ns = "h" + uuid.uuid4().hex[:8]
    config = """
[plugins.executor]
renew_seconds = 10
grace_seconds = 60
toleration_seconds = 600
[plugins.executor.pools.serve]
agents = 0
evaluations = 0
[plugins.executor.pools.bench]
agents = 0
evaluations = 100000
max_load = 100000
"""
    d = Daemon(short_home("bench"), config=config, redis_url=rp.url, namespace=ns)
    port = free_port()
    d.start(listen=f"127.0.0.1:{port}")
    try:
        r = redis.Redis.from_url(rp.url)
        keys = Keys(ns)
        tokens = TokenStore(r, keys)
        with d.api() as api:
            cas_id = api.call("GET", "/v1/status")["cas"]["id"]
        lz = Leases(r, keys, TIMINGS)
        fill(lz, n)
        w = SimWorker(ApiClient(url=f"http://127.0.0.1:{port}", token=tokens.create("claimer", by="human:bench")),
                      "bench", cas_id)
        w.register()
        t = time.perf_counter()
        got = 0
        while got < n:
            got += len(w.claim(evaluation=1)["leases"])
        claims = n / (time.perf_counter() - t)
        sims = []
        for i in range(workers):
            s = SimWorker(ApiClient(url=f"http://127.0.0.1:{port}", token=tokens.create(f"w{i}", by="human:bench")),
                          "bench", cas_id)
            s.sample = sample()
            s.register()
            sims.append(s)
        t = time.perf_counter()
        with ThreadPoolExecutor(8) as ex:
            list(ex.map(lambda s: s.heartbeat(), sims))
        beats = workers / (time.perf_counter() - t)
        return claims, beats
    finally:
        d.cleanup()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=3000)
    ap.add_argument("--workers", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rp = RedisProcess(Path(tmp) / "redis").start()
        try:
            r = redis.Redis(port=rp.port)
            rows = {"piloop claim (Lua script)": [], "piloop heartbeat, 1,000 workers (Lua script)": [],
                    "rq enqueue+dequeue": [], "piloop claim (HTTP API)": [],
                    "piloop heartbeat, 1,000 workers (HTTP API, 8 threads)": []}
            for _ in range(a.runs):
                rows["piloop claim (Lua script)"].append(lua_claims(r, Path(tmp), a.jobs))
                rows["piloop heartbeat, 1,000 workers (Lua script)"].append(lua_heartbeats(r, Path(tmp), a.workers, 2))
                rows["rq enqueue+dequeue"].append(rq_rate(r, a.jobs))
            claims, beats = http_rates(rp, a.jobs, a.workers)
            rows["piloop claim (HTTP API)"].append(claims)
            rows["piloop heartbeat, 1,000 workers (HTTP API, 8 threads)"].append(beats)
        finally:
            rp.stop()
    rq = statistics.median(rows["rq enqueue+dequeue"])
    width = max(len(k) for k in rows)
    print(f"{'what'.ljust(width)}  {'per second':>10}  {'× rq':>6}")
    for k, v in rows.items():
        m = statistics.median(v)
        print(f"{k.ljust(width)}  {m:10.0f}  {m / rq:6.2f}")
    print(f"({a.jobs} jobs, {a.workers} workers, median of {a.runs} runs for the Lua and rq rows; one machine, one Redis)")


if __name__ == "__main__":
    main()
